"""Dagster's storage survives its server: a standby promoted mid-backfill, and point-in-time recovery
that replays from older checkpoints and refuses checkpoints newer than the target."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.settings import Settings
from ingestion_assets.stack import durability
from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets.stack.instance import bring_up
from ingestion_assets.stack.restore import RestoreRefused, restore_storage
from ingestion_assets_tests.helpers import SourceDb, StreamHarness

pytestmark = pytest.mark.slow  # each test starts, kills and recovers storage servers (~1-2 min)

ROWS = 12_000
ITEMS = f"""
CREATE TABLE items (id bigint PRIMARY KEY, label text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'new', now() - interval '2 days' + g * interval '1 second' FROM generate_series(1, {ROWS}) g;
"""


@pytest.fixture
def storage_home() -> Iterator[Path]:
    """An installation of its own: its storage server is killed, promoted and restored by the test."""
    home = Path(tempfile.mkdtemp(prefix="ingest-durability-"))
    try:
        yield home
    finally:
        for root in home.glob("pg*"):
            if (root / "data").is_dir():
                with contextlib.suppress(Exception):
                    EmbeddedPostgres(root).stop("immediate")
        shutil.rmtree(home, ignore_errors=True)


def _instance(settings: Settings) -> dg.DagsterInstance:
    bring_up(settings)  # dagster.yaml names whichever server is primary now
    return dg.DagsterInstance.from_config(str(settings.dagster_home))


def _wait(condition: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_standby_promoted_mid_backfill_carries_on(storage_home: Path, source_db: SourceDb, tmp_path: Path) -> None:
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    primary_instance = _instance(settings)
    standby = durability.start_standby(settings.embedded, storage_home)
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction), contextlib.closing(psycopg2.connect(standby.url())) as c:
        c.cursor().execute("CREATE TABLE refused (i int)")  # a standby takes no checkpoints until promoted
    harness = StreamHarness(tmp_path, storage_home, primary_instance, source_db)
    source_db.execute(ITEMS)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 400}
    harness.write_catalog({"items": spec | {"partitions": {"by": "key", "chunk": 4_000}, "retries": {"max_attempts": 1}}})
    keys = harness.plan_partitions("items")
    assert harness.materialize(partition=keys[0]).success
    before = harness.observations("items")
    running = harness.materialize_cli("items", "--partition-range", f"{keys[1]}...{keys[2]}")
    _wait(lambda: harness.observations("items") >= before + 3)  # mid-backfill: some slices checkpointed
    settings.embedded.stop("immediate")  # the storage primary dies
    try:  # the run fails on its next storage write (dagster-postgres retries a while first: do not wait for it)
        assert running.wait(timeout=30) != 0
    except subprocess.TimeoutExpired:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    primary_instance.dispose()

    durability.promote(standby, storage_home)
    assert settings.embedded.root == standby.root
    with _instance(Settings(home=storage_home, catalog_path=harness.catalog_path)) as promoted:
        harness.instance = promoted
        assert harness.checkpoint("items", keys[0]) is not None  # replicated before the crash
        for key in keys:  # the runs resume against the promoted server: unfinished ranges from their checkpoints
            assert harness.materialize(partition=key).success
        assert harness.assert_target_equals_source("items", "items", "id") == ROWS


def _runs(harness: StreamHarness) -> None:
    assert harness.materialize().success
    assert harness.assert_target_equals_source("items", "items", "id") == harness.query_source(
        "SELECT count(*) FROM items"
    )[0][0]


def _moment() -> dt.datetime:
    """A time between two runs' commits (the recovery target compares commit timestamps)."""
    time.sleep(1.0)
    moment = dt.datetime.now(dt.UTC)
    time.sleep(1.0)
    return moment


def test_point_in_time_restore_replays_older_checkpoints_and_refuses_newer_ones(
    storage_home: Path, source_db: SourceDb, tmp_path: Path
) -> None:
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    bring_up(settings)
    archive = durability.archive_for(storage_home)
    durability.enable_archiving(settings.embedded, archive)
    durability.base_backup(settings.embedded, archive)
    harness = StreamHarness(tmp_path, storage_home, _instance(settings), source_db)
    source_db.execute(ITEMS)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 2_000}})
    settings = harness.settings
    _runs(harness)
    first = harness.checkpoint("items")
    after_first = _moment()
    source_db.execute("UPDATE items SET label = 'second', updated_at = now() WHERE id % 5 = 0")
    _runs(harness)
    assert harness.checkpoint("items") != first

    # older checkpoints than the target: allowed; the next run replays from them and the target stays exact
    harness.instance.dispose()
    restored = restore_storage(settings, after_first)
    assert restored.warnings == [] and settings.embedded.root == restored.server.root
    harness.instance = _instance(settings)
    replayed_from = harness.checkpoint("items")
    assert replayed_from is not None and first is not None and replayed_from.position == first.position
    source_db.execute("UPDATE items SET label = 'third', updated_at = now() WHERE id % 7 = 0")
    _runs(harness)
    durability.base_backup(settings.embedded, archive)  # a new timeline: back it up

    # checkpoints newer than the target: refused, nothing changed
    copy = tmp_path / "target-copy.duckdb"
    shutil.copy(harness.warehouse, copy)  # the target's own restore point
    source_db.execute("UPDATE items SET label = 'fourth', updated_at = now() WHERE id % 3 = 0")
    _runs(harness)
    after_fourth = _moment()
    shutil.copy(copy, harness.warehouse)  # the target is restored to its older copy
    active = settings.embedded.root
    with pytest.raises(RestoreRefused, match=r"items: the restored checkpoint counts \d+ committed slices, the target"):
        restore_storage(settings, after_fourth)
    assert settings.embedded.root == active and settings.embedded.is_running()
    assert not [p for p in storage_home.glob("pg-restored-*") if p != active]  # the trial copy is gone
    harness.instance.dispose()
