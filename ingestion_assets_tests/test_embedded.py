"""The embedded PostgreSQL: starts once, survives restarts on the same port, is checked without forking."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest

from ingestion_assets.stack.embedded import EmbeddedPostgres


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="ingest-test-pg-"))  # not under pytest's 0700 root: see conftest
    embedded = EmbeddedPostgres(root / "pg").ensure_running()
    try:
        yield embedded
    finally:
        embedded.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_liveness_needs_no_subprocess(server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside Dagster's gRPC code server a fork for another user crashed (SIGSEGV): checks must not fork."""

    def no_fork(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("is_running/ensure_running on a running server must not start a process")

    monkeypatch.setattr(subprocess, "run", no_fork)
    assert server.is_running()
    assert server.ensure_running() is server


def test_a_stale_port_file_does_not_mislead(server: EmbeddedPostgres) -> None:
    real = server.port()
    server.port_file.write_text("1")
    assert server.port() == real
    with psycopg2.connect(server.url()) as conn, conn.cursor() as cur:
        cur.execute("SHOW wal_level")
        assert cur.fetchone() == ("logical",)


def test_a_restart_keeps_the_port_and_the_data(server: EmbeddedPostgres) -> None:
    url = server.ensure_database("keep")
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t AS SELECT 42 AS answer")
    port = server.port()
    server.stop()
    assert not server.is_running()
    server.ensure_running()
    assert server.port() == port
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT answer FROM t")
        assert cur.fetchone() == (42,)


def test_a_storage_restore_refuses_to_roll_back_the_servers_other_databases(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restore recovers the whole server: a source or target database on it (the demo's `{embedded: shop}`)
    lost every write after `--to` while only Dagster's storage was said restored. It is refused first, naming
    them, and nothing is done."""
    from ingestion_assets.cli import main

    with contextlib.closing(psycopg2.connect(server.url())) as conn:
        conn.autocommit = True
        for database in ("dagster", "shop", "warehouse"):
            conn.cursor().execute(f"CREATE DATABASE {database}")
    monkeypatch.setenv("INGEST_HOME", str(server.root.parent))
    monkeypatch.setenv("INGEST_CATALOG", str(server.root.parent / "none.yaml"))
    moment = datetime.now(UTC).isoformat()
    assert main(["storage", "restore", "--to", moment]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refused: the embedded server also holds database(s) shop, warehouse: "), err
    assert f"every write after {moment} too" in err and "pass --include-other-databases" in err, err
    assert server.is_running() and not list(server.root.parent.glob("pg-restored-*"))
