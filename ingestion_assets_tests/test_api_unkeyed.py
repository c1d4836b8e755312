"""An API record whose primary key or cursor is missing, null or not a single value is parked naming the stream,
the field and the value; the rest of its page loads and the checkpoint moves on the records that loaded. Such a
record failed the whole stream at once ("a record has no value for ['id']"), every run, until the API changed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import dlt
import pytest
import yaml
from dlt.pipeline.exceptions import PipelineStepFailed

from ingestion_assets.catalog import load_catalog
from ingestion_assets.sources.rest import (
    BucketRegistry,
    EndpointSpec,
    NoAuth,
    PaginationSpec,
    RestClient,
    rest_endpoint,
)
from ingestion_assets.state.summary import size_pools
from ingestion_assets_tests.helpers import StreamHarness


class ItemsApi:
    """GET /v1/items on loopback: `records` in list order, `updated_since` (inclusive) and page-number pages."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                since = query.get("updated_since")
                rows = [r for r in api.records if since is None or str(r.get("updated_at") or "") >= since]
                size, page = int(query.get("limit", "2")), int(query.get("page", "1"))
                body = json.dumps({"data": rows[(page - 1) * size : page * size]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[ItemsApi]:
    server = ItemsApi()
    try:
        yield server
    finally:
        server.stop()


def _catalog(harness: StreamHarness, api: ItemsApi, **stream: Any) -> None:
    catalog = {
        "destination": {"type": "duckdb", "path": str(harness.warehouse)},
        "sources": {
            harness.source_name: {
                "type": "rest",
                "base_url": api.url,
                "rate_limit": {"requests_per_second": 100, "burst": 10},
                "streams": {
                    "items": {
                        "path": "/v1/items",
                        "primary_key": "id",
                        "page_size": 2,
                        "pages_per_slice": 1,
                        "pagination": {"style": "page"},
                        "retries": {"max_attempts": 1},
                        **stream,
                    }
                },
            }
        },
    }
    harness.catalog_path = harness.tmp_path / "catalog.yaml"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    size_pools(harness.settings, load_catalog(harness.catalog_path))


def _stamp(second: int) -> str:
    return f"2026-01-09T00:00:{second:02d}Z"


def _items(harness: StreamHarness) -> list[tuple[Any, ...]]:
    rows = harness.query_target(f'SELECT id, name FROM "{harness.source_name}".items ORDER BY id')
    return [(int(r[0]), r[1]) for r in rows]


def _parked(harness: StreamHarness) -> list[tuple[str, str, dict[str, Any]]]:
    rows = harness.query_target(
        f'SELECT record_key, error, raw_record FROM "{harness.source_name}"._ingest_dead_letter ORDER BY error'
    )
    return [(key, error, raw if isinstance(raw, dict) else json.loads(raw)) for key, error, raw in rows]


def test_a_record_without_its_key_or_cursor_is_parked_and_the_rest_loads(harness: StreamHarness, api: ItemsApi) -> None:
    """Pages of two: the unusable records end pages 2 and 3 (and page 4 holds nothing usable), so the position
    must come from the last record that loaded, and a later run reads on from there."""
    api.records = [
        {"id": 1, "updated_at": _stamp(1), "name": "a"},
        {"id": 2, "updated_at": _stamp(2), "name": "b"},
        {"id": 3, "updated_at": _stamp(3), "name": "c"},
        {"updated_at": _stamp(3), "name": "nokey"},
        {"id": 4, "updated_at": _stamp(4), "name": "d"},
        {"id": None, "updated_at": _stamp(5), "name": "nullkey"},
        {"id": {"nested": 6}, "updated_at": _stamp(6), "name": "objectkey"},
        {"id": "", "updated_at": _stamp(6), "name": "emptykey"},
        {"id": 7, "updated_at": _stamp(7), "name": "e"},
        {"id": 8, "name": "nocursor"},
    ]
    _catalog(harness, api)
    result = harness.materialize()
    stream = f"{harness.source_name}.items"
    assert _items(harness) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (7, "e")]
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__items")[0].metadata
    assert metadata["dead letters"].value == 5
    parked = {raw["name"]: (key, error) for key, error, raw in _parked(harness)}
    assert sorted(parked) == ["emptykey", "nocursor", "nokey", "nullkey", "objectkey"]
    assert parked["nokey"][1].startswith(f"stream {stream}: primary key 'id' is missing (the record's fields: ")
    assert parked["nullkey"][1].startswith(f"stream {stream}: primary key 'id' is null;")
    assert "primary key 'id' is an object {\"nested\": 6}, not a string or number" in parked["objectkey"][1]
    assert "primary key 'id' is empty text \"\", not a string or number" in parked["emptykey"][1]
    assert f"stream {stream}: cursor 'updated_at' is missing" in parked["nocursor"][1]
    assert "check the stream's cursor in the catalog" in parked["nocursor"][1]
    assert parked["nocursor"][0] == "8" and parked["nokey"][0].startswith("unkeyed:")
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None and checkpoint.position is not None
    assert (checkpoint.position["updated_at"], checkpoint.position["id"]) == (_stamp(7), "7")

    api.records = [r for r in api.records if r.get("name") != "nocursor"]
    api.records += [{"id": 9, "updated_at": _stamp(9), "name": "f"}]
    harness.materialize()
    assert _items(harness) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (7, "e"), (9, "f")]
    assert len(_parked(harness)) == 5  # nothing released: none of them loaded, none parked twice


