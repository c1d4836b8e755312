"""Helpers for the files tests: a folder of drops with a catalog, a state store in a JSON file (a killed
process's checkpoints survive it), runs of the stream, and the target read back."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import pytest
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams
from ingestion_assets.settings import Settings
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.streams.files import FileSourceStream
from ingestion_assets.streams.runner import PartitionJob, PartitionOutcome
from ingestion_assets_tests.conftest import SOURCE_DATABASE
from ingestion_assets_tests.helpers import SourceDb


@dataclass
class FileStore:
    """The runner's state store in a JSON file, replaced atomically on every commit."""

    path: Path  # the unpartitioned stream's file; a partition's is beside it, named after the partition

    def file(self, partition: str | None) -> Path:
        return self.path if partition is None else self.path.with_name(f"{self.path.stem}.{partition}.json")

    def latest(self, partition: str | None) -> Checkpoint | None:
        path = self.file(partition)
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        return Checkpoint(saved["position"], "test", dt.datetime.now(dt.UTC), saved["seq"], saved["details"])

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None:
        path = self.file(partition)
        seq = (self.latest(partition).storage_id + 1) if path.exists() else 1  # type: ignore[union-attr]
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"position": position, "details": details, "seq": seq}, default=str))
        os.replace(temporary, path)


@dataclass
class Drops:
    """One test's source folder (or URL), catalog, DuckDB target and state."""

    root: Path
    url: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def folder(self) -> Path:
        return self.root / "drops"

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    def catalog(self, **stream: Any) -> Path:
        source = {"type": "files", "url": self.url or str(self.folder), "streams": {"orders": stream}}
        if self.storage_options:
            source["storage_options"] = self.storage_options
        catalog = {"destination": {"type": "duckdb", "path": str(self.warehouse)}, "sources": {"drops": source}}
        path = self.root / "catalog.yaml"
        path.write_text(yaml.safe_dump(catalog))
        return path

    def use_destination(self, destination: dict[str, Any]) -> None:
        """Point the catalog (written by `catalog`) at another destination than the DuckDB file."""
        catalog = yaml.safe_load(self.settings.catalog_path.read_text())
        catalog["destination"] = destination
        self.settings.catalog_path.write_text(yaml.safe_dump(catalog))

    @property
    def settings(self) -> Settings:
        return Settings(home=self.root / "home", catalog_path=self.root / "catalog.yaml")

    def stream(self) -> FileSourceStream:
        streams = catalog_streams(self.settings, load_catalog(self.root / "catalog.yaml"))
        return next(s for s in streams if isinstance(s, FileSourceStream))  # the catalog may hold other kinds

    @property
    def store(self) -> FileStore:
        return FileStore(self.root / "state.json")

    def run(self, partition: str | None = None) -> PartitionOutcome:
        return PartitionJob(self.stream(), self.store, partition, run_id="test").run()

    def write(self, name: str, text: str | bytes, modified: float | None = None) -> Path:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        if modified is not None:
            os.utime(path, (modified, modified))
        return path

    def rows(self, columns: str = "id, name, amount", table: str = "orders") -> list[tuple[Any, ...]]:
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            return con.sql(f"SELECT {columns} FROM drops.{table} ORDER BY 1, 2").fetchall()

    def dead_letters(self) -> list[tuple[str, str]]:
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            return con.sql("SELECT record_key, error FROM drops._ingest_dead_letter ORDER BY 1").fetchall()


def csv_text(rows: list[tuple[Any, ...]], header: str = "id,name,amount") -> str:
    return header + "\n" + "".join(",".join("" if v is None else str(v) for v in row) + "\n" for row in rows)


@dataclass
class Target:
    """A stream's target: the DuckDB file of `drops`, or a schema `drops` on the embedded PostgreSQL."""

    drops: Drops
    url: str | None = None  # PostgreSQL

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.url is None:
            with duckdb.connect(str(self.drops.warehouse), read_only=True) as con:
                return con.sql(sql).fetchall()
        with psycopg2.connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute(sql)
            return [tuple(row) for row in cur.fetchall()]

    def dead_letters(self) -> list[tuple[str, str]]:
        return self.query("SELECT record_key, error FROM drops._ingest_dead_letter ORDER BY 1")

    def column_type(self, column: str) -> str:
        where = f"table_schema = 'drops' AND table_name = 'orders' AND column_name = '{column}'"
        ((kind,),) = self.query(f"SELECT data_type FROM information_schema.columns WHERE {where}")
        return str(kind).lower()


@contextlib.contextmanager
def target_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Target]:
    """A test's target of `kind` (duckdb or postgres: a schema on the embedded server, dropped after)."""
    drops = Drops(tmp_path)
    if kind == "duckdb":
        yield Target(drops)
        return
    settings: Settings = request.getfixturevalue("session_settings")
    db = SourceDb(settings.embedded.url(SOURCE_DATABASE), "drops")
    (tmp_path / "target_url").write_text(db.url)
    try:
        yield Target(drops, db.url)
    finally:
        db.drop_schema()


@pytest.fixture(params=["duckdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Each test that takes it once per target: DuckDB, then PostgreSQL (import it, listed in `__all__`)."""
    with target_of(request.param, tmp_path, request) as found:
        yield found


def target_catalog(target: Target, path: str, **stream: Any) -> None:
    """The catalog of one stream keyed by `id` (unless `stream` says), loading into `target`."""
    target.drops.catalog(path=path, **{"primary_key": "id", **stream})
    if target.url is not None:
        url = target.drops.root / "target_url"
        target.drops.use_destination({"type": "postgres", "credentials": {"file": str(url)}})
