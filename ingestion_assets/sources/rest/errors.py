"""Every error an HTTP API source raises, in one place; messages name the endpoint and what to check, never a secret."""

from __future__ import annotations

import httpx

from ingestion_assets.sources.redact import redact

_MAX_DETAIL = 200  # characters of the server's own explanation kept in a message


class ApiError(Exception):
    """A request to an HTTP API failed; `status` is the HTTP status (None: no response).

    `transient`: whether trying again later may succeed (an outage, a rate limit, a cut-off body). A
    permanent error (credentials, path, spec, a server bug) fails the same way on every retry, so a
    stream stops at once instead of spending its retries on it.
    """

    transient: bool = False  # subclasses that know set it; a plain ApiError judges by its status

    def __init__(self, message: str, status: int | None = None, *, transient: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        if transient is not None:
            self.transient = transient
        elif type(self) is ApiError and status is not None:
            self.transient = status in (408, 425, 429) or status >= 500


class AuthError(ApiError):
    """The credentials were rejected or lack a permission: retrying cannot help, fixing them does."""


class NotFound(ApiError):
    """The endpoint does not exist: usually a wrong base URL or path."""


class RateLimited(ApiError):
    """The API kept answering 429 for longer than the source is willing to pause."""

    transient = True


class RetriesExhausted(ApiError):
    """Transient failures (5xx, timeouts, dropped connections, cut-off bodies) went on past the retry budget."""

    transient = True


class PaginationLoop(ApiError):
    """The API handed back a page token (or a page) it had already given: reading on would never end, and
    reading again would loop again (a server bug): permanent."""


class BadPayload(ApiError):
    """A complete answer that does not hold what the endpoint's spec says (not JSON, no records where the
    spec looks for them): permanent until the spec or the server changes."""


class NotJson(BadPayload):
    """A complete 2xx body that is not JSON: a maintenance or login page, a proxy's error page. Retried like a 5xx
    by the client (an outage page goes away); raised on its own only where nothing retries (`parse_json`)."""


class Redirected(ApiError):
    """The API answered with a redirect the client will not follow: to another host, scheme or port (the request's
    credentials would go there), without a Location, or in a chain too long. Permanent until the URL changes."""


class FieldMissing(BadPayload):
    """No record of a run's first pages has the stream's primary key (or cursor) field: the catalog names a field
    the API does not send. A setting to fix, not bad records to park: permanent until the catalog changes."""


def server_detail(response: httpx.Response) -> str:
    """The server's `error` / `error_description` (or the start of its body), for a message; a secret it
    echoes (a rejected token, often) is masked."""
    try:
        body = response.json()
    except ValueError:
        return redact(response.text)[:_MAX_DETAIL].strip()
    if not isinstance(body, dict):
        return ""
    parts = [str(body[key]) for key in ("error", "error_description", "message", "detail") if body.get(key)]
    return redact(": ".join(parts))[:_MAX_DETAIL]


def error_for(response: httpx.Response, where: str, credential: str) -> ApiError:
    """The exception for a final (non-retried) error response to the request `where`.

    `credential` describes the credential in use (its kind and reference, never its value).
    """
    status, detail = response.status_code, server_detail(response)
    said = f" (server says: {detail})" if detail else ""
    if status == 401:
        return AuthError(
            f"{where}: 401 unauthorized{said}. The credentials were rejected: check {credential} "
            "(is it current, for this API and this environment?)",
            status,
        )
    if status == 403:
        return AuthError(
            f"{where}: 403 forbidden{said}. {credential} is valid but may not read this endpoint: "
            "grant it the scope or permission the endpoint needs, or drop the stream",
            status,
        )
    if status == 404:
        return NotFound(f"{where}: 404 not found{said}. Check the base URL and the endpoint path", status)
    return ApiError(f"{where}: HTTP {status}{said}; this status is not retried", status)
