"""Catalog building blocks shared by every source type: the base model, references, common settings."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Reference(_Model):
    """Where a secret or connection string lives: never the value itself."""

    env: str | None = Field(None, description="name of an environment variable holding the value")
    file: str | None = Field(
        None, description="path of a file holding the value (a mounted secret); `${INGEST_HOME}` expands"
    )
    embedded: str | None = Field(None, description="a database on the embedded PostgreSQL server")
    service: Literal["demo_api"] | None = Field(None, description="a service the project runs: the demo API's URL")

    @model_validator(mode="after")
    def _exactly_one(self) -> Reference:
        given = [k for k in ("env", "file", "embedded", "service") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of `env`, `file`, `embedded` or `service` (a reference, not a value)")
        return self

    def describe(self) -> str:
        """A description safe for logs: it names the reference, never the secret."""
        for kind in ("env", "file", "embedded", "service"):
            if getattr(self, kind):
                return f"{kind}:{getattr(self, kind)}"
        return "(none)"


class Tls(_Model):
    """Verified TLS on a connection: the server's certificate must chain to `ca` and name the host it was
    reached by (libpq sslmode verify-full); `cert` and `key` are this machine's identity (mutual TLS), in
    place of a password. Each is a reference to a PEM file (`file`), or an env var holding a path or PEM text."""

    ca: Reference | None = Field(None, description="CA certificate(s) that signed the server's; unset: the system's")
    cert: Reference | None = Field(None, description="client certificate (PEM) for mutual TLS")
    key: Reference | None = Field(None, description="the client certificate's private key (PEM, unencrypted)")

    @model_validator(mode="after")
    def _cert_with_key(self) -> Tls:
        if (self.cert is None) != (self.key is None):
            raise ValueError("give `cert` and `key` together (a client certificate needs its private key)")
        for name in ("cert", "key", "ca"):
            ref = getattr(self, name)
            if ref is not None and (ref.embedded or ref.service):
                raise ValueError(f"`{name}`: a certificate is a `file` or `env` reference")
        return self


def as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def valid_cron(value: str | None) -> str | None:
    if value is not None:
        from dagster._utils.schedules import is_valid_cron_string

        if not is_valid_cron_string(value):
            raise ValueError(f"{value!r} is not a cron expression like '*/15 * * * *'")
    return value


class Retries(_Model):
    """Failed attempts retry from the last checkpoint with exponential backoff and full jitter."""

    max_attempts: Annotated[int, Field(ge=1)] = 4
    delay_seconds: Annotated[float, Field(ge=0)] = 10.0
    max_no_progress: Annotated[int, Field(ge=1)] = 3


class DeadLetters(_Model):
    """Rows that cannot load wait in `_ingest_dead_letter`; too many of them means a mapping error."""

    on_bad_value: Literal["dead_letter", "null"] = Field(
        "dead_letter", description="park the whole row, or load it with the value nulled (noted in _ingest_meta)"
    )
    max_count: Annotated[int, Field(ge=0)] | None = Field(None, description="stop the stream above this many per run")
    max_share: Annotated[float, Field(ge=0, le=1)] = Field(0.05, description="stop above this share of a run's rows")
    min_rows: Annotated[int, Field(ge=0)] = Field(1000, description="the share applies once a run read this many")
    max_value_bytes: Annotated[int, Field(gt=0)] = Field(16 << 20, description="text, JSON or bytes above: bad value")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def as_duration(value: Any) -> Any:
    """`90s`, `15m`, `2h`, `1d` (or a number of seconds) as a timedelta; anything else is left to pydantic."""
    if isinstance(value, str) and (found := _DURATION.match(value)):
        return dt.timedelta(seconds=float(found.group(1)) * _UNIT_SECONDS[found.group(2)])
    return value


class Freshness(_Model):
    """How far behind its source a stream may fall: shown by Dagster as the asset's freshness policy, enforced
    by the `freshness` check (the last sync and the rows' commit-to-target latency, both within `max_lag`)."""

    max_lag: dt.timedelta = Field(description="`15m`, `2h`, `1d` or seconds: beyond it the stream is stale")
    warn_lag: dt.timedelta | None = Field(None, description="beyond it (and within max_lag) a warning")

    _durations = field_validator("max_lag", "warn_lag", mode="before")(as_duration)

    @model_validator(mode="after")
    def _ordered(self) -> Freshness:
        if self.max_lag <= dt.timedelta(0):
            raise ValueError("max_lag must be positive, e.g. `15m`")
        if self.warn_lag is not None and not dt.timedelta(0) < self.warn_lag < self.max_lag:
            raise ValueError("warn_lag must be positive and below max_lag")
        return self
