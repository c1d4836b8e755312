"""Test helpers: a source schema, a per-test catalog, runs through Dagster, row-by-row comparison."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import psycopg2
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import build_stream_assets, catalog_streams
from ingestion_assets.defs.partitions import dynamic_partitions_name, plan_key_partitions
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import latest_checkpoint
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.state.summary import size_pools
from ingestion_assets.streams.postgres_table import PostgresTableStream

REPO = Path(__file__).resolve().parent.parent
_UTC_MIDNIGHT = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"
NEWEST_ROW = {  # SQL for `newest - g * interval '1 hour'` (g from 1): today's UTC window holds a row, or is empty
    "today": f"({_UTC_MIDNIGHT} + interval '1 hour 1 second')",
    "yesterday": _UTC_MIDNIGHT,
}
META_COLUMNS = (
    "_ingest_extracted_at",
    "_ingest_position",
    "_ingest_generation_id",
    "_ingest_deleted_at",
    "_ingest_meta",
)


@dataclass
class SourceDb:
    url: str
    schema: str

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute("SET TimeZone = 'UTC'")
                cur.execute(f'SET search_path = "{self.schema}", public')
            conn.commit()
            yield conn
        finally:
            conn.close()

    def execute(self, statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            conn.commit()

    def rows(self, table: str, order_by: str) -> list[tuple[Any, ...]]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} ORDER BY {order_by}")
            return [tuple(normalize(v) for v in row) for row in cur.fetchall()]

    def columns(self, table: str) -> list[str]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} LIMIT 0")
            return [d.name for d in cur.description]

    def create_schema(self) -> None:
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE SCHEMA "{self.schema}"')
            conn.commit()
        finally:
            conn.close()

    def drop_schema(self) -> None:
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            conn.commit()
        finally:
            conn.close()


def normalize(value: Any) -> Any:
    """Make source (psycopg2) and target (DuckDB) values comparable without hiding differences."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)  # psycopg2 and DuckDB name UTC differently
    if isinstance(value, uuid.UUID):
        return str(value)  # DuckDB's UUID; psycopg2 gives uuid's text
    return value


def postgres_text(duckdb_text: str | None) -> str | None:
    """DuckDB's text of a date or timestamp as PostgreSQL writes it: `0044-03-15 (BC) 10:00:00` is PostgreSQL's
    `0044-03-15 10:00:00 BC`; everything else (infinity, +00 offsets, microseconds) is already the same."""
    return None if duckdb_text is None else _DUCKDB_BC.sub(r"\1\2 BC", duckdb_text)


_DUCKDB_BC = re.compile(r"(\S+) \(BC\)(.*)")


