"""Credentials of an API source from the catalog's references: resolved at run time, never logged."""

from __future__ import annotations

from typing import Any

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


def build_auth(auth: RestAuth, base_url: str, settings: Settings, where: str) -> Auth:
    """Credentials from their references; none of them ever reaches a log line or an error message."""

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
    client_id = resolve(auth.client_id, settings, f"{where}.client_id")
    options: dict[str, Any] = {"scope": auth.scope, "client_auth": auth.token_endpoint_auth_method}
    if auth.type == "oauth2_client_credentials":
        return OAuth2ClientCredentials(token_url, client_id, secret("client_secret"), **options)
    assert auth.refresh_token is not None
    path = reference_path(auth.refresh_token, settings)
    refresh = FileSecretStore(path.parent).ref(path.name)
    return OAuth2RefreshToken(token_url, client_id, secret("client_secret"), refresh, **options)


def _required(value: Secret | None) -> Secret:
    assert value is not None  # the catalog validated that it is given
    return value
