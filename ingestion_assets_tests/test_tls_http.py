"""HTTPS sources with a private CA and client certificates: a stream end to end, and each refusal permanent."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets.errors import classify
from ingestion_assets.sources.rest.client import RestClient
from ingestion_assets.sources.tls import TlsError, TlsFiles
from ingestion_assets.stack.certs import Issued, issue, make_ca
from ingestion_assets.state.summary import size_pools
from ingestion_assets_tests.helpers import StreamHarness


@dataclass(frozen=True)
class HttpsApi:
    api: DemoApi
    port: int
    ca: Issued
    client: Issued
    other_ca: Issued

    def url(self, host: str = "localhost", scheme: str = "https") -> str:
        return f"{scheme}://{host}:{self.port}"

    @property
    def files(self) -> TlsFiles:
        return TlsFiles(ca=self.ca.cert, cert=self.client.cert, key=self.client.key)


@pytest.fixture(scope="module")
def https_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsApi]:
    """The demo API behind TLS that requires a client certificate from our CA (its name: localhost only)."""
    folder = tmp_path_factory.mktemp("https-api")
    ca = make_ca(folder, "api-ca")
    server_cert = issue(ca, folder, "api-server", "localhost", hosts=("localhost",))
    client = issue(ca, folder, "api-client", "ingest")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert.cert, server_cert.key)
    context.load_verify_locations(ca.cert)
    context.verify_mode = ssl.CERT_REQUIRED
    api = start_demo_api(customers=35)
    server = api._server
    assert server is not None
    server.socket = context.wrap_socket(server.socket, server_side=True)  # same descriptor: the loop serves TLS
    try:
        yield HttpsApi(api, server.server_address[1], ca, client, make_ca(folder / "other", "other-ca"))
    finally:
        api.stop()


def _fetch(base_url: str, files: TlsFiles) -> dict[str, object]:
    with RestClient(base_url, tls=files, retry=None) as client:
        try:
            return dict(client.request_json("GET", "/v1/customers", {"limit": 5})[1])
        finally:
            assert client.figures.retries == 0  # a certificate problem is never retried


def test_client_reaches_the_api_with_our_ca_and_client_certificate(https_api: HttpsApi) -> None:
    from ingestion_assets.sources.rest.auth import ApiKeyAuth
    from ingestion_assets.sources.rest.secret_store import Secret

    auth = ApiKeyAuth(Secret(https_api.api.config.api_key, source="test"), "X-API-Key")
    with RestClient(https_api.url(), auth, tls=https_api.files) as client:
        body = client.request_json("GET", "/v1/customers")[1]
    assert body["data"] and client.figures.retries == 0


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong_ca", "certificate verify failed"),
        ("wrong_host", "127.0.0.1"),
        ("no_client_certificate", "certificate required"),
        ("plaintext", "plaintext"),
    ],
)
def test_certificate_problems_fail_at_once_with_a_clear_message(https_api: HttpsApi, case: str, expected: str) -> None:
    files, url = https_api.files, https_api.url()
    if case == "wrong_ca":
        files = TlsFiles(ca=https_api.other_ca.cert, cert=files.cert, key=files.key)
    elif case == "wrong_host":
        url = https_api.url(host="127.0.0.1")
    elif case == "no_client_certificate":
        files = TlsFiles(ca=files.ca)
    else:
        url = https_api.url(scheme="http")
    with pytest.raises(TlsError) as caught:
        _fetch(url, files)
    assert expected in str(caught.value).lower() or expected in str(caught.value)
    assert not classify(caught.value).transient


def test_a_server_without_a_protocol_version_we_accept_fails_at_once(https_api: HttpsApi, tmp_path: Path) -> None:
    """A server that offers TLS 1.1 at most (we require 1.2): no retry changes that, so it is permanent and says
    which setting to align (it was a ConnectError, retried with backoff)."""
    from ingestion_assets.demo.api_server import start_demo_api as start

    server_cert = issue(https_api.ca, tmp_path, "legacy-server", "localhost", hosts=("localhost",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert.cert, server_cert.key)
    context.minimum_version, context.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let OpenSSL offer the old versions at all
    legacy = start(customers=3)
    assert legacy._server is not None
    legacy._server.socket = context.wrap_socket(legacy._server.socket, server_side=True)
    try:
        with pytest.raises(TlsError) as caught:
            _fetch(f"https://localhost:{legacy._server.server_address[1]}", https_api.files)
    finally:
        legacy.stop()
    message = str(caught.value)
    assert "TLS handshake with localhost failed" in message and "protocol version" in message, message
    assert "ssl_min_protocol_version" in message and "TLS 1.2 at least" in message, message
    assert not classify(caught.value).transient


@pytest.mark.parametrize("auth", ["api_key", "oauth2"])
def test_api_stream_end_to_end_over_https_with_client_certificate(
    harness: StreamHarness, https_api: HttpsApi, auth: str
) -> None:
    """With OAuth the token endpoint (the same TLS server) is verified with the source's `tls` block too."""
    key_file = harness.tmp_path / "api_key"
    key_file.write_text(https_api.api.config.api_key)
    (harness.tmp_path / "client_id").write_text(https_api.api.config.client_id)
    (harness.tmp_path / "client_secret").write_text(https_api.api.config.client_secret)
    methods = {
        "api_key": {"type": "api_key", "token": {"file": str(key_file)}},
        "oauth2": {
            "type": "oauth2_client_credentials",
            "token_url": "/oauth/token",
            "client_id": {"file": str(harness.tmp_path / "client_id")},
            "client_secret": {"file": str(harness.tmp_path / "client_secret")},
        },
    }
    files = https_api.files
    catalog = {
        "destination": {"type": "duckdb", "path": str(harness.warehouse)},
        "sources": {
            harness.source_name: {
                "type": "rest",
                "base_url": https_api.url(),
                "auth": methods[auth],
                "tls": {
                    "ca": {"file": str(files.ca)},
                    "cert": {"file": str(files.cert)},
                    "key": {"file": str(files.key)},
                },
                "streams": {"customers": {"path": "/v1/customers", "primary_key": "id", "page_size": 10}},
            }
        },
    }
    harness.catalog_path = harness.tmp_path / "catalog.yaml"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    size_pools(harness.settings, _load(harness.catalog_path))
    assert harness.materialize().success
    expected = sorted((r["id"], r["name"]) for r in https_api.api.records("customers"))
    rows = harness.query_target(f'SELECT id, name FROM "{harness.source_name}".customers ORDER BY id')
    assert [tuple(r) for r in rows] == expected and len(expected) == 35


def _load(path: Path) -> object:
    from ingestion_assets.catalog import load_catalog

    return load_catalog(path)


def test_a_private_ca_without_a_tls_block_fails_at_once_naming_the_fix(https_api: HttpsApi) -> None:
    """Without a `tls` block the system's CAs cannot verify the server: permanent, not five retries."""
    with RestClient(https_api.url()) as client:
        with pytest.raises(TlsError, match="needs the source's `tls` block") as raised:
            client.request_json("GET", "/v1/customers", {"limit": 5})
        assert client.figures.retries == 0
    assert not classify(raised.value).transient
