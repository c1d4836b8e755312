"""The demo API's OAuth 2 token endpoint: client authentication by one method or any, grants, rotation."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from email.message import Message
from typing import Any

# How a token endpoint may authenticate its client (RFC 6749 §2.3.1, RFC 7591 `token_endpoint_auth_method`):
# "any" accepts a secret by Basic or in the form body, as lenient servers do; the others only their own
# method ("none": a public client, its id in the form and no secret).
CLIENT_AUTH = ("any", "client_secret_basic", "client_secret_post", "none")


class TokenRefused(Exception):
    """An RFC 6749 §5.2 error answer: HTTP status, `error` code and description."""

    def __init__(self, status: int, code: str, description: str) -> None:
        super().__init__(code)
        self.status, self.code, self.description = status, code, description


@dataclass(frozen=True)
class TokenPolicy:
    """What the endpoint expects of its one client."""

    client_id: str
    client_secret: str
    scopes: tuple[str, ...]
    refresh_token: str  # the first refresh token; each use rotates it
    token_ttl: float
    client_auth: str = "any"


class TokenEndpoint:
    """Issues access tokens; refresh tokens are single-use (rotated on every use), as strict servers do."""

    def __init__(self, policy: TokenPolicy) -> None:
        if policy.client_auth not in CLIENT_AUTH:
            raise ValueError(f"client_auth {policy.client_auth!r} is not one of {CLIENT_AUTH}")
        self.policy = policy
        self._lock = threading.Lock()
        self.access: dict[str, tuple[float, frozenset[str], str]] = {}  # token -> (expires, scopes, client)
        self._refresh = {policy.refresh_token}  # the refresh tokens still valid
        self.issued: list[str] = []  # every token handed out, for tests that look for leaks
        self.methods_seen: list[str] = []  # how each token request authenticated its client

    def lookup(self, token: str) -> tuple[float, frozenset[str], str]:
        with self._lock:
            return self.access.get(token, (0.0, frozenset(), ""))

    def revoke_access_tokens(self) -> None:
        with self._lock:
            self.access.clear()

    def handle(self, headers: Message, form: dict[str, str]) -> dict[str, Any]:
        """The token response for a POST to the endpoint, or TokenRefused."""
        client = self._authenticate(headers, form)
        grant = form.get("grant_type")
        scopes = frozenset(form.get("scope", "").split()) or frozenset(self.policy.scopes)
        if grant not in ("client_credentials", "refresh_token"):
            raise TokenRefused(400, "unsupported_grant_type", "use client_credentials or refresh_token")
        if not scopes <= set(self.policy.scopes):
            raise TokenRefused(400, "invalid_scope", f"this client may have {' '.join(self.policy.scopes)}")
        token, extra = secrets.token_urlsafe(24), {}
        with self._lock:
            if grant == "refresh_token":
                if form.get("refresh_token") not in self._refresh:
                    raise TokenRefused(400, "invalid_grant", "the refresh token is unknown, revoked or already used")
                self._refresh.remove(form["refresh_token"])
                extra["refresh_token"] = secrets.token_urlsafe(24)
                self._refresh.add(extra["refresh_token"])
            self.access[token] = (time.monotonic() + self.policy.token_ttl, scopes, client)
            self.issued += [token, *extra.values()]
        body = {"access_token": token, "token_type": "Bearer", "expires_in": self.policy.token_ttl, **extra}
        return {**body, "scope": " ".join(sorted(scopes))}

    def _authenticate(self, headers: Message, form: dict[str, str]) -> str:
        """The client id, once the client authenticated the way this endpoint accepts."""
        basic = _basic_credentials(headers)
        if basic is not None:
            method, (client, secret) = "client_secret_basic", basic
        elif "client_secret" in form:
            method, client, secret = "client_secret_post", form.get("client_id", ""), form["client_secret"]
        else:
            method, client, secret = "none", form.get("client_id", ""), None
        with self._lock:
            self.methods_seen.append(method)
        allowed = self.policy.client_auth
        if method != allowed and not (allowed == "any" and method != "none"):  # real servers do not say why
            raise TokenRefused(401, "invalid_client", "client authentication failed")
        if client != self.policy.client_id:
            raise TokenRefused(401, "invalid_client", "unknown client or wrong client secret")
        if method != "none" and not hmac.compare_digest(secret or "", self.policy.client_secret):
            raise TokenRefused(401, "invalid_client", "unknown client or wrong client secret")
        return client


def _basic_credentials(headers: Message) -> tuple[str, str] | None:
    scheme, _, encoded = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        client, _, secret = base64.b64decode(encoded).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise TokenRefused(401, "invalid_client", "unreadable Basic credentials") from exc
    return client, secret
