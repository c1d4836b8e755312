"""Credentials for API requests: the protocol every credential follows, API key header, static bearer token.

OAuth 2 lives in `oauth2.py` and is re-exported here, where callers have always found it."""

from __future__ import annotations

import hashlib
from typing import Protocol

from ingestion_assets.sources.rest.oauth2 import CLIENT_AUTH_METHODS, OAuth2ClientCredentials, OAuth2RefreshToken
from ingestion_assets.sources.rest.secret_store import Secret, SecretRef

__all__ = [
    "CLIENT_AUTH_METHODS",
    "ApiKeyAuth",
    "Auth",
    "BearerAuth",
    "NoAuth",
    "OAuth2ClientCredentials",
    "OAuth2RefreshToken",
]


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
