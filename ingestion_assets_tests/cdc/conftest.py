"""A session-wide embedded PostgreSQL 18 with wal_level=logical, the server INGEST_TEST_PG_URL names, and a
fresh schema, slot and publication per test (dropped in finally: slots retain WAL)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets_tests.cdc.sandbox import Sandbox, wal_level


@pytest.fixture(scope="session")
def embedded_cdc_url() -> Iterator[str]:
    """Not under pytest's tmp_path: every pytest session start makes /tmp/pytest-of-<user> private again,
    and then the server's own user could no longer reach its folder to stop it."""
    root = Path(tempfile.mkdtemp(prefix="ingest-cdc-"))
    server = EmbeddedPostgres(root / "pg")
    try:
        yield server.ensure_running().ensure_database("cdc")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["embedded", "system"])
def server_url(request: pytest.FixtureRequest) -> str:
    """Each server under test, whatever its wal_level."""
    if request.param == "embedded":
        return str(request.getfixturevalue("embedded_cdc_url"))
    url = os.environ.get("INGEST_TEST_PG_URL")
    if not url:
        pytest.skip("INGEST_TEST_PG_URL is not set")
    return url


@pytest.fixture
def logical_url(server_url: str) -> str:
    """A server that can decode logically; others are skipped, naming the setting."""
    level = wal_level(server_url)
    if level != "logical":
        pytest.skip(f"wal_level is {level!r} on this server; logical decoding needs wal_level = logical")
    return server_url


@pytest.fixture
def sandbox(logical_url: str) -> Iterator[Sandbox]:
    box = Sandbox(logical_url)
    box.setup()
    try:
        yield box
    finally:
        box.teardown()
