"""A SaaS-like HTTP API on loopback for tests and the demo: OAuth 2, an API key, four paginations, limits, faults."""

from __future__ import annotations

import argparse
import copy
import hmac
import json
import logging
import math
import random
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, replace
from email.message import Message
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from ingestion_assets.demo.resources import Reply, Resources, error_reply
from ingestion_assets.demo.token_endpoint import TokenEndpoint, TokenPolicy, TokenRefused
from ingestion_assets.sources.json_numbers import json_text

logger = logging.getLogger(__name__)
SCOPES = {"orders": "orders:read", "customers": "customers:read"}  # resource -> the scope reading it needs
FAULTS = ("429", "5xx", "reset", "cut")  # cut: a 200 whose JSON body stops halfway, as a dropped proxy leaves it


@dataclass(frozen=True)
class DemoConfig:
    client_id: str = "demo-client"
    client_secret: str = "demo-client-secret"
    scopes: tuple[str, ...] = ("orders:read", "customers:read")  # what the OAuth client may be granted
    refresh_token: str = "demo-refresh-token"  # the first refresh token; each use rotates it
    api_key: str = "demo-api-key"  # X-API-Key, accepted on /v1/customers only
    admin_token: str = "demo-admin-token"  # bearer token of /admin/*
    token_ttl: float = 30.0  # access token lifetime, seconds
    client_auth: str = "any"  # the token endpoint's client authentication: any | client_secret_basic | ... | none
    rate: float = 200.0  # requests per second per client (server-side token bucket)
    burst: int = 100
    retry_after: str = "seconds"  # how 429s say when to come back: seconds | date | alternate
    storm_retry_after: int = 1  # Retry-After of an injected 429
    latency: float = 0.0  # seconds every resource request takes on the server before it answers
    error_rate: float = 0.0  # probability of a 503 per resource request
    reset_rate: float = 0.0  # probability of closing the connection without a response
    repeat_cursor: bool = False  # a broken server: hands back the cursor it was given
    page_cap: int | None = None  # pages hold at most this many records, whatever size was asked (GitHub's 100)
    page_past_end: str = "empty"  # a page number past the last: empty | 404 (Django REST framework's answer)
    newest_first: bool = False  # list (updated_at, id) descending, as Stripe and GitHub do by default
    exclusive_since: bool = False  # updated_since filters `>` (strictly after), not `>=`
    seed: int = 7
    customers: int = 120
    orders: int = 400
    tie_group: int = 7  # consecutive seeded records sharing one updated_at


class _Reset(Exception):
    """Close the connection without answering."""


class _Cut(Exception):
    """Answer 200 with the first half of the JSON body (its Content-Length says so: the framing is intact)."""


