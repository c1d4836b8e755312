"""The catalog of HTTP API sources: base URL, auth, request governor, and one stream per endpoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ingestion_assets.catalog.base import DeadLetters, Freshness, Reference, Retries, Tls, _Model, as_list, valid_cron


class RestAuth(_Model):
    """Credentials by reference (the OAuth client id, no secret, may be a literal). `oauth2_refresh_token`
    writes a rotated refresh token back to its file."""

    type: Literal["none", "api_key", "bearer", "oauth2_client_credentials", "oauth2_refresh_token"] = "none"
    token: Reference | None = Field(None, description="api_key / bearer: the key or token")
    header: str = Field("X-API-Key", description="api_key: the header that carries it")
    token_url: str | None = Field(None, description="oauth2: token endpoint, absolute or relative to base_url")
    client_id: str | Reference | None = Field(
        None, description="oauth2: the client id, a literal (it is no secret: errors name it) or a reference"
    )
    client_secret: Reference | None = None
    refresh_token: Reference | None = Field(None, description="oauth2_refresh_token: a `file` reference")
    scope: str | None = None
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none"] | None = Field(
        None,
        description="oauth2: how the client authenticates to the token endpoint (RFC 6749 §2.3.1): HTTP Basic, "
        "id and secret in the form body, or a public client (id only); default Basic with a secret, else none",
    )

    @model_validator(mode="after")
    def _complete(self) -> RestAuth:
        needs = {
            "api_key": ["token"],
            "bearer": ["token"],
            "oauth2_client_credentials": ["token_url", "client_id"]
            + ([] if self.token_endpoint_auth_method == "none" else ["client_secret"]),
            "oauth2_refresh_token": ["token_url", "client_id", "refresh_token"],
        }.get(self.type, [])
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"auth type {self.type} needs {', '.join(missing)}")
        if self.type == "oauth2_refresh_token" and self.refresh_token and not self.refresh_token.file:
            raise ValueError("a rotating refresh token must be a `file` reference: the new token is written back")
        method = self.token_endpoint_auth_method
        if method == "none" and self.client_secret is not None:
            raise ValueError("token_endpoint_auth_method none (a public client) sends no secret: drop client_secret")
        if method in ("client_secret_basic", "client_secret_post") and self.client_secret is None:
            raise ValueError(f"token_endpoint_auth_method {method} needs client_secret")
        return self


class RateLimit(_Model):
    """The request governor: a token bucket per credential, shared by every stream using it."""

    requests_per_second: Annotated[float, Field(gt=0)] = 5.0
    burst: Annotated[int, Field(gt=0)] = 5


class HttpRetries(_Model):
    max_attempts: Annotated[int, Field(ge=1)] = 6
    max_elapsed_seconds: Annotated[float, Field(gt=0)] = 300.0
    max_rate_limited_seconds: Annotated[float, Field(gt=0)] = 900.0


class Pagination(_Model):
    style: Literal["cursor", "link", "page", "offset", "after_id", "single"] = "cursor"
    token_path: str = Field("next_cursor", description="cursor: where the next token is in the JSON body")
    token_param: str = Field("cursor", description="cursor: the request parameter that carries it")
    size_param: str = "limit"
    page_param: str = "page"
    offset_param: str = "offset"
    after_param: str = Field("starting_after", description="after_id: the parameter carrying the last record's id")
    has_more_path: str = Field("has_more", description="after_id: where the body says whether more pages follow")
    id_field: str | None = Field(
        None, description="after_id: the record field sent in after_param; default: the stream's primary key"
    )


class DeletionMarker(_Model):
    """A record whose `field` holds one of `values` says the record was deleted (a tombstone in the feed)."""

    field: str
    values: list[bool | int | str] = Field(default=[True], min_length=1)


class KeyListing(_Model):
    """Every key the API still serves, read on a cadence: target keys it no longer lists were deleted."""

    path: str | None = Field(None, description="a keys endpoint; default: the stream's own path, read in full")
    records_path: str | None = Field(None, description="default: the stream's")
    page_size: Annotated[int, Field(gt=0)] | None = Field(None, description="default: the stream's")
    params: dict[str, str | int] = Field(default_factory=dict)
    every_hours: Annotated[float, Field(ge=0)] = Field(24.0, description="0: after every run")
    max_retire_share: Annotated[float, Field(gt=0, le=1)] = Field(
        0.5, description="a listing that would retire more of the target than this is refused (a broken listing)"
    )


class RestDeletes(_Model):
    """How deletions reach the target: a marker in the records, a periodic key listing, or both."""

    mode: Literal["hard", "soft"] = Field("soft", description="soft: keep the last values, set _ingest_deleted_at")
    marker: DeletionMarker | None = None
    key_listing: KeyListing | None = None

    @model_validator(mode="after")
    def _something(self) -> RestDeletes:
        if self.marker is None and self.key_listing is None:
            raise ValueError("deletes needs a `marker`, a `key_listing` or both (else no deletion is ever seen)")
        return self


class RestStream(_Model):
    path: str = Field(description="e.g. /v1/orders")
    records_path: str = Field("data", description="dotted path to the records in the JSON body; '' for a list")
    primary_key: list[str] = Field(min_length=1)
    cursor: str | None = Field("updated_at", description="the record field that orders changes; None: full reads")
    cursor_param: str | None = Field("updated_since", description="the request parameter filtering by cursor >=")
    overlap_seconds: Annotated[float, Field(ge=0)] = 0.0
    pagination: Pagination = Field(default_factory=lambda: Pagination())
    page_size: Annotated[int, Field(gt=0)] = 100
    pages_per_slice: Annotated[int, Field(gt=0)] = 10
    read_ahead_pages: Annotated[int, Field(gt=0)] = Field(
        100, description="pages fetched ahead while slices load (memory: this many pages at most)"
    )
    max_pages_per_slice: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="a slice also takes pages already waiting, up to this many: a loader slower than the API "
        "catches up with fewer loads, at the cost of larger re-reads after a crash (default: pages_per_slice)",
    )
    gather_seconds: Annotated[float, Field(ge=0)] = Field(
        10.0,
        description="while pages are read ahead, a slice waits up to this long for the read-ahead queue to fill "
        "or the read to end before it loads, leaving the page reader the CPU (0: load as soon as "
        "pages_per_slice pages wait)",
    )
    params: dict[str, str | int] = Field(default_factory=dict)
    write_disposition: Literal["merge", "append"] = "merge"
    max_table_nesting: Annotated[int, Field(ge=0)] = 1
    retries: Retries = Field(default_factory=lambda: Retries())
    dead_letters: DeadLetters = Field(default_factory=lambda: DeadLetters())
    drain_seconds: Annotated[float, Field(gt=0)] = 60.0
    deletes: RestDeletes | None = None
    freshness: Freshness | None = Field(None, description="{max_lag, warn_lag}: how stale the stream may be")

    _listify = field_validator("primary_key", mode="before")(as_list)

    @model_validator(mode="after")
    def _after_id_has_an_id(self) -> RestStream:
        if self.pagination.style == "after_id" and self.pagination.id_field is None and len(self.primary_key) != 1:
            raise ValueError(
                f"pagination style after_id sends one record field's value, and primary_key has "
                f"{len(self.primary_key)} ({', '.join(self.primary_key)}): set pagination.id_field"
            )
        return self

    @property
    def slice_rows(self) -> int:
        return self.page_size * self.pages_per_slice

    # what the shared runner asks of every stream (schema_policy: the tables' policies, on the records' fields)
    partitions: None = None
    partition_column: None = None
    reconcile: Literal["off"] = "off"
    schema_policy: Literal["evolve", "propagate", "columns_only", "pause", "ignore"] = "evolve"


class RestSource(_Model):
    type: Literal["rest"]
    base_url: str | Reference = Field(description="the API root; a literal URL or a reference")
    auth: RestAuth = Field(default_factory=lambda: RestAuth())
    tls: Tls | None = Field(None, description="a custom CA bundle and client certificates (https:// only)")
    rate_limit: RateLimit = Field(default_factory=lambda: RateLimit())
    http_retries: HttpRetries = Field(default_factory=lambda: HttpRetries())
    timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    max_concurrency: Annotated[int, Field(gt=0)] = 2
    schedule: str | None = None
    streams: dict[str, RestStream] = Field(min_length=1)

    _cron = field_validator("schedule")(valid_cron)
