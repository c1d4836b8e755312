"""Shared fixtures: one embedded PostgreSQL and one Dagster instance per session, a fresh schema per test."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import pytest
from hypothesis import settings as hypothesis_settings

from ingestion_assets.settings import Settings
from ingestion_assets.stack.instance import bring_up
from ingestion_assets_tests.helpers import SourceDb, StreamHarness

if TYPE_CHECKING:
    from ingestion_assets.demo.api_server import DemoApi
    from ingestion_assets_tests.rest.scripted import ScriptedApi

SOURCE_DATABASE = "source"

# Property tests check behaviour, not speed: a per-example deadline only fails them on a busy machine
# (seen in a clean-clone CI run: the key-range replanning property, 46k ranges, took 272 ms against 200).
hypothesis_settings.register_profile("ingest", deadline=None)
hypothesis_settings.load_profile("ingest")


@pytest.fixture(scope="session")
def home() -> Iterator[Path]:
    """Outside pytest's temporary root: a second pytest session resets that to mode 0700, which would lock
    the server's own system user (when tests run as root) out of its data folder."""
    path = Path(tempfile.mkdtemp(prefix="ingest-test-home-"))
    settings = Settings(home=path, catalog_path=path / "unused.yaml")
    try:
        bring_up(settings)
        settings.embedded.ensure_database(SOURCE_DATABASE)
        yield path
    finally:
        settings.embedded.stop()
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def session_settings(home: Path) -> Settings:
    return Settings(home=home, catalog_path=home / "unused.yaml")


@pytest.fixture(scope="session")
def instance(session_settings: Settings) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(session_settings.dagster_home)) as inst:
        yield inst


def _source_urls(session_settings: Settings) -> dict[str, str | None]:
    return {
        "embedded": session_settings.embedded.url(SOURCE_DATABASE),
        "system": os.environ.get("INGEST_TEST_PG_URL"),
    }


@pytest.fixture(params=["embedded"])
def source_db(request: pytest.FixtureRequest, session_settings: Settings) -> Iterator[SourceDb]:
    """A fresh schema on the embedded server, dropped afterwards."""
    url = _source_urls(session_settings)[request.param]
    if url is None:
        pytest.skip("INGEST_TEST_PG_URL is not set")
    db = SourceDb(url=url, schema=f"t_{uuid.uuid4().hex[:10]}")
    db.create_schema()
    try:
        yield db
    finally:
        db.drop_schema()


@pytest.fixture(params=["embedded", "system"])
def any_source_db(request: pytest.FixtureRequest, session_settings: Settings) -> Iterator[SourceDb]:
    """Like source_db, also against the server INGEST_TEST_PG_URL names (e.g. the system PostgreSQL 15)."""
    url = _source_urls(session_settings)[request.param]
    if url is None:
        pytest.skip("INGEST_TEST_PG_URL is not set")
    db = SourceDb(url=url, schema=f"t_{uuid.uuid4().hex[:10]}")
    db.create_schema()
    try:
        yield db
    finally:
        db.drop_schema()


@pytest.fixture
def harness(
    tmp_path: Path, session_settings: Settings, instance: dg.DagsterInstance, source_db: SourceDb
) -> StreamHarness:
    return StreamHarness(tmp_path=tmp_path, home=session_settings.home, instance=instance, source=source_db)


@pytest.fixture
def harness_on_any(
    tmp_path: Path, session_settings: Settings, instance: dg.DagsterInstance, any_source_db: SourceDb
) -> StreamHarness:
    return StreamHarness(tmp_path=tmp_path, home=session_settings.home, instance=instance, source=any_source_db)


@pytest.fixture
def empty_api() -> Iterator[DemoApi]:
    """The demo API on loopback holding no orders (one customer): a test puts the records it needs."""
    from ingestion_assets.demo.api_server import start_demo_api

    server = start_demo_api(orders=0, customers=1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def scripted_api() -> Iterator[Callable[..., ScriptedApi]]:
    """Start scripted APIs on loopback (`scripted_api(feed=[...])`: pages laid out by the test); all stopped after."""
    from ingestion_assets_tests.rest.scripted import start_scripted_api

    servers = []

    def start(**fields: Any) -> ScriptedApi:
        api, server = start_scripted_api(**fields)
        servers.append(server)
        return api

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
