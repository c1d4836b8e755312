"""OAuth 2 credentials: client credentials and refresh token grants, each client authentication method,
and refresh-token rotation that is stored before the new token is used."""

from __future__ import annotations

import math
import threading
from typing import Any

import httpx

from ingestion_assets.sources.rest.errors import ApiError, AuthError, server_detail
from ingestion_assets.sources.rest.governor import Clock, SystemClock
from ingestion_assets.sources.rest.secret_store import Secret, SecretRef, SecretStoreError

# How the client proves who it is to the token endpoint (RFC 6749 §2.3.1; the names are RFC 7591's).
CLIENT_AUTH_METHODS = {
    "client_secret_basic": "the id and secret as HTTP Basic credentials",
    "client_secret_post": "the id and secret in the form body",
    "none": "a public client: the id in the form body, no secret",
}
CLIENT_AUTH_SETTING = "auth.token_endpoint_auth_method"


def client_auth_method(method: str | None, has_secret: bool) -> str:
    """The method to use: the one asked for, checked against the secret; by default Basic with a secret
    (what RFC 6749 requires every server to support), `none` without one."""
    chosen = method or ("client_secret_basic" if has_secret else "none")
    if chosen not in CLIENT_AUTH_METHODS:
        raise ValueError(f"{CLIENT_AUTH_SETTING} {chosen!r} is not one of {', '.join(CLIENT_AUTH_METHODS)}")
    if (chosen == "none") == has_secret:
        raise ValueError(
            f"{CLIENT_AUTH_SETTING} {chosen}: "
            + ("a public client sends no secret: drop client_secret" if has_secret else "it needs a client_secret")
        )
    return chosen