@pytest.mark.parametrize(
    ("setting", "wrong"), [("primary_key", "item_id"), ("cursor", "updated")], ids=["primary_key", "cursor"]
)
def test_a_key_or_cursor_no_record_has_fails_the_run_at_once(
    harness: StreamHarness, api: ItemsApi, setting: str, wrong: str
) -> None:
    """Found by a README-only attack: a misspelled `primary_key` (or `cursor`) parked every record, and a run under
    the dead-letter limit's 1,000 rows "succeeded" with nothing loaded. A setting to fix, not bad data: the run
    now fails at once, without retries, naming the stream, the field and a record's fields; nothing is parked."""
    api.records = [{"id": i, "updated_at": _stamp(i), "name": f"n{i}"} for i in range(1, 6)]
    wrong_setting: dict[str, Any] = {"cursor": "updated_at", setting: wrong}
    _catalog(harness, api, **wrong_setting, retries={"max_attempts": 2, "delay_seconds": 0.1})
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.step_failure_data.error)
    label = "primary key" if setting == "primary_key" else "cursor"
    assert f"stream {harness.source_name}.items: none of the 2 records of the run's first page(s) has the {label} " in message
    assert f"field {wrong!r} (a record's fields: ['id', 'name', 'updated_at'])" in message, message
    assert f"set the stream's `{setting}` in the catalog" in message, message
    checkpoint = harness.checkpoint("items")
    assert checkpoint is None or checkpoint.position is None
    _catalog(harness, api, cursor="updated_at")
    harness.materialize()
    assert _items(harness) == [(i, f"n{i}") for i in range(1, 6)]  # and nothing parked: no dead-letter table
    tables = harness.query_target(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{harness.source_name}'")
    assert "_ingest_dead_letter" not in {t[0] for t in tables}


def test_a_full_read_parks_a_record_without_its_key(harness: StreamHarness, api: ItemsApi) -> None:
    api.records = [{"id": 1, "name": "a"}, {"name": "nokey"}, {"id": 2, "name": "b"}]
    _catalog(harness, api, cursor=None)
    harness.materialize()
    assert _items(harness) == [(1, "a"), (2, "b")]
    assert [raw["name"] for _, _, raw in _parked(harness)] == ["nokey"]


def test_standalone_use_stops_on_a_record_without_its_key_naming_it(api: ItemsApi, tmp_path: Path) -> None:
    """`rest_endpoint` (dlt without Dagster) has no dead-letter table: it must not merge a null key, it stops,
    naming the field and the value."""
    api.records = [{"id": 1, "updated_at": _stamp(1)}, {"id": None, "updated_at": _stamp(2)}]
    endpoint = EndpointSpec("/v1/items", page_size=2, pagination=PaginationSpec(style="page"))
    pipeline = dlt.pipeline(
        "unkeyed", destination=dlt.destinations.duckdb(str(tmp_path / "w.duckdb")), pipelines_dir=str(tmp_path / "p")
    )
    with RestClient(api.url, NoAuth(), buckets=BucketRegistry()) as rest, pytest.raises(PipelineStepFailed) as raised:
        pipeline.run(rest_endpoint(rest, endpoint))
    assert "GET /v1/items: primary key 'id' is null; check the EndpointSpec's primary_key" in str(raised.value)
