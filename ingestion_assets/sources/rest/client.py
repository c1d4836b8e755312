"""The HTTP client every API stream uses: one `request()` through the governor, retries and auth."""

from __future__ import annotations

import contextlib
import email.utils
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import httpx

from ingestion_assets.sources.rest.auth import Auth, NoAuth
from ingestion_assets.sources.rest.errors import NotJson, RateLimited, Redirected, RetriesExhausted, error_for
from ingestion_assets.sources.rest.governor import (
    SHARED_BUCKETS,
    BucketRegistry,
    Clock,
    RetryPolicy,
    SystemClock,
    retry_after_seconds,
)
from ingestion_assets.sources.rest.payload import CutOff, parse_json
from ingestion_assets.sources.tls import TlsError, TlsFiles, handshake_failure, http_ssl_context, ssl_cause
from ingestion_assets.sources.tls_http import VerifiedTransport

logger = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({408, 500, 502, 503, 504})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5  # one request follows at most this many (same-origin) redirects


@dataclass
class HttpFigures:
    """What a client's requests cost, for the run's metadata: one client serves one stream run."""

    requests: int = 0  # sent, including retries and 429s
    rate_limited: int = 0  # 429 answers
    retries: int = 0  # transient failures retried (5xx, timeouts, resets, bodies cut off)
    paused_seconds: float = 0.0  # waited because the API answered 429
    throttled_seconds: float = 0.0  # waited for the token bucket (the configured rate)
    bytes: int = 0  # response bodies received, as sent (compressed or not)

    def as_metadata(self) -> dict[str, int | float]:
        return {
            "http requests": self.requests,
            "http 429s": self.rate_limited,
            "http retries": self.retries,
            "seconds paused for 429s": round(self.paused_seconds, 3),
            "seconds waiting for the rate limit": round(self.throttled_seconds, 3),
            "bytes received": self.bytes,
        }


class _Attempts:
    """The retry budget of one request: transient failures and time paused for 429s."""

    def __init__(self, policy: RetryPolicy, clock: Clock, rng: random.Random, where: str) -> None:
        self.policy, self.clock, self.rng, self.where = policy, clock, rng, where
        self.started = clock.monotonic()
        self.failures = 0
        self.limited = 0  # 429s so far
        self.paused = 0.0  # seconds the API asked us to wait so far

    def failed(self, what: str, retry_after: float | None) -> None:
        """Wait before the next attempt after a transient failure, or raise once the budget is spent."""
        self.failures += 1
        wait = retry_after if retry_after is not None else self.policy.backoff(self.failures, self.rng)
        elapsed = self.clock.monotonic() - self.started
        if self.failures >= self.policy.max_attempts or elapsed + wait > self.policy.max_elapsed_seconds:
            raise RetriesExhausted(
                f"{self.where}: gave up after {self.failures} failed attempts in {elapsed:.0f} s (last: {what}); "
                "the API or the network is failing: try again later, or raise the retry policy's limits"
            )
        logger.warning("%s: %s, retry %d in %.2f s", self.where, what, self.failures, wait)
        self.clock.sleep(wait)

    def rate_limited(self, response: httpx.Response) -> float:
        """Seconds to pause the credential after a 429, or raise once paused longer than allowed."""
        self.limited += 1
        asked = retry_after_seconds(response.headers.get("Retry-After"), self.clock.now())
        wait = asked if asked is not None else self.policy.backoff(self.limited, self.rng)
        self.paused += wait
        if self.paused > self.policy.max_rate_limited_seconds:
            raise RateLimited(
                f"{self.where}: still rate limited (429) after pausing {self.paused - wait:.0f} s; "
                "lower the stream's request rate or raise max_rate_limited_seconds",
                429,
            )
        logger.info("%s: 429 rate limited, pausing %.2f s", self.where, wait)
        return wait


