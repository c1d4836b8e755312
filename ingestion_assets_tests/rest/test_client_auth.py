"""OAuth 2 client authentication methods against token endpoints that accept only one: HTTP Basic, the form
body, or a public client; refresh-token rotation under each, also by two clients sharing one token file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ingestion_assets.catalog import CatalogError, load_catalog
from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import (
    AuthError,
    BucketRegistry,
    FileSecretStore,
    OAuth2ClientCredentials,
    OAuth2RefreshToken,
    Secret,
    SecretRef,
)
from ingestion_assets_tests.rest.conftest import StartApi
from ingestion_assets_tests.rest.helpers import ORDERS, Target, assert_equal_to_server, client, resource_requests

SECRET_METHODS = ["client_secret_basic", "client_secret_post"]


def _secret(api: DemoApi) -> Secret:
    return Secret(api.config.client_secret, source="the test's demo config")


def _refresh_ref(api: DemoApi, tmp_path: Path) -> SecretRef:
    store = FileSecretStore(tmp_path / "secrets")
    store.write("refresh_token", api.config.refresh_token)
    return store.ref("refresh_token")


@pytest.mark.parametrize("method", SECRET_METHODS)
def test_client_credentials_by_the_method_the_endpoint_accepts(
    start_api: StartApi, buckets: BucketRegistry, method: str
) -> None:
    api = start_api(client_auth=method)
    auth = OAuth2ClientCredentials(f"{api.url}/oauth/token", api.config.client_id, _secret(api), client_auth=method)
    target = Target()
    with client(api, auth, buckets) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert api.client_auth_seen() == [method]


@pytest.mark.parametrize("method", SECRET_METHODS)
def test_refresh_tokens_rotate_under_each_method(
    start_api: StartApi, buckets: BucketRegistry, tmp_path: Path, method: str
) -> None:
    api = start_api(client_auth=method, token_ttl=0.4)
    ref = _refresh_ref(api, tmp_path)
    auth = OAuth2RefreshToken(f"{api.url}/oauth/token", api.config.client_id, _secret(api), ref, client_auth=method)
    target = Target()
    with client(api, auth, buckets, rate=20.0, burst=1) as rest:  # 14 pages over ~0.7 s: renewed every 0.2 s
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert len(api.client_auth_seen()) >= 3 and set(api.client_auth_seen()) == {method}
    assert ref.read().reveal() in api.issued_tokens()  # the newest rotated token is the one stored


def test_a_public_client_sends_its_id_and_no_secret(
    start_api: StartApi, buckets: BucketRegistry, tmp_path: Path
) -> None:
    api = start_api(client_auth="none", token_ttl=0.4)
    ref = _refresh_ref(api, tmp_path)
    auth = OAuth2RefreshToken(f"{api.url}/oauth/token", api.config.client_id, None, ref)
    assert auth.client_auth == "none"  # the default without a secret
    target = Target()
    with client(api, auth, buckets, rate=20.0, burst=1) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert len(api.client_auth_seen()) >= 3 and set(api.client_auth_seen()) == {"none"}
    credentials = OAuth2ClientCredentials(f"{api.url}/oauth/token", api.config.client_id, None)
    with client(api, credentials, buckets) as rest:
        Target().sync(rest, ORDERS)


@pytest.mark.parametrize(
    ("server", "sent"), [("client_secret_post", "client_secret_basic"), ("none", "client_secret_post")]
)
def test_the_wrong_method_names_the_method_used_and_the_setting(
    start_api: StartApi, buckets: BucketRegistry, server: str, sent: str
) -> None:
    api = start_api(client_auth=server)
    auth = OAuth2ClientCredentials(f"{api.url}/oauth/token", api.config.client_id, _secret(api), client_auth=sent)
    with client(api, auth, buckets) as rest, pytest.raises(AuthError) as raised:
        Target().sync(rest, ORDERS)
    message = str(raised.value)
    assert "invalid_client" in message and f"authenticated by {sent}" in message
    assert "auth.token_endpoint_auth_method" in message
    assert ({"client_secret_basic", "client_secret_post"} - {sent}).pop() in message
    assert api.config.client_secret not in message and not raised.value.transient
    assert len(api.client_auth_seen()) == 1 and resource_requests(api) == []


def test_two_clients_sharing_one_refresh_token_file_never_reuse_a_token(start_api: StartApi, tmp_path: Path) -> None:
    """Two processes (here: two clients with their own state) rotate one stored token: each waits for the
    other's write, then spends the newest one; a token sent twice would be refused with invalid_grant."""
    api = start_api(token_ttl=0.3)
    errors: list[BaseException] = []
    targets = [Target(), Target()]

    def sync(target: Target) -> None:
        ref = FileSecretStore(tmp_path / "secrets").ref("refresh_token")
        auth = OAuth2RefreshToken(f"{api.url}/oauth/token", api.config.client_id, _secret(api), ref)
        try:
            with client(api, auth, BucketRegistry(), rate=20.0, burst=1) as rest:
                target.sync(rest, ORDERS)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    _refresh_ref(api, tmp_path)
    threads = [threading.Thread(target=sync, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for target in targets:
        assert_equal_to_server(target, api)
    assert len(api.client_auth_seen()) >= 6  # both renewed several times, one after the other


def test_the_catalog_refuses_a_public_client_with_a_secret(tmp_path: Path) -> None:
    auth = (
        "{type: oauth2_client_credentials, token_url: /t, client_id: {env: ID}, client_secret: {env: S}, "
        "token_endpoint_auth_method: none}"
    )
    path = tmp_path / "catalog.yaml"
    path.write_text(
        f"sources:\n  crm:\n    type: rest\n    base_url: http://x\n    auth: {auth}\n"
        "    streams: {contacts: {path: /c, primary_key: id}}\n"
    )
    with pytest.raises(CatalogError, match=r"sources\.crm\.auth: .*public client.*drop client_secret"):
        load_catalog(path)
