"""The catalog's `destination`: DuckDB, PostgreSQL, MariaDB/MySQL (sqlalchemy), a lake (filesystem) or any dlt one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from ingestion_assets.catalog.base import Reference, Tls, _Model

DestinationType = Literal["duckdb", "postgres", "sqlalchemy", "filesystem", "dlt"]
TESTED_SQLALCHEMY = ("mysql", "mariadb")  # dialects the test suite loads into (MariaDB 10.11)
_URL_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")


class Destination(_Model):
    type: DestinationType = "duckdb"
    path: str | None = Field(None, description="DuckDB file; default INGEST_HOME/warehouse.duckdb")
    memory_limit: str = Field("512MB", description="DuckDB memory_limit while loading (bounded memory)")
    credentials: Reference | None = Field(
        None,
        description="a reference to the connection URL (postgres, sqlalchemy, dlt) or to a JSON object of dlt "
        "credentials (filesystem: aws_access_key_id, aws_secret_access_key, endpoint_url, ...; dlt)",
    )
    tls: Tls | None = Field(None, description="postgres: verify-full TLS and client certificates")
    naming: Literal["snake_case", "direct"] = Field(
        "snake_case",
        description="target column names: snake_case (dlt's default: `Order ID` -> `order_id`) or direct (the "
        "source's names kept exactly: case, spaces, unicode)",
    )
    bucket_url: str | None = Field(
        None, description="filesystem: a local folder or an fsspec URL (s3://, gs://, az://)"
    )
    table_format: Literal["delta", "iceberg", "parquet"] = Field(
        "delta", description="filesystem: Delta (merge on the key), Iceberg, or plain Parquet files (append/replace)"
    )
    name: str | None = Field(None, description="dlt: the dlt destination's name (snowflake, bigquery, clickhouse ...)")
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="dlt: settings passed to the destination as they are (never secrets)"
    )

    @model_validator(mode="after")
    def _required_per_type(self) -> Destination:
        if self.type in ("postgres", "sqlalchemy") and self.credentials is None:
            raise ValueError(f"a {self.type} destination needs `credentials` (a reference: env or file)")
        if self.type == "filesystem" and not self.bucket_url:
            raise ValueError("a filesystem destination needs `bucket_url` (a folder or an s3://, gs://, az:// URL)")
        if self.tls is not None and self.type != "postgres":  # refused, not ignored: no plaintext load by surprise
            raise ValueError(
                "`tls` applies to a postgres destination"
                + (
                    " (a DuckDB file is opened locally)"
                    if self.type == "duckdb"
                    else f" (a {self.type} destination takes its TLS settings from its own URL or credentials)"
                )
            )
        if self.type == "dlt" and not self.name:
            raise ValueError("a dlt destination needs `name` (the dlt destination: snowflake, bigquery ...)")
        if self.type == "dlt" and self.name in ("duckdb", "postgres", "sqlalchemy", "filesystem"):
            raise ValueError(f"destination.name: use `type: {self.name}` for {self.name!r}, which is built in")
        if self.type == "dlt" and self.name == "ducklake":
            raise ValueError(
                "destination.name: dlt's `ducklake` destination does not work with the DuckDB installed here (its "
                "client calls a relation's fetchone(), which DuckDB 2 removed): use `type: duckdb`, or a lake "
                "(`type: filesystem`, table_format: delta or iceberg)"
            )
        unused = [key for key in ("bucket_url", "name") if getattr(self, key) and not _uses(self.type, key)]
        if self.options and self.type != "dlt":
            unused.append("options")
        if unused:
            raise ValueError(f"destination: {', '.join(unused)} do not apply to a {self.type} destination")
        return self

    def refused_streams(self, streams: Sequence[tuple[str, Any, str, Any]]) -> list[str]:
        """(source name, source, stream name, stream) entries this destination cannot load, each with what to do.

        Plain Parquet has no commit to merge into: appending each version instead would double every updated row
        in what readers see, without saying so. A data engineer choosing plain files expects append or replace;
        a merging stream (the default) or a change log is refused here, at catalog load and `ingest check`."""
        if not (self.type == "filesystem" and self.table_format == "parquet"):
            return []
        problems = [_files_deletes_refused(s, n) for s, so, n, st in streams if _deletes(so, st)]
        for source_name, source, stream_name, stream in streams:
            cdc = getattr(source, "mode", None) == "cdc"
            if cdc or getattr(stream, "write_disposition", "merge") == "merge":
                why = "reads a change log" if cdc else "merges on its primary key (write_disposition: merge)"
                problems.append(
                    f"stream {source_name}.{stream_name} {why}, which plain Parquet files cannot do: use "
                    "`table_format: delta` or `iceberg`, or give the stream `write_disposition: append` (every "
                    "version kept as a row; the newest has the highest _ingest_position) or `replace`"
                )
        return problems

    @property
    def is_lake(self) -> bool:
        """Tables as files (Delta, Iceberg, Parquet): no SQL engine to run our own statements in."""
        return self.type == "filesystem"

    @property
    def landing(self) -> Literal["duckdb", "postgres"]:
        """Which landing of PostgreSQL values the destination takes (sources/postgres/landing.py): PostgreSQL's
        own types; exact text for what has no native equal (SQL targets other than DuckDB); or Arrow-native
        lists and intervals (DuckDB, and lakes, whose Parquet holds lists)."""
        return "postgres" if self.type in ("postgres", "sqlalchemy", "dlt") else "duckdb"

    @property
    def is_local_path(self) -> bool:
        return self.bucket_url is not None and (
            self.bucket_url.startswith("file://") or not _URL_SCHEME.match(self.bucket_url)
        )


def _deletes(source: Any, stream: Any) -> bool:
    """A files stream that retires the rows of files gone from the source (`deletes: hard | soft`)."""
    return getattr(source, "type", None) == "files" and getattr(stream, "deletes", None) in ("hard", "soft")


def _files_deletes_refused(source_name: str, stream_name: str) -> str:
    """Plain Parquet files have no commit to delete or flag rows in: refused at catalog load rather than failing
    every run after `ingest check` passed."""
    return (
        f"stream {source_name}.{stream_name} has `deletes: hard|soft` (rows of files gone from the source retired), "
        "which plain Parquet files cannot do: set `deletes: keep` (the default: the rows stay), or use "
        "`table_format: delta` or `iceberg`"
    )


def _uses(kind: str, key: str) -> bool:
    return (kind, key) in (("filesystem", "bucket_url"), ("dlt", "name"))
