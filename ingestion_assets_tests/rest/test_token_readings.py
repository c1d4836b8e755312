"""An API written unlike the demo's, on loopback: its token endpoint reads the client from the form body only,
sends `expires_in` as text and `token_type` in its own casing; its listing answers a 429 with Retry-After in
decimal seconds and an empty page that still carries a next cursor. The read must end exact, with no 401."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from ingestion_assets.sources.rest import (
    AuthError,
    BucketRegistry,
    EndpointSpec,
    OAuth2ClientCredentials,
    PaginationSpec,
    RestClient,
    Secret,
    read_pages,
)
from ingestion_assets_tests.rest.helpers import FAST_RETRY

RECORDS = [{"key": f"k{n:03d}", "value": n * 7} for n in range(40)]
PAGE = 4
EMPTY_AFTER = 3  # the page after the 3rd is empty and still has a next cursor


@dataclass
class _Api:
    """The server's truth and what it saw; `token_type` and `lifetime` are what its token endpoint sends."""

    token_type: str = "bearer"
    lifetime: str = "1.0"
    tokens: dict[str, float] = field(default_factory=dict)  # token -> when it expires
    statuses: list[int] = field(default_factory=list)
    limited_once: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        if (form.get("client_id"), form.get("client_secret")) != ("app", "s3cret"):  # client_secret_post only
            return 401, {"error": "invalid_client"}, {}
        with self.lock:
            token = f"t{len(self.tokens)}"
            self.tokens[token] = time.monotonic() + float(self.lifetime)
        return 200, {"access_token": token, "token_type": self.token_type, "expires_in": self.lifetime}, {}

    def items(self, authorization: str, query: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            expires = self.tokens.get(authorization.removeprefix("Bearer "), 0.0)
            if not self.limited_once:
                self.limited_once = True
                return 429, {"error": "slow down"}, {"Retry-After": "0.2"}
        if expires < time.monotonic():
            return 401, {"error": "invalid_token"}, {"WWW-Authenticate": "Bearer"}
        page = int(query.get("cursor", "0"))
        start = max(0, page - 1) * PAGE if page > EMPTY_AFTER else page * PAGE
        rows = [] if page == EMPTY_AFTER else RECORDS[start : start + PAGE]
        more = page == EMPTY_AFTER or start + PAGE < len(RECORDS)
        return 200, {"results": {"rows": rows}, "next": str(page + 1) if more else None}, {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        api: _Api = self.server.api  # type: ignore[attr-defined]
        with api.lock:
            api.statuses.append(status)
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        form = {k: v[-1] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
        self._answer(*self.server.api.token(form))  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self._answer(*self.server.api.items(self.headers.get("Authorization", ""), query))  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(api: _Api) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.api = api  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


ENDPOINT = EndpointSpec(
    "/items",
    primary_key=("key",),
    records_path="results.rows",
    cursor_field=None,
    cursor_param=None,
    pagination=PaginationSpec(token_path="next"),
    page_size=PAGE,
)


def _auth(url: str) -> OAuth2ClientCredentials:
    return OAuth2ClientCredentials(
        f"{url}/token", "app", Secret("s3cret", "the test"), client_auth="client_secret_post"
    )


def _read(url: str, rate: float) -> list[dict[str, Any]]:
    with RestClient(url, _auth(url), rate=rate, burst=1, retry=FAST_RETRY, buckets=BucketRegistry()) as rest:
        return [r for page in read_pages(rest, ENDPOINT) for r in page.records]


def test_text_lifetimes_casings_decimal_retry_after_and_empty_pages(serve: Any) -> None:
    api = _Api(token_type="bearer", lifetime="1.0")
    url = serve(api)
    assert _read(url, rate=8.0) == RECORDS  # ~12 pages over ~1.5 s: the token is renewed before it expires
    assert 401 not in api.statuses and api.statuses.count(429) == 1 and len(api.tokens) >= 2
    upper = _Api(token_type="BEARER", lifetime="3600")
    assert _read(serve(upper), rate=1000.0) == RECORDS and len(upper.tokens) == 1


def test_a_token_that_is_not_bearer_is_refused_naming_its_type(serve: Any) -> None:
    url = serve(_Api(token_type="mac"))
    with pytest.raises(AuthError) as raised:
        _read(url, rate=1000.0)
    assert "'mac'" in str(raised.value) and "Bearer" in str(raised.value)
