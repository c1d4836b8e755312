"""The user's stream catalog (YAML): sources, their streams and the destination, validated on load."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_PATTERN = re.compile(r"^[a-z_][a-z0-9_]*$")


class CatalogError(ValueError):
    """The catalog cannot be used; the message names the file, the key path and what is wrong."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"invalid catalog {path}:\n" + "\n".join(f"  - {p}" for p in problems))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Reference(_Model):
    """Where a secret or connection string lives: never the value itself."""

    env: str | None = Field(None, description="name of an environment variable holding the value")
    file: str | None = Field(None, description="path of a file holding the value (e.g. a mounted secret)")
    embedded: str | None = Field(None, description="a database on the embedded PostgreSQL server")

    @model_validator(mode="after")
    def _exactly_one(self) -> Reference:
        given = [k for k in ("env", "file", "embedded") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of `env`, `file` or `embedded` (a reference, not a value)")
        return self

    def describe(self) -> str:
        """A description safe for logs: it names the reference, never the secret."""
        if self.env:
            return f"env:{self.env}"
        if self.file:
            return f"file:{self.file}"
        return f"embedded:{self.embedded}"


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _valid_cron(value: str | None) -> str | None:
    if value is not None:
        from dagster._utils.schedules import is_valid_cron_string

        if not is_valid_cron_string(value):
            raise ValueError(f"{value!r} is not a cron expression like '*/15 * * * *'")
    return value


class TimePartitions(_Model):
    """Backfill chunks by a time column: one Dagster partition per hour, day, week or month (UTC)."""

    by: Literal["time"]
    column: str = Field(description="partition on the cursor column so updated rows move to the newest partition")
    start: dt.date
    granularity: Literal["hourly", "daily", "weekly", "monthly"] = "daily"


class KeyPartitions(_Model):
    """Backfill chunks by integer key ranges of `chunk` keys, plus a `live` partition for changes."""

    by: Literal["key"]
    column: str | None = Field(None, description="an integer column; default: the (single) primary key")
    chunk: Annotated[int, Field(gt=0)]
    live: bool = Field(True, description="add the `live` partition: incremental by cursor over the whole table")


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


SchemaPolicy = Literal["evolve", "propagate", "columns_only", "pause", "ignore"]


class PostgresStream(_Model):
    table: str = Field(description="`schema.table` or `table` (schema public)")
    primary_key: list[str] = Field(min_length=1)
    cursor: list[str] = Field(default_factory=list, description="cursor column(s); empty: full read")
    write_disposition: Literal["merge", "append", "replace"] = "merge"
    slice_rows: Annotated[int, Field(gt=0)] = 250_000
    partitions: Annotated[TimePartitions | KeyPartitions, Field(discriminator="by")] | None = None
    max_partitions_per_run: Annotated[int, Field(gt=0)] | Literal["all"] = Field(
        "all",
        description="`all`: a backfill range is one run (what `dagster asset materialize --partition-range` "
        "needs); N: the UI launches runs of N partitions, in parallel up to the source's pool",
    )
    retries: Retries = Field(default_factory=lambda: Retries())
    drain_seconds: Annotated[float, Field(gt=0)] = 60.0
    schema_policy: SchemaPolicy = Field(
        "evolve",
        description="evolve: add columns, apply widened types, keep dropped ones, pause on incompatible changes; "
        "propagate: apply everything; columns_only: add columns, pause on type changes; pause: pause on any "
        "change; ignore: skip added and dropped columns, pause on type changes",
    )
    dead_letters: DeadLetters = Field(default_factory=lambda: DeadLetters())
    reconcile: Literal["window", "full", "off"] = Field(
        "window", description="after each run compare source and target keys: the run's window, or everything"
    )

    _listify = field_validator("primary_key", "cursor", mode="before")(_as_list)

    @model_validator(mode="after")
    def _partitions_fit(self) -> PostgresStream:
        if self.partitions is None:
            return self
        if self.write_disposition == "replace":
            raise ValueError("a partitioned stream cannot `replace`: each partition is one chunk of the table")
        if isinstance(self.partitions, KeyPartitions):
            if self.partitions.column is None and len(self.primary_key) != 1:
                raise ValueError("key partitions over a composite primary key need `partitions.column`")
            if self.partitions.live and not self.cursor:
                raise ValueError("the `live` key partition needs a `cursor` (or set `partitions.live: false`)")
        return self

    @property
    def partition_column(self) -> str | None:
        if self.partitions is None:
            return None
        return self.partitions.column or self.primary_key[0]

    @field_validator("table")
    @classmethod
    def _table_shape(cls, value: str) -> str:
        if not value or value.count(".") > 1 or "" in value.split("."):
            raise ValueError(f"expected `schema.table` or `table`, got {value!r}")
        return value

    @property
    def schema_name(self) -> str:
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]


class PostgresSource(_Model):
    type: Literal["postgres"]
    connection: Reference
    max_concurrency: Annotated[int, Field(gt=0)] = 4
    schedule: str | None = Field(None, description="cron: when the daemon syncs this source's streams")

    _cron = field_validator("schedule")(_valid_cron)
    streams: dict[str, PostgresStream] = Field(min_length=1)


class Destination(_Model):
    type: Literal["duckdb", "postgres"] = "duckdb"
    path: str | None = Field(None, description="DuckDB file; default INGEST_HOME/warehouse.duckdb")
    memory_limit: str = Field("512MB", description="DuckDB memory_limit while loading (bounded memory)")
    credentials: Reference | None = Field(None, description="connection URL reference for postgres")

    @model_validator(mode="after")
    def _credentials_for_postgres(self) -> Destination:
        if self.type == "postgres" and self.credentials is None:
            raise ValueError("a postgres destination needs `credentials` (a reference: env or file)")
        return self


class Catalog(_Model):
    destination: Destination = Field(default_factory=lambda: Destination())
    sources: dict[str, PostgresSource] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> Catalog:
        for source_name, source in self.sources.items():
            _check_name(("sources", source_name), source_name)
            for stream_name in source.streams:
                _check_name(("sources", source_name, "streams", stream_name), stream_name)
        return self

    def streams(self) -> list[tuple[str, PostgresSource, str, PostgresStream]]:
        return [
            (source_name, source, stream_name, stream)
            for source_name, source in self.sources.items()
            for stream_name, stream in source.streams.items()
        ]


def _check_name(key_path: tuple[str, ...], name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise ValueError(
            f"{'.'.join(key_path)}: name {name!r} must be lower-case letters, digits and underscores "
            "(it becomes a Dagster asset key and a table name)"
        )


def load_catalog(path: Path | str) -> Catalog:
    """Read and validate a catalog file; every problem is reported with its key path."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise CatalogError(path, ["file not found (set INGEST_CATALOG to your catalog's path)"]) from exc
    except UnicodeDecodeError as exc:
        raise CatalogError(path, [f"not UTF-8 text (byte {exc.start}): save the catalog as UTF-8"]) from exc
    except OSError as exc:
        raise CatalogError(path, [f"cannot read it: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        raise CatalogError(path, [f"not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise CatalogError(path, ["the top level must be a mapping with `sources` (and `destination`)"])
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        raise CatalogError(path, [_describe(error) for error in exc.errors()]) from exc


def _describe(error: Any) -> str:
    key_path = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if not key_path:  # whole-catalog checks put the key path in the message
        return message
    if error["type"] == "extra_forbidden":
        message = "unknown key (check its spelling against the README's catalog format)"
    elif error["type"] == "missing":
        message = "required key is missing"
    return f"{key_path}: {message}"