class RestClient:
    """An httpx client (timeouts, pooled connections, HTTP/2 where the server offers it) behind the governor.

    Requests with the same credential share one token bucket (`rate` per second, bursts of `burst`)
    through `buckets`, across clients and threads. `clock` decides how time passes and waits.
    """

    def __init__(
        self,
        base_url: str,
        auth: Auth | None = None,
        *,
        rate: float = 10.0,
        burst: int = 5,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        clock: Clock | None = None,
        buckets: BucketRegistry | None = None,
        transport: httpx.BaseTransport | None = None,
        seed: int | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.auth: Auth = auth or NoAuth()
        self.retry = retry or RetryPolicy()
        self._clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._bucket = (buckets or SHARED_BUCKETS).bucket(self.auth.key, rate, burst, self._clock)
        self._targets: dict[str, tuple[httpx.URL, str]] = {}  # path -> its absolute URL, and the text for messages
        self._redirects_said: set[tuple[str, str]] = set()  # (from, to) redirects already logged
        self.figures = HttpFigures()
        if tls is not None and transport is None:  # verification stays on; handshake failures are permanent
            where = f"API {httpx.URL(base_url).host}"  # the host only: a base URL may carry a key in its query
            transport = VerifiedTransport(http_ssl_context(tls, where), where)
        self._http = httpx.Client(
            base_url=base_url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            http2=True,
            transport=transport,
            headers={"Accept": "application/json", "User-Agent": "ingestion-assets"},
        )

    def request(self, method: str, url: str, params: Mapping[str, str | int] | None = None) -> httpx.Response:
        """A successful response, after as many pauses and retries as the policy allows.

        Raises AuthError (401 after one renewal, 403), NotFound, ApiError (other 4xx) at once;
        RateLimited or RetriesExhausted when the budget is spent. Redirects are followed on the same scheme, host
        and port only (Redirected otherwise: the credentials stay home).
        """
        return self._request(method, url, params, parse=False)[0]

    def request_json(
        self, method: str, url: str, params: Mapping[str, str | int] | None = None, stream: str = ""
    ) -> tuple[httpx.Response, Any]:
        """Like `request`, and the parsed JSON body. A body cut off in transit (declared JSON, ending
        mid-document) and a complete 2xx body that is not JSON (an HTML maintenance page) are retried like a
        5xx; once the retries are spent the error names the status, the content type and the body's start.
        `stream` (for messages) names the stream the request reads for."""
        return self._request(method, url, params, parse=True, stream=stream)

    def _request(
        self, method: str, url: str, params: Mapping[str, str | int] | None, parse: bool, stream: str = ""
    ) -> tuple[httpx.Response, Any]:
        target, where = self._target(url)
        where = f"{'stream ' + stream + ': ' if stream else ''}{method} {where}"
        attempts, renewed, hops = _Attempts(self.retry, self._clock, self._rng, where), False, 0
        while True:
            headers = self.auth.headers()  # a token renewal happens here, not between the slot and the send
            waited = self._bucket.acquire()
            if waited > 0:
                self.figures.throttled_seconds += waited
                headers = self.auth.headers()  # renewed only if the wait brought the token near its expiry
            self.figures.requests += 1
            try:
                request = self._http.build_request(method, target, params=params, headers=headers)
                response = self._http.send(request)
            except httpx.TransportError as exc:  # timeouts, refused or dropped connections
                if (cause := ssl_cause(exc)) is not None:  # a certificate no retry makes valid: say so at once
                    hint = "an API whose certificate a private CA signed needs the source's `tls` block with that CA"
                    raise TlsError(handshake_failure(where, target.host, cause, hint)) from exc
                self._failed(attempts, type(exc).__name__, None)
                continue
            self.figures.bytes += response.num_bytes_downloaded
            status = response.status_code
            if status in REDIRECTS:  # followed here, on the same origin only: never to where credentials must not go
                hops += 1
                target, params = self._redirect(response, where, hops), None  # the Location carries its query
                method = "GET" if status == 303 else method
                continue
            if status < 400:
                if not parse:
                    return response, None
                try:
                    return response, parse_json(response, where)
                except CutOff as cut:
                    self._failed(attempts, str(cut), None)
                    continue
                except NotJson as page:  # a maintenance page in the middle of a read: an outage, not a bad spec
                    self._failed(attempts, str(page).removeprefix(f"{where}: "), None)
                    continue
            if status == 401 and not renewed and self.auth.refresh():
                renewed = True
                continue
            if status == 429:
                self.figures.rate_limited += 1
                pause = attempts.rate_limited(response)
                self.figures.paused_seconds += pause
                self._bucket.pause(pause)
            elif status in TRANSIENT_STATUSES:
                asked = retry_after_seconds(response.headers.get("Retry-After"), self._clock.now())
                self._failed(attempts, f"HTTP {status}", asked)
            else:
                raise error_for(response, where, self.auth.describe())

    def _redirect(self, response: httpx.Response, where: str, hops: int) -> httpx.URL:
        """Where a redirect leads, if it may be followed: the same scheme, host and port (the request's credentials
        go with it), at most MAX_REDIRECTS in a row. Elsewhere, the API has moved: the error says where to."""
        status, here = response.status_code, response.request.url
        location = response.headers.get("Location")
        if not location:
            raise Redirected(
                f"{where}: HTTP {status} redirect without a Location header; check base_url and path", status
            )
        to = here.join(location)
        shown = str(to.copy_with(query=None, fragment=None, userinfo=b""))  # a query may carry a key
        if (to.scheme, to.host, to.port) != (here.scheme, here.host, here.port):
            raise Redirected(
                f"{where}: HTTP {status} redirect to {shown}, on another scheme, host or port: not followed, since "
                "the request's credentials would go there. If the API has moved, set the source's base_url (or the "
                "stream's path) to its new address",
                status,
            )
        if hops > MAX_REDIRECTS:
            raise Redirected(
                f"{where}: more than {MAX_REDIRECTS} redirects in a row (the last to {shown}); check base_url and path",
                status,
            )
        said = (str(here.copy_with(query=None, fragment=None, userinfo=b"")), shown)
        if said not in self._redirects_said:
            self._redirects_said.add(said)
            logger.warning(
                "%s: HTTP %d redirect to %s (same host), followed; point base_url or the path there to save a request",
                where,
                status,
                shown,
            )
        return to

    def _failed(self, attempts: _Attempts, what: str, retry_after: float | None) -> None:
        attempts.failed(what, retry_after)  # raises once the budget is spent: that one is no retry
        self.figures.retries += 1

    def _target(self, url: str) -> tuple[httpx.URL, str]:
        """The absolute URL, and the same without its query for messages. Worked out once per path: joining a
        path to the base URL costs three URL parses, half the work of building a request."""
        found = self._targets.get(url)
        if found is None:
            absolute = self._http.build_request("GET", url).url
            found = (absolute, str(absolute.copy_with(query=None, fragment=None)))
            if "?" not in url:  # a path, not a next-page link (each of those is met once)
                self._targets[url] = found
        return found

    def server_time(self, response: httpx.Response) -> datetime:
        """When the server answered, by its own clock (the `Date` header, whole seconds, rounded down), or by
        ours when it sends none. Records the server stamps after this moment carry a later timestamp."""
        header = response.headers.get("Date")
        if header:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                moment = email.utils.parsedate_to_datetime(header)
                return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return self._clock.now()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
