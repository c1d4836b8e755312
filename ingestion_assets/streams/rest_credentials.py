"""Credentials of an API source from the catalog's references: resolved at run time, never logged."""

from __future__ import annotations

from typing import Any

import httpx

from ingestion_assets.catalog import RestAuth
from ingestion_assets.references import reference_path, resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.rest import (
    ApiKeyAuth,
    Auth,
    BearerAuth,
    FileSecretStore,
    NoAuth,
    OAuth2ClientCredentials,
    OAuth2RefreshToken,
    Secret,
)
from ingestion_assets.sources.tls import TlsFiles, http_ssl_context
from ingestion_assets.sources.tls_http import VerifiedTransport


def build_auth(auth: RestAuth, base_url: str, settings: Settings, where: str, tls: TlsFiles | None = None) -> Auth:
    """Credentials from their references; none of them ever reaches a log line or an error message.
    `tls`: the source's CA and client certificate, which the token endpoint is verified with too (a bundle may
    hold several CAs: the API's and an identity provider's)."""

    def secret(name: str) -> Secret | None:
        ref = getattr(auth, name)
        return None if ref is None else Secret(resolve(ref, settings, f"{where}.{name}"), source=ref.describe())

    if auth.type == "none":
        return NoAuth()
    if auth.type == "api_key":
        return ApiKeyAuth(_required(secret("token")), header=auth.header)
    if auth.type == "bearer":
        return BearerAuth(_required(secret("token")))
    assert auth.token_url is not None and auth.client_id is not None
    token_url = auth.token_url if "://" in auth.token_url else base_url.rstrip("/") + "/" + auth.token_url.lstrip("/")
    client_id = auth.client_id
    if not isinstance(client_id, str):
        client_id = resolve(client_id, settings, f"{where}.client_id")
    options: dict[str, Any] = {"scope": auth.scope, "client_auth": auth.token_endpoint_auth_method}
    if tls is not None:
        context = http_ssl_context(tls, f"{where}.token_url")
        options["http"] = httpx.Client(timeout=30.0, transport=VerifiedTransport(context, f"{where}.token_url"))
    if auth.type == "oauth2_client_credentials":
        return OAuth2ClientCredentials(token_url, client_id, secret("client_secret"), **options)
    assert auth.refresh_token is not None
    path = reference_path(auth.refresh_token, settings)
    refresh = FileSecretStore(path.parent).ref(path.name)
    return OAuth2RefreshToken(token_url, client_id, secret("client_secret"), refresh, **options)


def _required(value: Secret | None) -> Secret:
    assert value is not None  # the catalog validated that it is given
    return value
