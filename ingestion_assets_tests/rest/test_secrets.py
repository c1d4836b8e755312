"""Secrets never show: not in any log record, exception message or repr, through success, faults and failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingestion_assets.sources.rest import (
    ApiError,
    ApiKeyAuth,
    Auth,
    BucketRegistry,
    FileSecretStore,
    OAuth2ClientCredentials,
    OAuth2RefreshToken,
    Secret,
    SecretRef,
)
from ingestion_assets_tests.rest.conftest import CapturedLogs, StartApi
from ingestion_assets_tests.rest.helpers import CUSTOMERS, ORDERS, Target, client


def test_no_secret_appears_in_logs_exceptions_or_reprs(
    start_api: StartApi, buckets: BucketRegistry, tmp_path: Path, logs: CapturedLogs
) -> None:
    api = start_api(token_ttl=1.0, error_rate=0.1, storm_retry_after=0, retry_after="alternate")
    store = FileSecretStore(tmp_path / "secrets")
    store.write("client_secret", api.config.client_secret)
    store.write("refresh_token", api.config.refresh_token)
    store.write("api_key", api.config.api_key)
    token_url = f"{api.url}/oauth/token"
    seen: list[str] = []

    refreshing = OAuth2RefreshToken(token_url, "demo-client", store.ref("client_secret"), store.ref("refresh_token"))
    with client(api, refreshing, buckets, rate=15.0, burst=2) as rest:
        api.fail_next("429", 2)
        Target().sync(rest, ORDERS)  # rotations, 429s, 503s: all logged
        api.fail_next("reset", 2)
        Target().sync(rest, ORDERS)
        seen += [repr(refreshing), refreshing.describe(), repr(rest.auth)]

    failing: list[Auth] = [
        OAuth2ClientCredentials(token_url, "demo-client", Secret("a-wrong-client-secret")),
        OAuth2RefreshToken(token_url, "demo-client", store.ref("client_secret"), _spent(store)),
        ApiKeyAuth(Secret("a-wrong-api-key")),
        OAuth2ClientCredentials(token_url, "demo-client", store.ref("client_secret"), scope="orders:read"),
    ]
    for auth in failing:
        with client(api, auth, buckets) as rest, pytest.raises(ApiError) as raised:
            Target().sync(rest, CUSTOMERS)
        seen += [str(raised.value), repr(raised.value), repr(auth), str(raised.value.__cause__)]
    seen += [repr(store.read("client_secret")), str(store.ref("refresh_token")), repr(store.ref("api_key"))]

    secrets = {
        api.config.client_secret,
        api.config.api_key,
        api.config.refresh_token,
        store.read("refresh_token").reveal(),
        "a-wrong-client-secret",
        "a-wrong-api-key",
        "an-old-refresh-token",
        *api.issued_tokens(),
    }
    assert len(api.issued_tokens()) > 6  # access tokens and rotated refresh tokens
    everything = "\n".join([logs.text(), *seen])
    assert "429" in logs.text() and "503" in logs.text()  # the faults were there to be logged
    assert [s for s in secrets if s in everything] == []


def _spent(store: FileSecretStore) -> SecretRef:
    store.write("old_refresh_token", "an-old-refresh-token")
    return store.ref("old_refresh_token")