class DemoApi:
    """The server's state and the hooks tests use: change data, inject faults, read the request log."""

    def __init__(self, config: DemoConfig, data_dir: Path | None) -> None:
        self.config = config
        self.url = ""
        self._lock = threading.Lock()
        self._rng = random.Random(config.seed + 1)  # mutations and random faults, reproducible
        self._log: list[dict[str, Any]] = []
        self.resources = Resources(config, data_dir, self._rng)
        self._tokens = TokenEndpoint(
            TokenPolicy(
                config.client_id,
                config.client_secret,
                config.scopes,
                config.refresh_token,
                config.token_ttl,
                config.client_auth,
            )
        )
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when)
        self._faults = dict.fromkeys(FAULTS, 0)
        self._dated = False  # the last 429 gave an HTTP-date (for retry_after="alternate")
        self._server: ThreadingHTTPServer | None = None

    def configure(self, **changes: Any) -> None:
        with self._lock:
            self.config = replace(self.config, **changes)

    def mutate(self, resource: str, inserts: int = 0, updates: int = 0) -> str:
        return self.resources.mutate(resource, inserts, updates)

    def delete(self, resource: str, count: int, mark: bool) -> list[int]:
        return self.resources.delete(resource, count, mark)

    def patch(self, resource: str, count: int, fields: dict[str, Any]) -> list[int]:
        return self.resources.patch(resource, count, fields)

    def records(self, resource: str, since: str | None = None) -> list[dict[str, Any]]:
        return self.resources.records(resource, since)

    def put(self, resource: str, records: list[dict[str, Any]]) -> None:
        self.resources.put(resource, records)

    def _listing(self, path: str, resource: str, query: dict[str, str]) -> Reply:
        config = self.config
        return self.resources.listing(
            path, resource, query, self.url, config.repeat_cursor, config.newest_first, config.exclusive_since
        )

    def request_log(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._log)

    def fail_next(self, kind: str, count: int) -> None:
        """The next `count` resource requests get a 429 (storm), a 503 or a connection reset."""
        with self._lock:
            self._faults[kind] = count

    def issued_tokens(self) -> list[str]:
        """Every access and refresh token issued so far (a test looks for them where they must not be)."""
        return list(self._tokens.issued)

    def client_auth_seen(self) -> list[str]:
        """How each token request authenticated its client: client_secret_basic, client_secret_post or none."""
        return list(self._tokens.methods_seen)

    def revoke_access_tokens(self) -> None:
        self._tokens.revoke_access_tokens()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _respond(
        self, method: str, path: str, query: dict[str, str], headers: Message, body: bytes, entry: dict[str, Any]
    ) -> Reply:
        if (method, path) == ("POST", "/oauth/token"):
            return self._token(headers, {k: v[-1] for k, v in parse_qs(body.decode()).items()})
        if path.startswith("/admin/"):
            return self._admin(method, path, headers, body)
        resource = path.removeprefix("/v1/")
        if method != "GET" or resource.removesuffix("/ids") not in SCOPES:
            raise error_reply(
                404, "not_found", f"no endpoint {method} {path}; there are GET /v1/orders and /v1/customers"
            )
        entry["client"] = client = self._authorize(resource.removesuffix("/ids"), headers)
        self._inject_faults(client)
        if self.config.latency:  # when the answer leaves, whatever the work took (_handle waits for it)
            entry["due"] = entry["received"] + self.config.latency
        return self._listing(path, resource, query)

    def _token(self, headers: Message, form: dict[str, str]) -> Reply:
        try:
            return Reply(200, self._tokens.handle(headers, form))
        except TokenRefused as refused:
            raise error_reply(refused.status, refused.code, refused.description) from refused

    def _admin(self, method: str, path: str, headers: Message, body: bytes) -> Reply:
        if not hmac.compare_digest(headers.get("Authorization") or "", f"Bearer {self.config.admin_token}"):
            raise error_reply(401, "invalid_token", "the admin endpoints need the admin bearer token")
        args = json.loads(body or b"{}")
        if (method, path) == ("GET", "/admin/requests"):
            return Reply(200, {"data": self.request_log()})
        if (method, path) == ("POST", "/admin/mutate"):
            stamp = self.mutate(str(args["resource"]), int(args.get("inserts", 0)), int(args.get("updates", 0)))
            return Reply(200, {"updated_at": stamp})
        if (method, path) == ("POST", "/admin/faults") and str(args.get("kind")) in FAULTS:
            self.fail_next(str(args["kind"]), int(args.get("count", 1)))
            return Reply(200, {})
        raise error_reply(404, "not_found", f"no admin endpoint {method} {path} (or a bad fault kind)")

    def _authorize(self, resource: str, headers: Message) -> str:
        key = headers.get("X-API-Key")
        if key is not None and resource == "customers":
            if hmac.compare_digest(key, self.config.api_key):
                return "api-key"
            raise error_reply(401, "invalid_api_key", "the X-API-Key header holds no valid key")
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        expires, scopes, client = self._tokens.lookup(token)
        if scheme.lower() != "bearer" or expires < time.monotonic():
            raise error_reply(
                401, "invalid_token", "missing, unknown or expired access token", {"WWW-Authenticate": "Bearer"}
            )
        if SCOPES[resource] not in scopes:
            raise error_reply(403, "insufficient_scope", f"reading {resource} needs the scope {SCOPES[resource]}")
        return client

    def _inject_faults(self, client: str) -> None:
        with self._lock:
            kind = next((k for k, n in self._faults.items() if n > 0), None)
            if kind is not None:
                self._faults[kind] -= 1
            elif self._rng.random() < self.config.error_rate:
                kind = "5xx"
            elif self._rng.random() < self.config.reset_rate:
                kind = "reset"
        if kind == "429":
            raise self._too_many(self.config.storm_retry_after)
        if kind == "5xx":
            raise error_reply(503, "unavailable", "the service is briefly unavailable; retry")
        if kind == "reset":
            raise _Reset
        self._throttle(client)
        if kind == "cut":
            raise _Cut

    def _throttle(self, client: str) -> None:
        with self._lock:
            now, rate, burst = time.monotonic(), self.config.rate, self.config.burst
            tokens, updated = self._buckets.get(client, (float(burst), now))
            tokens = min(float(burst), tokens + (now - updated) * rate)
            self._buckets[client] = (tokens - 1 if tokens >= 1 else tokens, now)
        if tokens < 1:
            raise self._too_many(math.ceil((1 - tokens) / rate))

    def _too_many(self, seconds: int) -> Reply:
        with self._lock:
            style = self.config.retry_after
            self._dated = dated = style == "date" or (style == "alternate" and not self._dated)
        when = formatdate(math.ceil(time.time()) + seconds, usegmt=True) if dated else str(seconds)
        return error_reply(429, "rate_limited", "too many requests; slow down", {"Retry-After": when})

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        entry: dict[str, Any] = {"at": time.time(), "method": method, "path": url.path, "status": 0, "client": None}
        entry["received"] = time.monotonic()
        with self._lock:
            self._log.append(entry)
        cut = False
        try:
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                reply = self._respond(method, url.path, query, handler.headers, body, entry)
            except _Cut:
                cut, reply = True, self._listing(url.path, url.path.removeprefix("/v1/"), query)
        except Reply as raised:
            reply = raised
        except _Reset:
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.close_connection = True
            return
        entry["status"], data = reply.status, _encoded(reply.body)
        data = data[: len(data) // 2] if cut else data
        handler.send_response(reply.status)
        for name, value in {
            **reply.headers,
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
        }.items():
            handler.send_header(name, value)
        if "due" in entry:  # the answer, encoded, leaves `latency` after the request came, whatever the work took
            time.sleep(max(0.0, entry.pop("due") - time.monotonic()))
        handler.end_headers()  # buffered with the body: both leave in one write
        handler.wfile.write(data)
        handler.wfile.flush()
        entry["answered"] = time.monotonic()  # received to answered: the server's time; the rest is the client's


def _encoded(body: Any) -> bytes:
    """The body as JSON; records holding exact numbers (a test's Decimal amounts) with every digit as written."""
    try:
        return json.dumps(body).encode()
    except TypeError:
        return json_text(body).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections close after this
    disable_nagle_algorithm = True
    wbufsize = 1 << 16  # headers and body leave together, as a server sends a small answer (one write per answer)

    def do_GET(self) -> None:
        cast(_Server, self.server).api._handle(self, "GET")

    def do_POST(self) -> None:
        cast(_Server, self.server).api._handle(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug(format, *args)


class _Server(ThreadingHTTPServer):
    api: DemoApi


def start_demo_api(
    port: int = 0, data_dir: Path | None = None, config: DemoConfig | None = None, **overrides: Any
) -> DemoApi:
    """Serve on 127.0.0.1:`port` (0: a free one) in a daemon thread; `overrides` replace `config` fields."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    api = DemoApi(replace(config or DemoConfig(), **overrides), data_dir)
    server = _Server(("127.0.0.1", port), _Handler)
    server.api, api._server, api.url = api, server, f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="demo-api", daemon=True).start()
    return api


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the demo SaaS API on 127.0.0.1 until interrupted.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the records in DIR/demo_api.json")
    parser.add_argument("--token-ttl", type=float, default=DemoConfig.token_ttl)
    parser.add_argument("--orders", type=int, default=DemoConfig.orders)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each resource request takes")
    parser.add_argument("--rate", type=float, default=DemoConfig.rate, help="requests/s the API allows a client")
    parser.add_argument("--burst", type=int, default=DemoConfig.burst)
    args = parser.parse_args(argv)
    # A parent that ignores SIGTERM (a background job, a CI runner) passes that on: `ingest down` must stop us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limits = {"orders": args.orders, "latency": args.latency, "rate": args.rate, "burst": args.burst}
    api = start_demo_api(args.port, args.data_dir, token_ttl=args.token_ttl, **limits)
    logger.info("demo API on %s (OAuth client %s; secrets are the DemoConfig defaults)", api.url, api.config.client_id)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        api.stop()


if __name__ == "__main__":
    main()