@dataclass
class StreamHarness:
    """One test's catalog (unique source name), DuckDB file and Dagster runs on the session instance."""

    tmp_path: Path
    home: Path
    instance: dg.DagsterInstance
    source: SourceDb
    source_name: str = field(default_factory=lambda: f"src_{uuid.uuid4().hex[:8]}")
    catalog_path: Path | None = None
    destination: str = "duckdb"
    _logs: dict[int, str] = field(default_factory=dict)

    @property
    def warehouse(self) -> Path:
        return self.tmp_path / "warehouse.duckdb"

    @property
    def settings(self) -> Settings:
        assert self.catalog_path is not None, "call write_catalog first"
        return Settings(home=self.home, catalog_path=self.catalog_path)

    def write_catalog(
        self, streams: dict[str, dict[str, Any]], destination: str = "duckdb", **source_options: Any
    ) -> Path:
        """`destination` postgres: the target is the source database itself, schema = the source name."""
        url_file = self.tmp_path / "source_url"
        url_file.write_text(self.source.url)
        self.destination = destination
        for spec in streams.values():
            if "." not in spec["table"]:
                spec["table"] = f"{self.source.schema}.{spec['table']}"
        catalog = {
            "destination": {"type": "duckdb", "path": str(self.warehouse)}
            if destination == "duckdb"
            else {"type": "postgres", "credentials": {"file": str(url_file)}},
            "sources": {
                self.source_name: {
                    "type": "postgres",
                    "connection": {"file": str(url_file)},
                    **source_options,
                    "streams": streams,
                }
            },
        }
        self.catalog_path = self.tmp_path / "catalog.yaml"
        self.catalog_path.write_text(yaml.safe_dump(catalog))
        size_pools(self.settings, load_catalog(self.catalog_path))  # what `ingest up` does for a catalog
        return self.catalog_path

    def key(self, stream: str) -> dg.AssetKey:
        return dg.AssetKey([self.source_name, stream])

    def materialize(
        self,
        *streams: str,
        raise_on_error: bool = True,
        partition: str | None = None,
        partition_range: tuple[str, str] | None = None,
    ) -> dg.ExecuteInProcessResult:
        assets = build_stream_assets(self.settings, load_catalog(self.settings.catalog_path))
        selection = [self.key(s) for s in streams] if streams else None
        tags = {}
        if partition_range is not None:
            tags = {
                "dagster/asset_partition_range_start": partition_range[0],
                "dagster/asset_partition_range_end": partition_range[1],
            }
        return dg.materialize(
            assets,
            instance=self.instance,
            selection=selection,
            raise_on_error=raise_on_error,
            partition_key=partition,
            tags=tags,
        )

    def stream(self, name: str) -> PostgresTableStream:
        return next(
            s for s in catalog_streams(self.settings, load_catalog(self.settings.catalog_path)) if s.name == name
        )

    def plan_partitions(self, name: str) -> list[str]:
        plan_key_partitions(self.stream(name), self.instance)
        return self.instance.get_dynamic_partitions(dynamic_partitions_name(self.source_name, name))

    def cli_env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "INGEST_HOME": str(self.home),
            "INGEST_CATALOG": str(self.catalog_path),
            "DAGSTER_HOME": str(self.settings.dagster_home),
            **extra,
        }

    def materialize_cli(self, stream: str, *partition_args: str, **extra_env: str) -> subprocess.Popen[bytes]:
        """`dagster asset materialize` in its own process, as CI runs it (returns the running process)."""
        dagster = Path(sys.executable).parent / "dagster"
        command = [
            str(dagster),
            "asset",
            "materialize",
            "-m",
            "ingestion_assets.definitions",
            "--select",
            f"{self.source_name}/{stream}",
            *partition_args,
        ]
        log_path = self.tmp_path / f"cli-{uuid.uuid4().hex[:6]}.log"
        log = log_path.open("wb")
        process = subprocess.Popen(
            command,
            env=self.cli_env(**extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
        self._logs[process.pid] = str(log_path)
        return process

    def wait_ok(self, *processes: subprocess.Popen[bytes], timeout: float = 300) -> None:
        """Wait for CLI runs; a failure shows the end of its log."""
        for process in processes:
            code = process.wait(timeout=timeout)
            if code != 0:
                log = Path(self._logs[process.pid]).read_text()
                lines = [line for line in log.splitlines() if " - DEBUG - " not in line]
                raise AssertionError(f"run exited {code}:\n" + "\n".join(lines[-60:]))

    def log_text(self, process: subprocess.Popen[bytes]) -> str:
        return Path(self._logs[process.pid]).read_text()

    def observations(self, stream: str) -> int:
        """How many checkpoints the stream has written so far (all runs)."""
        return len(self.instance.fetch_observations(self.key(stream), limit=10_000).records)

    def target_count(self, stream: str) -> int:
        return int(self.query_target(f'SELECT count(*) FROM "{self.source_name}"."{stream}"')[0][0])

    def query_source(self, statement: str) -> list[tuple[Any, ...]]:
        with self.source.connect() as conn, conn.cursor() as cur:
            cur.execute(statement)
            return [tuple(row) for row in cur.fetchall()]

    def query_target_if_exists(self, statement: str) -> list[tuple[Any, ...]]:
        """Like query_target; a table that was never created (every row parked) reads as empty."""
        try:
            return self.query_target(statement)
        except (duckdb.CatalogException, psycopg2.errors.UndefinedTable):
            return []

    def query_target(self, statement: str) -> list[tuple[Any, ...]]:
        if self.destination == "postgres":
            with self.source.connect() as conn, conn.cursor() as cur:
                cur.execute(statement)
                return [tuple(row) for row in cur.fetchall()]
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            con.execute("SET TimeZone = 'UTC'")
            return [tuple(row) for row in con.execute(statement).fetchall()]

    def execute_target(self, *statements: str) -> None:
        """Change the target behind the product's back (what reconciliation must notice)."""
        if self.destination == "postgres":
            for statement in statements:
                self.source.execute(statement)
            return
        with duckdb.connect(str(self.warehouse)) as con:
            for statement in statements:
                con.execute(statement)

    def checkpoint(self, stream: str, partition: str | None = None) -> Checkpoint | None:
        return latest_checkpoint(self.instance, self.key(stream), partition)

    def target_rows(
        self,
        stream: str,
        columns: Sequence[str],
        order_by: str,
        json_columns: Sequence[str] = (),
        decimal_text_columns: Sequence[str] = (),
    ) -> list[tuple[Any, ...]]:
        column_list = ", ".join(f'"{c}"' for c in columns)
        rows = self.query_target(f'SELECT {column_list} FROM "{self.source_name}"."{stream}" ORDER BY {order_by}')
        parse_json = json.loads if self.destination == "duckdb" else (lambda v: v)  # psycopg2 parses jsonb
        parsers: dict[int, Any] = {columns.index(c): parse_json for c in json_columns}
        parsers.update({columns.index(c): Decimal for c in decimal_text_columns})
        return [
            tuple(parsers[i](v) if i in parsers and v is not None else normalize(v) for i, v in enumerate(row))
            for row in rows
        ]

    def target_rows_where(
        self, stream: str, columns: Sequence[str], order_by: str, where: str
    ) -> list[tuple[Any, ...]]:
        column_list = ", ".join(f'"{c}"' for c in columns)
        return [
            tuple(normalize(v) for v in row)
            for row in self.query_target(
                f'SELECT {column_list} FROM "{self.source_name}"."{stream}" WHERE {where} ORDER BY {order_by}'
            )
        ]

    def assert_target_equals_source(
        self,
        stream: str,
        table: str,
        order_by: str,
        json_columns: Sequence[str] = (),
        decimal_text_columns: Sequence[str] = (),
    ) -> int:
        """Every source row present once, at its current version, value for value (order_by = the key)."""
        columns = self.source.columns(table)
        expected = self.source.rows(table, order_by)
        actual = self.target_rows(stream, columns, order_by, json_columns, decimal_text_columns)
        key_positions = [columns.index(name.strip()) for name in order_by.split(",")]
        keys = [tuple(row[i] for i in key_positions) for row in actual]
        assert len(keys) == len(set(keys)), "duplicate primary keys in the target"
        assert len(actual) == len(expected), f"target has {len(actual)} rows, source {len(expected)}"
        if expected != actual:
            diff = [(e, a) for e, a in zip(expected, actual, strict=True) if e != a][:5]
            raise AssertionError(f"target differs from source; first differences (source, target): {diff}")
        return len(expected)


def load_daily_events(harness: StreamHarness, reconcile: Any) -> None:
    """`events`: 200 rows ten minutes apart from 2024-01-01 (1-143 on the first day, the rest on the second), read by
    a daily-partitioned stream with `reconcile`; both days loaded."""
    harness.source.execute(
        "CREATE TABLE events (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);"
        "INSERT INTO events SELECT g, 'v' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '10 min' "
        "FROM generate_series(1, 200) g"
    )
    partitions = {"by": "time", "column": "updated_at", "start": "2024-01-01", "granularity": "daily"}
    spec = {"table": "events", "primary_key": "id", "cursor": "updated_at", "partitions": partitions}
    harness.write_catalog({"events": {**spec, "reconcile": reconcile}})
    harness.materialize(partition_range=("2024-01-01", "2024-01-02"))
