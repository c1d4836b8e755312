"""Test helpers for the second SQL target (MariaDB on 127.0.0.1:3306) and lake targets (Delta folders)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.loading.sql_targets import STAGING_SUFFIX
from ingestion_assets.state.summary import size_pools
from ingestion_assets_tests.helpers import StreamHarness, normalize

MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}


def use_destination(harness: StreamHarness, destination: dict[str, Any]) -> None:
    """Point the harness's catalog (written by write_catalog) at another destination."""
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    catalog["destination"] = destination
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    size_pools(harness.settings, load_catalog(harness.catalog_path))


@dataclass
class MariaDb:
    """One test's databases on the MariaDB server: the URL's own, and each dataset's (dropped afterwards)."""

    database: str
    url_file: Path
    datasets: list[str] = field(default_factory=list)  # each source's database (and its staging one)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        conn = pymysql.connect(**MARIADB, autocommit=True)
        try:
            yield conn
        finally:
            conn.close()

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement)
            return [tuple(row) for row in cur.fetchall()]

    def rows(self, dataset: str, table: str, columns: Sequence[str], order_by: str) -> list[tuple[Any, ...]]:
        listed = ", ".join(f"`{c}`" for c in columns)
        rows = self.query(f"SELECT {listed} FROM `{dataset}`.`{table}` ORDER BY {order_by}")
        return [tuple(_as_source(v) for v in row) for row in rows]

    def destination(self) -> dict[str, Any]:
        return {"type": "sqlalchemy", "credentials": {"file": str(self.url_file)}}

    def drop(self) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            for name in (self.database, *self.datasets, *(d + STAGING_SUFFIX for d in self.datasets)):
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


def _as_source(value: Any) -> Any:
    """MariaDB's DATETIME holds UTC without a zone: read back as UTC, as the source's timestamptz."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC)
    return normalize(value)


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[MariaDb]:
    name = f"ingest_t_{uuid.uuid4().hex[:10]}"
    try:
        with contextlib.closing(pymysql.connect(**MARIADB)) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
    except pymysql.err.OperationalError as exc:
        pytest.skip(f"no MariaDB on 127.0.0.1:3306: {exc}")
    url_file = tmp_path / "mariadb_url"
    url_file.write_text(f"mysql+pymysql://root:@127.0.0.1:3306/{name}")
    db = MariaDb(name, url_file)
    yield db
    db.drop()


def json_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def delta_rows(url: str, columns: Sequence[str], key: str, storage_options: dict[str, str] | None = None) -> list[Any]:
    """A Delta table's rows (the newest version) in key order, normalized like the source's."""
    from deltalake import DeltaTable

    table = DeltaTable(url, storage_options=storage_options).to_pyarrow_table(columns=list(columns))
    rows = sorted(table.to_pylist(), key=lambda row: row[key])
    return [tuple(normalize(row[c]) for c in columns) for row in rows]


def iceberg_rows(url: str, columns: Sequence[str], key: str) -> list[Any]:
    """A local Iceberg table's rows at its newest snapshot (the newest metadata file), in key order."""
    from pyiceberg.table import StaticTable

    metadata = sorted((Path(url) / "metadata").glob("*.metadata.json"))[-1]
    table = StaticTable.from_metadata(str(metadata)).scan(selected_fields=tuple(columns)).to_arrow()
    rows = sorted(table.to_pylist(), key=lambda row: row[key])
    return [tuple(normalize(row[c]) for c in columns) for row in rows]


def lake_rows(table_format: str, url: str, columns: Sequence[str], key: str) -> list[Any]:
    return (iceberg_rows if table_format == "iceberg" else delta_rows)(url, columns, key)
