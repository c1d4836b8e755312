"""Credentials: OAuth 2 renewal before expiry and once on 401, refresh-token rotation kept in the secret store, API keys,
and failures that stop at once with a message saying what to check."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import (
    ApiKeyAuth,
    AuthError,
    BearerAuth,
    BucketRegistry,
    EndpointSpec,
    FileSecretStore,
    NotFound,
    OAuth2ClientCredentials,
    OAuth2RefreshToken,
    Secret,
    SecretRef,
    read_pages,
)
from ingestion_assets_tests.rest.conftest import StartApi
from ingestion_assets_tests.rest.helpers import (
    CUSTOMERS,
    ORDERS,
    Target,
    assert_equal_to_server,
    client,
    oauth,
    resource_requests,
)


def token_requests(api: DemoApi) -> list[dict[str, object]]:
    return [e for e in api.request_log() if e["path"] == "/oauth/token"]


def refresh_auth(api: DemoApi, ref: SecretRef) -> OAuth2RefreshToken:
    secret = Secret(api.config.client_secret, source="the test's demo config")
    return OAuth2RefreshToken(f"{api.url}/oauth/token", api.config.client_id, secret, ref)


def test_an_access_token_is_renewed_before_it_expires(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(token_ttl=1.0)
    target = Target()
    with client(api, oauth(api), buckets, rate=6.0, burst=1) as rest:  # 14 pages over ~2.2 s
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert all(e["status"] == 200 for e in resource_requests(api))  # never a 401: renewed ahead of time
    assert len(token_requests(api)) >= 4  # renewed at half the one-second lifetime


def test_a_401_renews_the_token_once_and_the_read_goes_on(api: DemoApi, buckets: BucketRegistry) -> None:
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        reading = read_pages(rest, ORDERS, None)
        target.load([next(reading)])
        api.revoke_access_tokens()  # the API forgets the token well before its expiry
        target.load(reading)
    assert_equal_to_server(target, api)
    statuses = [e["status"] for e in resource_requests(api)]
    assert statuses.count(401) == 1 and len(token_requests(api)) == 2


def test_a_token_rejected_again_after_renewal_fails_at_once(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(token_ttl=-1.0)  # every token is already expired when issued
    with client(api, oauth(api), buckets) as rest, pytest.raises(AuthError) as raised:
        Target().sync(rest, ORDERS)
    message = str(raised.value)
    assert f"GET {api.url}/v1/orders: 401 unauthorized" in message
    assert "OAuth 2 client 'demo-client'" in message and "the test's demo config" in message
    assert len(resource_requests(api)) == 2  # one retry after renewing, not a loop


def test_a_rotated_refresh_token_is_stored_and_a_restarted_client_uses_it(
    start_api: StartApi, buckets: BucketRegistry, tmp_path: Path
) -> None:
    api = start_api(token_ttl=1.0)
    store = FileSecretStore(tmp_path / "secrets")
    store.write("refresh_token", api.config.refresh_token)
    ref = store.ref("refresh_token")
    target = Target()
    with client(api, refresh_auth(api, ref), buckets, rate=6.0, burst=1) as rest:
        target.sync(rest, ORDERS)  # ~2 s with a one-second token: several refreshes, each one rotating
    rotations = len(token_requests(api))
    assert rotations >= 3
    stored = ref.read().reveal()
    assert stored != api.config.refresh_token
    assert (store.path("refresh_token").stat().st_mode & 0o777) == 0o600

    # the first refresh token is spent: reusing it is refused
    reuse = httpx.post(
        f"{api.url}/oauth/token",
        data={"grant_type": "refresh_token", "refresh_token": api.config.refresh_token},
        auth=(api.config.client_id, api.config.client_secret),
    )
    assert reuse.status_code == 400 and reuse.json()["error"] == "invalid_grant"

    # a new process: new client, same store
    api.mutate("orders", updates=5)
    with client(api, refresh_auth(api, store.ref("refresh_token")), BucketRegistry()) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert ref.read().reveal() != stored


def test_a_spent_refresh_token_names_the_file_to_fix(api: DemoApi, buckets: BucketRegistry, tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path)
    store.write("refresh_token", "spent-refresh-token-value")
    with (
        client(api, refresh_auth(api, store.ref("refresh_token")), buckets) as rest,
        pytest.raises(AuthError) as raised,
    ):
        Target().sync(rest, ORDERS)
    message = str(raised.value)
    assert "invalid_grant" in message and str(tmp_path / "refresh_token") in message
    assert "spent-refresh-token-value" not in message
    assert resource_requests(api) == []


def test_a_wrong_client_secret_fails_at_once_naming_the_client(api: DemoApi, buckets: BucketRegistry) -> None:
    secret = Secret("wrong-secret-value", source="env var DEMO_CLIENT_SECRET")
    auth = OAuth2ClientCredentials(f"{api.url}/oauth/token", "demo-client", secret)
    with client(api, auth, buckets) as rest, pytest.raises(AuthError) as raised:
        Target().sync(rest, ORDERS)
    message = str(raised.value)
    assert "'demo-client'" in message and "env var DEMO_CLIENT_SECRET" in message and "invalid_client" in message
    assert "wrong-secret-value" not in message
    assert message.count(f"{api.url}/oauth/token") == 1  # the token URL once (it was repeated)
    assert len(token_requests(api)) == 1 and resource_requests(api) == []


def test_a_missing_scope_fails_at_once_and_says_so(api: DemoApi, buckets: BucketRegistry) -> None:
    with client(api, oauth(api, scope="orders:read"), buckets) as rest, pytest.raises(AuthError) as raised:
        Target().sync(rest, CUSTOMERS)
    message = str(raised.value)
    assert f"GET {api.url}/v1/customers: 403 forbidden" in message
    assert "customers:read" in message and "grant it the scope" in message
    assert len(resource_requests(api)) == 1


def test_a_wrong_path_fails_at_once(api: DemoApi, buckets: BucketRegistry) -> None:
    with client(api, oauth(api), buckets) as rest, pytest.raises(NotFound) as raised:
        Target().sync(rest, EndpointSpec("/v1/order"))
    assert f"GET {api.url}/v1/order: 404 not found" in str(raised.value) and "base URL" in str(raised.value)
    assert len(resource_requests(api)) == 1


def test_an_api_key_reads_its_resource_and_a_wrong_one_fails_at_once(api: DemoApi, buckets: BucketRegistry) -> None:
    target = Target()
    with client(api, ApiKeyAuth(Secret(api.config.api_key)), buckets) as rest:
        target.sync(rest, CUSTOMERS)
    assert_equal_to_server(target, api, "customers")
    assert {e["client"] for e in resource_requests(api)} == {"api-key"}
    wrong = ApiKeyAuth(Secret("not-the-key", source="secret file /run/secrets/crm_key"))
    with client(api, wrong, buckets) as rest, pytest.raises(AuthError) as raised:
        Target().sync(rest, CUSTOMERS)
    assert "X-API-Key" in str(raised.value) and "/run/secrets/crm_key" in str(raised.value)
    assert "not-the-key" not in str(raised.value)


def test_a_static_bearer_token_gets_no_second_try(api: DemoApi, buckets: BucketRegistry) -> None:
    with client(api, BearerAuth(Secret("made-up-token")), buckets) as rest, pytest.raises(AuthError):
        Target().sync(rest, ORDERS)
    assert len(resource_requests(api)) == 1
