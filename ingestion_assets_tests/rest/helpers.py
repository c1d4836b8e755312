"""Helpers for the HTTP API tests: clients for the demo API, a merge like the loader's, rate checks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import (
    Auth,
    BucketRegistry,
    EndpointSpec,
    OAuth2ClientCredentials,
    Page,
    Position,
    RestClient,
    RetryPolicy,
    Secret,
    read_pages,
)

if TYPE_CHECKING:
    from ingestion_assets_tests.helpers import StreamHarness

FAST_RETRY = RetryPolicy(max_attempts=8, base_delay=0.01, max_delay=0.1, max_elapsed_seconds=30.0)
ORDERS = EndpointSpec("/v1/orders", page_size=10)
CUSTOMERS = EndpointSpec("/v1/customers", page_size=10)


def oauth(api: DemoApi, **options: Any) -> OAuth2ClientCredentials:
    secret = Secret(api.config.client_secret, source="the test's demo config")
    return OAuth2ClientCredentials(f"{api.url}/oauth/token", api.config.client_id, secret, **options)


def client(api: DemoApi, auth: Auth, buckets: BucketRegistry, **options: Any) -> RestClient:
    options = {"rate": 500.0, "burst": 50, "retry": FAST_RETRY, "seed": 1, **options}
    return RestClient(api.url, auth, buckets=buckets, **options)


class Target:
    """What the loader does with pages: merge on the primary key, keep the position of the last page."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[str, Any]] = {}
        self.position: Position | None = None
        self.pages: list[Page] = []

    def load(self, pages: Iterable[Page]) -> list[dict[str, Any]]:
        """Merge every page; returns the records read."""
        read: list[dict[str, Any]] = []
        for page in pages:
            self.rows.update({record["id"]: record for record in page.records})
            self.position = page.position
            self.pages.append(page)
            read += page.records
        return read

    def sync(self, rest: RestClient, endpoint: EndpointSpec) -> list[dict[str, Any]]:
        return self.load(read_pages(rest, endpoint, self.position))


def assert_equal_to_server(target: Target, api: DemoApi, resource: str = "orders") -> None:
    server = api.records(resource)
    assert sorted((r["id"], r["updated_at"]) for r in target.rows.values()) == sorted(
        (r["id"], r["updated_at"]) for r in server
    )
    assert target.rows == {r["id"]: r for r in server}  # every field, nested ones included


def resource_requests(api: DemoApi, client_name: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in api.request_log()
        if e["path"].startswith("/v1/") and (client_name is None or e["client"] == client_name)
    ]


def assert_rate_respected(entries: list[dict[str, Any]], rate: float, burst: int) -> None:
    """No window of the server's log holds more requests than a token bucket allows (+1 for arrival jitter)."""
    times = sorted(e["at"] for e in entries)
    for first in range(len(times)):
        for last in range(first + 1, len(times)):
            allowed = burst + rate * (times[last] - times[first]) + 1
            assert last - first + 1 <= allowed, f"{last - first + 1} requests in {times[last] - times[first]:.3f} s"


def write_api_catalog(harness: StreamHarness, api: DemoApi, destination: str = "duckdb", **stream: Any) -> None:
    """A catalog with one stream `orders` on the demo API (OAuth client credentials from secret files);
    `destination` postgres: the target is the test's source database, schema = the source name."""
    from ingestion_assets.state.summary import size_pools

    secrets = harness.tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "client_id").write_text(api.config.client_id)
    (secrets / "client_secret").write_text(api.config.client_secret)
    url_file = harness.tmp_path / "target_url"
    url_file.write_text(harness.source.url)
    harness.destination = destination
    catalog = {
        "destination": {"type": "duckdb", "path": str(harness.warehouse)}
        if destination == "duckdb"
        else {"type": "postgres", "credentials": {"file": str(url_file)}},
        "sources": {
            harness.source_name: {
                "type": "rest",
                "base_url": api.url,
                "auth": {
                    "type": "oauth2_client_credentials",
                    "token_url": "/oauth/token",
                    "client_id": {"file": str(secrets / "client_id")},
                    "client_secret": {"file": str(secrets / "client_secret")},
                    "scope": "orders:read",
                },
                "rate_limit": {"requests_per_second": 50, "burst": 10},
                "http_retries": {"max_attempts": 8, "max_elapsed_seconds": 60},
                "streams": {
                    "orders": {
                        "path": "/v1/orders",
                        "primary_key": "id",
                        "page_size": 20,
                        "pages_per_slice": 3,
                        "retries": {"max_attempts": 1},
                        **stream,
                    }
                },
            }
        },
    }
    harness.catalog_path = harness.tmp_path / "catalog.yaml"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    size_pools(harness.settings, load_catalog(harness.catalog_path))
