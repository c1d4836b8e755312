"""The catalog of file sources: a folder or an fsspec URL, and one stream per glob pattern of CSV, JSON lines or
Parquet files, read incrementally by file."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ingestion_assets.catalog.base import DeadLetters, Freshness, Reference, Retries, _Model, as_list, valid_cron

FORMAT_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
COMPRESSION_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
TIME_TOKENS = {"date", "year", "month", "day", "hour"}
_TOKEN = re.compile(r"\{(\w+)\}")


class PathTimePartitions(_Model):
    """One Dagster partition per hour, day, week or month (UTC). A partition reads either the files whose path
    names a moment in its window (`pattern`, e.g. dt={date}/), or the rows of every file whose `column` is in
    its window (Parquet row groups whose statistics exclude the window are then not read)."""

    by: Literal["time"]
    pattern: str | None = Field(
        None,
        description="where the date is in the path: {date} (YYYY-MM-DD) or {year} {month} {day} {hour}, "
        "e.g. dt={date}/ or year={year}/month={month}/",
    )
    column: str | None = Field(None, description="or: a timestamp column of the rows that places each row")
    start: dt.date
    granularity: Literal["hourly", "daily", "weekly", "monthly"] = "daily"

    @model_validator(mode="after")
    def _one_way(self) -> PathTimePartitions:
        if (self.pattern is None) == (self.column is None):
            raise ValueError(
                "partitions: give `pattern` (files by the date in their path) or `column` (rows by their value), "
                "one of them (with both, a row dated outside its file's partition would belong nowhere)"
            )
        if self.pattern is None:
            return self
        tokens = set(_TOKEN.findall(self.pattern))
        if tokens - TIME_TOKENS:
            raise ValueError(f"partitions.pattern: unknown {sorted(tokens - TIME_TOKENS)}; use {sorted(TIME_TOKENS)}")
        if "date" not in tokens and "year" not in tokens:
            raise ValueError("partitions.pattern needs {date} or {year} (with {month} {day} ...) to date a file")
        if self.granularity == "hourly" and "hour" not in tokens:
            raise ValueError("hourly partitions need {hour} in partitions.pattern")
        return self


class PathKeyPartitions(_Model):
    """Ranges of `chunk` integers in the files' paths (e.g. `customer={key}/`), planned from the listing as
    new numbers appear; a partition reads the files whose number falls in its range."""

    by: Literal["key"]
    pattern: str = Field(description="where the number is in the path: {key}, e.g. shard={key}/")
    chunk: Annotated[int, Field(gt=0)]

    @model_validator(mode="after")
    def _tokens(self) -> PathKeyPartitions:
        if _TOKEN.findall(self.pattern) != ["key"]:
            raise ValueError("partitions.pattern of `by: key` takes exactly one {key}, e.g. shard={key}/")
        return self


class CsvOptions(_Model):
    """How CSV files are written: passed to pyarrow's streaming CSV reader."""

    delimiter: str = Field(",", min_length=1, max_length=1)
    quote_char: str | None = Field('"', description="None: fields are never quoted")
    escape_char: str | None = None
    header: bool = Field(True, description="false: the first line is data; give `column_names`")
    column_names: list[str] | None = Field(None, description="names for a file without a header (or to rename)")
    encoding: str = Field("utf-8", description="the files' text encoding; other encodings are transcoded to UTF-8")
    null_values: list[str] = Field(
        default=[""],
        description="unquoted texts that mean a missing value (default: only an empty field); a quoted value is "
        'never one: "" is the empty string',
    )
    column_types: dict[str, Literal["string", "int64", "float64", "bool", "timestamp", "date"]] = Field(
        default_factory=dict, description="fix a column's type instead of inferring it per file"
    )
    max_row_bytes: Annotated[int, Field(gt=0)] = Field(
        256 << 20,
        description="the longest row (e.g. one huge field) a file may hold; a file with a longer row is parked "
        "naming this setting. A read holds a few blocks of up to this size in memory",
    )

    @model_validator(mode="after")
    def _names_without_header(self) -> CsvOptions:
        if not self.header and not self.column_names:
            raise ValueError("csv.header is false: give csv.column_names (the files carry no names)")
        return self


class FilesStream(_Model):
    path: str = Field(description="glob pattern under the source's url, e.g. orders/*.csv or drops/**/*.parquet")
    format: Literal["csv", "jsonl", "parquet"] | None = Field(None, description="default: from the file suffix")
    compression: Literal["auto", "none", "gzip", "zstd"] = Field("auto", description="auto: from .gz / .zst")
    csv: CsvOptions = Field(default_factory=lambda: CsvOptions())
    primary_key: list[str] = Field(
        default_factory=list,
        description="merge key; empty: every row is keyed by its file and row (_ingest_file, _ingest_file_row)",
    )
    write_disposition: Literal["merge", "append"] = "merge"
    freshness: Freshness | None = Field(None, description="{max_lag, warn_lag}: how stale the stream may be")
    batch_rows: Annotated[int, Field(gt=0)] = Field(65_536, description="rows per Arrow batch read from a file")
    slice_rows: Annotated[int, Field(gt=0)] = Field(
        200_000, description="a slice (one load, one checkpoint) holds at most about this many rows"
    )
    files_per_slice: Annotated[int, Field(gt=0)] = Field(
        50, description="a slice ends after this many whole files (small drops checkpoint file batch by batch)"
    )
    lookback_seconds: Annotated[float, Field(ge=0)] = Field(
        86_400.0,
        description="files whose modified time is up to this far behind the newest read one are still listed "
        "and compared (a late file with an older time is read); older ones are taken as read",
    )
    retries: Retries = Field(default_factory=lambda: Retries())
    dead_letters: DeadLetters = Field(default_factory=lambda: DeadLetters())
    drain_seconds: Annotated[float, Field(gt=0)] = 60.0
    schema_policy: Literal["evolve", "propagate", "columns_only", "pause", "ignore"] = "evolve"

    _listify = field_validator("primary_key", mode="before")(as_list)

    partitions: Annotated[PathTimePartitions | PathKeyPartitions, Field(discriminator="by")] | None = Field(
        None,
        description="backfill chunks by a date or number in the path: {by: time, pattern, start, granularity} "
        "or {by: key, pattern, chunk}; each partition its own checkpoint",
    )
    deletes: Literal["keep", "hard", "soft"] = Field(
        "keep", description="rows of a file deleted at the source: keep them, delete them, or set _ingest_deleted_at"
    )
    reconcile: Literal["off"] = "off"  # what the shared runner asks of every stream

    @property
    def partition_column(self) -> str | None:
        partitions = self.partitions
        return partitions.column if isinstance(partitions, PathTimePartitions) else None


class FilesSource(_Model):
    type: Literal["files"]
    url: str = Field(description="a local folder, file:///folder, or an fsspec URL: s3://bucket/prefix, gs://, az://")
    storage_options: dict[str, str | int | bool | Reference] = Field(
        default_factory=dict,
        description="fsspec options (endpoint_url, region ...); secrets such as key/secret as references",
    )
    schedule: str | None = None
    max_concurrency: Annotated[int, Field(gt=0)] = 2
    streams: dict[str, FilesStream] = Field(min_length=1)

    _cron = field_validator("schedule")(valid_cron)

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, value: str) -> str:
        if "@" in value.split("/", 3)[2 if "://" in value else 0]:
            raise ValueError("the url must not carry credentials: give them in storage_options as references")
        return value