def _lifetime(value: Any) -> float:
    """`expires_in` in seconds: a number, or the same as text (`"3600"`, `"3599.5"`), as endpoints send it;
    anything else (absent, negative, not a number) means: use the token until the API answers 401."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return math.inf
    try:
        seconds = float(value)
    except ValueError:
        return math.inf
    return seconds if math.isfinite(seconds) and seconds >= 0 else math.inf


class _OAuth2:
    """An access token from a token endpoint, renewed `refresh_margin` seconds before it expires.

    The margin is capped at half the token's lifetime, so short-lived tokens are still used a while.
    `client_auth` is how the client authenticates (CLIENT_AUTH_METHODS): token endpoints differ, and one
    that expects another method answers `invalid_client` as if the secret were wrong.
    """

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: Secret | SecretRef | None,
        *,
        scope: str | None = None,
        client_auth: str | None = None,
        refresh_margin: float = 60.0,
        clock: Clock | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.token_url, self.client_id, self.scope = token_url, client_id, scope
        self._secret = client_secret.read() if isinstance(client_secret, SecretRef) else client_secret
        self.client_auth = client_auth_method(client_auth, self._secret is not None)
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
        return f"{self._who()} at {self.token_url}"

    def _who(self) -> str:
        """The client and where its credentials come from, for messages that name the token URL already."""
        secret = f" (secret from {self._secret.source})" if self._secret else ""
        return f"OAuth 2 client {self.client_id!r}{secret}"

    def _grant(self) -> dict[str, str]:
        raise NotImplementedError

    def _other_methods(self) -> str:
        """The methods to suggest when the endpoint refused this one (a public client would need a secret)."""
        others = " or ".join(m for m in CLIENT_AUTH_METHODS if m not in (self.client_auth, "none"))
        return others if self._secret is not None else f"{others} (with auth.client_secret)"

    def _renew(self) -> None:
        """Fetch a new access token; without an `expires_in` it is used until a 401."""
        body = self._post(self._grant())
        token, lifetime = body.get("access_token"), body.get("expires_in")
        if not isinstance(token, str) or not token:
            raise ApiError(f"token endpoint {self.token_url} answered without an access_token")
        kind = body.get("token_type")
        if kind is not None and str(kind).lower() != "bearer":  # RFC 6749 §5.1: case-insensitive
            raise AuthError(
                f"token endpoint {self.token_url} issued a token of type {str(kind)[:40]!r}; only Bearer tokens "
                "(RFC 6750) can be sent: does the endpoint need a parameter to issue them?"
            )
        self._accept(body)
        self._token = Secret(token, source=f"token endpoint {self.token_url}")
        seconds = _lifetime(lifetime)
        self._renew_at = self._clock.monotonic() + seconds - min(self._margin, seconds / 2)

    def _accept(self, body: dict[str, Any]) -> None:
        """Hook for grants that receive more than an access token."""

    def _authenticated(self, form: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
        """The form and request options (Basic credentials) of a token request, by the client auth method."""
        secret = self._secret.reveal() if self._secret is not None else ""
        if self.client_auth == "client_secret_basic":
            return form, {"auth": httpx.BasicAuth(self.client_id, secret)}
        if self.client_auth == "client_secret_post":
            return {**form, "client_id": self.client_id, "client_secret": secret}, {}
        return {**form, "client_id": self.client_id}, {}

    def _post(self, form: dict[str, str]) -> dict[str, Any]:
        data, options = self._authenticated(form)
        http = self._http or httpx.Client(timeout=30.0)
        try:
            response = http.post(self.token_url, data=data, headers={"Accept": "application/json"}, **options)
        except httpx.TransportError as exc:
            raise ApiError(
                f"token endpoint {self.token_url} unreachable: {type(exc).__name__}", transient=True
            ) from exc
        finally:
            if self._http is None:
                http.close()
        if response.status_code == 200:
            try:
                body = response.json()
            except ValueError as exc:
                kind = response.headers.get("Content-Type")
                raise ApiError(f"token endpoint {self.token_url} answered 200 with a non-JSON body ({kind})") from exc
            return body if isinstance(body, dict) else {}
        raise self._refused(response)

    def _refused(self, response: httpx.Response) -> ApiError:
        detail = server_detail(response)
        if response.status_code >= 500 or response.status_code == 429:
            return ApiError(
                f"token endpoint {self.token_url}: HTTP {response.status_code} ({detail}); try again later",
                response.status_code,
                transient=True,
            )
        if "invalid_client" in detail or response.status_code == 401:
            return AuthError(
                f"token endpoint {self.token_url} rejected {self._who()} ({detail}), authenticated by "
                f"{self.client_auth} ({CLIENT_AUTH_METHODS[self.client_auth]}): check the client id"
                f"{' and that the secret is the current one' if self._secret is not None else ''}; if they are "
                f"right, the endpoint may expect another method: set {CLIENT_AUTH_SETTING} to {self._other_methods()}",
                response.status_code,
            )
        if "invalid_scope" in detail:
            return AuthError(f"token endpoint {self.token_url}: scope {self.scope!r} not allowed ({detail})")
        return AuthError(f"token endpoint {self.token_url} refused {self._who()}: {detail}", response.status_code)


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

    def _who(self) -> str:
        return f"{super()._who()}, refresh token in {self.refresh_token}"

    def _renew(self) -> None:
        """Read, spend and write back the refresh token under the store's lock: another process using the
        same file waits, then reads the token this one stored, so a rotated token is never sent twice."""
        with self.refresh_token.locked():
            super()._renew()

    def _grant(self) -> dict[str, str]:
        grant = {"grant_type": "refresh_token", "refresh_token": self.refresh_token.read().reveal()}
        return {**grant, **({"scope": self.scope} if self.scope else {})}

    def _accept(self, body: dict[str, Any]) -> None:
        """A rotated refresh token is stored before the access token is used: the old one is spent."""
        rotated = body.get("refresh_token")
        if isinstance(rotated, str) and rotated:
            try:
                self.refresh_token.write(rotated)
            except SecretStoreError as exc:
                raise AuthError(
                    f"{exc}: the token endpoint rotated the refresh token and the new one could not be stored; "
                    f"the old one is spent. Make {self.refresh_token} writable and store a new refresh token there"
                ) from exc

    def _refused(self, response: httpx.Response) -> ApiError:
        if "invalid_grant" in server_detail(response):
            return AuthError(
                f"token endpoint {self.token_url} rejected the refresh token in {self.refresh_token} "
                "(invalid_grant): it expired, was revoked or was already used (rotated tokens are single-use: "
                "is another process using the same one?). Obtain a new refresh token and write it to that file",
                response.status_code,
            )
        return super()._refused(response)
