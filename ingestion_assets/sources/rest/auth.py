"""Credentials for API requests: API key header, static bearer token, OAuth 2 client credentials and refresh token."""

from __future__ import annotations

import hashlib
import math
import threading
from typing import Any, Protocol

import httpx

from ingestion_assets.sources.rest.errors import ApiError, AuthError, server_detail
from ingestion_assets.sources.rest.governor import Clock, SystemClock
from ingestion_assets.sources.rest.secret_store import Secret, SecretRef


class Auth(Protocol):
    """What a client needs from a credential. `key` and `describe()` must never contain the secret."""

    @property
    def key(self) -> str:
        """Names the credential for the governor: requests with one key share one rate limit."""
        ...

    def headers(self) -> dict[str, str]: ...

    def refresh(self) -> bool:
        """Called once after a 401: get new credentials; False if there is nothing to renew."""
        ...

    def describe(self) -> str: ...


def _fingerprint(secret: Secret) -> str:
    return hashlib.sha256(secret.reveal().encode()).hexdigest()[:16]


class NoAuth:
    key = "anonymous"

    def headers(self) -> dict[str, str]:
        return {}

    def refresh(self) -> bool:
        return False

    def describe(self) -> str:
        return "the request (it sends no credentials; does the API need some?)"


class ApiKeyAuth:
    """A static key in a header (`X-API-Key` by default)."""

    def __init__(self, key: Secret | SecretRef, header: str = "X-API-Key") -> None:
        self._secret = key.read() if isinstance(key, SecretRef) else key
        self.header = header
        self.key = f"api-key:{header}:{_fingerprint(self._secret)}"

    def headers(self) -> dict[str, str]:
        return {self.header: self._secret.reveal()}

    def refresh(self) -> bool:
        return False

    def describe(self) -> str:
        return f"the API key in header {self.header} (from {self._secret.source})"


class BearerAuth(ApiKeyAuth):
    """A static token sent as `Authorization: Bearer ...`."""

    def __init__(self, token: Secret | SecretRef) -> None:
        super().__init__(token, header="Authorization")
        self.key = f"bearer:{_fingerprint(self._secret)}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._secret.reveal()}"}

    def describe(self) -> str:
        return f"the bearer token (from {self._secret.source})"


class _OAuth2:
    """An access token from a token endpoint, renewed `refresh_margin` seconds before it expires.

    The margin is capped at half the token's lifetime, so short-lived tokens are still used a while.
    """

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: Secret | SecretRef | None,
        *,
        scope: str | None = None,
        refresh_margin: float = 60.0,
        clock: Clock | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.token_url, self.client_id, self.scope = token_url, client_id, scope
        self._secret = client_secret.read() if isinstance(client_secret, SecretRef) else client_secret
        self._margin, self._clock, self._http = refresh_margin, clock or SystemClock(), http
        self._token: Secret | None = None
        self._renew_at = 0.0
        self._lock = threading.Lock()
        self.key = f"oauth2:{token_url}:{client_id}"

    def headers(self) -> dict[str, str]:
        with self._lock:
            if self._token is None or self._clock.monotonic() >= self._renew_at:
                self._renew()
            assert self._token is not None
            return {"Authorization": f"Bearer {self._token.reveal()}"}

    def refresh(self) -> bool:
        with self._lock:
            self._renew()
        return True

    def describe(self) -> str:
        secret = f", secret from {self._secret.source}" if self._secret else ""
        return f"OAuth 2 client {self.client_id!r} at {self.token_url}{secret}"

    def _grant(self) -> dict[str, str]:
        raise NotImplementedError

    def _renew(self) -> None:
        """Fetch a new access token; without an `expires_in` it is used until a 401."""
        body = self._post(self._grant())
        token, lifetime = body.get("access_token"), body.get("expires_in")
        if not isinstance(token, str) or not token:
            raise ApiError(f"token endpoint {self.token_url} answered without an access_token")
        self._accept(body)
        self._token = Secret(token, source=f"token endpoint {self.token_url}")
        readable = isinstance(lifetime, int | float) or (isinstance(lifetime, str) and lifetime.isdigit())
        seconds = float(lifetime) if readable and lifetime is not None else math.inf
        self._renew_at = self._clock.monotonic() + seconds - min(self._margin, seconds / 2)

    def _accept(self, body: dict[str, Any]) -> None:
        """Hook for grants that receive more than an access token."""

    def _post(self, form: dict[str, str]) -> dict[str, Any]:
        login = (self.client_id, self._secret.reveal() if self._secret else "")
        http = self._http or httpx.Client(timeout=30.0)
        try:
            response = http.post(self.token_url, data=form, auth=login, headers={"Accept": "application/json"})
        except httpx.TransportError as exc:
            raise ApiError(f"token endpoint {self.token_url} unreachable: {type(exc).__name__}") from exc
        finally:
            if self._http is None:
                http.close()
        if response.status_code == 200:
            body = response.json()
            return body if isinstance(body, dict) else {}
        raise self._refused(response)

    def _refused(self, response: httpx.Response) -> ApiError:
        detail = server_detail(response)
        if response.status_code >= 500 or response.status_code == 429:
            return ApiError(f"token endpoint {self.token_url}: HTTP {response.status_code} ({detail}); try again later")
        if "invalid_client" in detail or response.status_code == 401:
            return AuthError(
                f"token endpoint {self.token_url} rejected {self.describe()} ({detail}): "
                "check the client id and that the secret is the current one",
                response.status_code,
            )
        if "invalid_scope" in detail:
            return AuthError(f"token endpoint {self.token_url}: scope {self.scope!r} not allowed ({detail})")
        return AuthError(f"token endpoint {self.token_url} refused {self.describe()}: {detail}", response.status_code)


class OAuth2ClientCredentials(_OAuth2):
    """RFC 6749 §4.4: the client's own id and secret buy an access token."""

    def _grant(self) -> dict[str, str]:
        return {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}


class OAuth2RefreshToken(_OAuth2):
    """RFC 6749 §6: a refresh token buys an access token; a rotated refresh token is written back at once.

    The refresh token lives in a secret store, so a restarted process uses the newest one.
    """

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: Secret | SecretRef | None,
        refresh_token: SecretRef,
        **options: Any,
    ) -> None:
        super().__init__(token_url, client_id, client_secret, **options)
        self.refresh_token = refresh_token

    def describe(self) -> str:
        return f"{super().describe()}, refresh token in {self.refresh_token}"

    def _grant(self) -> dict[str, str]:
        grant = {"grant_type": "refresh_token", "refresh_token": self.refresh_token.read().reveal()}
        return {**grant, **({"scope": self.scope} if self.scope else {})}

    def _accept(self, body: dict[str, Any]) -> None:
        rotated = body.get("refresh_token")
        if isinstance(rotated, str) and rotated:
            self.refresh_token.write(rotated)

    def _refused(self, response: httpx.Response) -> ApiError:
        if "invalid_grant" in server_detail(response):
            return AuthError(
                f"token endpoint {self.token_url} rejected the refresh token in {self.refresh_token} "
                "(invalid_grant): it expired, was revoked or was already used (rotated tokens are single-use: "
                "is another process using the same one?). Obtain a new refresh token and write it to that file",
                response.status_code,
            )
        return super()._refused(response)
