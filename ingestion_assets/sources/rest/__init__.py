"""HTTP API sources (no Dagster import): governed, authenticated, paginated reads checkpointed per page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dlt
from dlt.extract.resource import DltResource

from ingestion_assets.sources.rest.auth import (
    ApiKeyAuth,
    Auth,
    BearerAuth,
    NoAuth,
    OAuth2ClientCredentials,
    OAuth2RefreshToken,
)
from ingestion_assets.sources.rest.client import RestClient
from ingestion_assets.sources.rest.errors import (
    ApiError,
    AuthError,
    BadPayload,
    FieldMissing,
    NotFound,
    NotJson,
    PaginationLoop,
    RateLimited,
    Redirected,
    RetriesExhausted,
)
from ingestion_assets.sources.rest.governor import SHARED_BUCKETS, BucketRegistry, Clock, RetryPolicy, TokenBucket
from ingestion_assets.sources.rest.incremental import (
    PAGE_TOKEN,
    EndpointSpec,
    Page,
    Position,
    missing_everywhere,
    read_pages,
    unusable_field,
)
from ingestion_assets.sources.rest.paginators import PaginationSpec, Paginator
from ingestion_assets.sources.rest.secret_store import FileSecretStore, Secret, SecretRef

__all__ = [
    "PAGE_TOKEN",
    "SHARED_BUCKETS",
    "ApiError",
    "ApiKeyAuth",
    "Auth",
    "AuthError",
    "BadPayload",
    "BearerAuth",
    "BucketRegistry",
    "Clock",
    "EndpointSpec",
    "FieldMissing",
    "FileSecretStore",
    "NoAuth",
    "NotFound",
    "NotJson",
    "OAuth2ClientCredentials",
    "OAuth2RefreshToken",
    "Page",
    "PaginationLoop",
    "PaginationSpec",
    "Paginator",
    "Position",
    "RateLimited",
    "Redirected",
    "RestClient",
    "RetriesExhausted",
    "RetryPolicy",
    "Secret",
    "SecretRef",
    "TokenBucket",
    "missing_everywhere",
    "read_pages",
    "rest_endpoint",
]


def rest_endpoint(client: RestClient, endpoint: EndpointSpec, start: Position | None = None) -> DltResource:
    """Standalone use without Dagster: a dlt resource merging the endpoint's records on its primary key.

    It yields pages without their positions; a caller that checkpoints iterates `read_pages` itself. It has
    no dead-letter table: a record without a usable key or cursor stops the read, named (a stream parks it).
    """

    def pages() -> Iterator[list[dict[str, Any]]]:
        for page in read_pages(client, endpoint, start):
            for record in page.records:
                if (unusable := unusable_field(record, endpoint.primary_key, endpoint.cursor_field)) is not None:
                    setting = "cursor_field" if unusable[0] == "cursor" else "primary_key"
                    raise BadPayload(f"GET {endpoint.path}: {unusable[1]}; check the EndpointSpec's {setting}")
            yield page.records

    return dlt.resource(pages(), name=endpoint.name, primary_key=list(endpoint.primary_key), write_disposition="merge")
