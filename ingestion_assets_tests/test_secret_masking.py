"""A secret the product resolved never shows, even when a server echoes it back in its error body."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest
import yaml

from ingestion_assets.cli import main
from ingestion_assets.sources.redact import redact, remember
from ingestion_assets_tests.helpers import StreamHarness

TOKEN = "ExpiredRealTok123"


class _EchoingUnauthorized(BaseHTTPRequestHandler):
    """Answers 401 quoting the Authorization header it received, as many APIs do."""

    def do_GET(self) -> None:
        body = json.dumps({"error": f"invalid token: {self.headers.get('Authorization')}"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def echoing_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingUnauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_token_the_server_echoes_shows_nowhere(
    harness: StreamHarness, echoing_api: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("API_TOKEN", TOKEN)
    harness.catalog_path = harness.tmp_path / "catalog.yaml"
    stream = {"path": "/v1/orders", "primary_key": "id", "retries": {"max_attempts": 1}}
    source = {"type": "rest", "base_url": echoing_api, "auth": {"type": "bearer", "token": {"env": "API_TOKEN"}}}
    catalog = {
        "destination": {"type": "duckdb", "path": str(harness.warehouse)},
        "sources": {harness.source_name: {**source, "streams": {"orders": stream}}},
    }
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)

    assert main(["check"]) == 1
    out = capsys.readouterr()
    assert "401 unauthorized (server says: invalid token: Bearer ***)" in out.out
    assert TOKEN not in out.out + out.err

    result = harness.materialize(raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert failure.step_failure_data.error is not None
    assert "invalid token: Bearer ***" in failure.step_failure_data.error.message
    logs = harness.instance.all_logs(result.run_id)
    assert logs and TOKEN not in str(logs)  # every record, the step failure's error and its causes included


def test_encoded_forms_and_url_passwords_are_masked() -> None:
    remember("p@ss word/42")
    basic = base64.b64encode(b"client-id:p@ss word/42").decode()
    text = f"got p%40ss%20word%2F42, p%40ss+word%2F42 and Authorization: Basic {basic}"
    assert redact(text) == "got ***, *** and Authorization: Basic ***"
