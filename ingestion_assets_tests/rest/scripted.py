"""A scripted API on loopback for tests: a change feed served exactly as a test lays out its pages, a Stripe-style
list (newest first, `starting_after` and `has_more`), and the answers real SaaS servers give besides JSON (an HTML
maintenance page, a redirect)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from ingestion_assets_tests.helpers import StreamHarness


@dataclass
class Answer:
    """One answer served instead of the data (a fault a test injects)."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    lines: list[tuple[str, str]] = field(default_factory=list)  # more header lines (one name several times)


@dataclass
class ScriptedApi:
    """`feed`: the pages of GET /feed (cursor pagination: `next_cursor`, the page's index, in the body).
    `charges`: the records of GET /v1/charges, listed as Stripe does (newest `created` first, `starting_after`,
    `has_more`, `created[gte]`). `answers`: served, in turn, to the next requests instead of their data.
    `redirects`: path -> Location answered with a 301. `routes`: path -> what answers its query (a listing a test
    writes, changing between pages if it likes)."""

    feed: list[list[dict[str, Any]]] = field(default_factory=list)
    charges: list[dict[str, Any]] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    redirects: dict[str, str] = field(default_factory=dict)
    routes: dict[str, Callable[[dict[str, str]], Answer]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # path and query of every request, in order
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, query: dict[str, str], raw_query: str = "") -> Answer:
        with self.lock:
            if self.answers:
                return self.answers.pop(0)
        if path in self.redirects:
            location = self.redirects[path] + (
                ("&" if "?" in self.redirects[path] else "?") + raw_query if raw_query else ""
            )
            return Answer(301, b"<html>Moved</html>", {"Location": location, "Content-Type": "text/html"})
        if path in self.routes:
            return self.routes[path](query)
        if path.endswith("/feed"):
            index = int(query.get("cursor", "0"))
            more = index + 1 < len(self.feed)
            return _json(
                {"data": self.feed[index] if self.feed else [], "next_cursor": str(index + 1) if more else None}
            )
        if path.endswith("/v1/charges"):
            return _json(self._charges(query))
        return _json({"error": "not_found"}, 404)

    def _charges(self, query: dict[str, str]) -> dict[str, Any]:
        listed = sorted(self.charges, key=lambda r: (r["created"], r["id"]), reverse=True)
        if "created[gte]" in query:
            listed = [r for r in listed if r["created"] >= int(query["created[gte]"])]
        if "starting_after" in query:
            ids = [r["id"] for r in listed]
            if query["starting_after"] not in ids:
                return {"error": {"message": f"No such object: {query['starting_after']}"}}
            listed = listed[ids.index(query["starting_after"]) + 1 :]
        limit = int(query.get("limit", "10"))
        return {"object": "list", "url": "/v1/charges", "data": listed[:limit], "has_more": len(listed) > limit}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})


json_answer = _json


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        api: ScriptedApi = self.server.api  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        with api.lock:
            api.requests.append(self.path)
        answer = api.answer(url.path, {k: v[-1] for k, v in parse_qs(url.query).items()}, url.query)
        self.send_response(answer.status)
        for name, value in {**answer.headers, "Content-Length": str(len(answer.body))}.items():
            self.send_header(name, value)
        for name, value in answer.lines:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def start_scripted_api(**fields: Any) -> tuple[ScriptedApi, ThreadingHTTPServer]:
    """Serve a ScriptedApi on a free loopback port in a daemon thread; stop it with the server's shutdown()."""
    api = ScriptedApi(**fields)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.api = api  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    return api, server


def write_scripted_catalog(
    harness: StreamHarness, api: ScriptedApi, name: str, stream: dict[str, Any], destination: str = "duckdb"
) -> None:
    """A catalog with one stream `name` (its settings `stream`) on the scripted API, without auth, into DuckDB
    (`destination` postgres: the test's source database, schema = the source name)."""
    import yaml

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.state.summary import size_pools

    url_file = harness.tmp_path / "target_url"
    url_file.write_text(harness.source.url)
    harness.destination = destination
    catalog = {
        "destination": {"type": "duckdb", "path": str(harness.warehouse)}
        if destination == "duckdb"
        else {"type": "postgres", "credentials": {"file": str(url_file)}},
        "sources": {
            harness.source_name: {
                "type": "rest",
                "base_url": api.url,
                "rate_limit": {"requests_per_second": 200, "burst": 20},
                "streams": {name: stream},
            }
        },
    }
    harness.catalog_path = harness.tmp_path / "catalog.yaml"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    size_pools(harness.settings, load_catalog(harness.catalog_path))
