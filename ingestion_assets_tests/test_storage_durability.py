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
from ingestion_assets.sources.postgres.cdc import drop_slot
from ingestion_assets.stack import durability
from ingestion_assets.stack.embedded import EmbeddedPostgres, EmbeddedServerError
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
    with (
        pytest.raises(psycopg2.errors.ReadOnlySqlTransaction),
        contextlib.closing(psycopg2.connect(standby.url())) as c,
    ):
        c.cursor().execute("CREATE TABLE refused (i int)")  # a standby takes no checkpoints until promoted
    harness = StreamHarness(tmp_path, storage_home, primary_instance, source_db)
    source_db.execute(ITEMS)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 400}
    harness.write_catalog(
        {"items": spec | {"partitions": {"by": "key", "chunk": 4_000}, "retries": {"max_attempts": 1}}}
    )
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
    assert (
        harness.assert_target_equals_source("items", "items", "id")
        == harness.query_source("SELECT count(*) FROM items")[0][0]
    )


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
    harness.write_catalog(
        {"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 2_000}}
    )
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


def test_restore_compares_each_key_partition_with_the_target(
    storage_home: Path, source_db: SourceDb, tmp_path: Path
) -> None:
    """A key-partitioned stream has a checkpoint and a target record per partition and none unpartitioned:
    each partition is compared with its own (the newest checkpoint of any partition was compared with a
    record the stream does not have, and every restore was refused)."""
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    bring_up(settings)
    archive = durability.archive_for(storage_home)
    durability.enable_archiving(settings.embedded, archive)
    durability.base_backup(settings.embedded, archive)
    harness = StreamHarness(tmp_path, storage_home, _instance(settings), source_db)
    source_db.execute(ITEMS)
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 2_000}
    harness.write_catalog({"items": spec | {"partitions": {"by": "key", "chunk": ROWS // 2}}})
    settings = harness.settings
    keys = harness.plan_partitions("items")

    def runs(label: str | None) -> dict[str, object]:
        if label is not None:
            source_db.execute(f"UPDATE items SET label = '{label}', updated_at = now() WHERE id % 3 = 0")
        assert harness.materialize(partition_range=(keys[0], keys[-1])).success
        assert harness.assert_target_equals_source("items", "items", "id") == ROWS
        found = {key: harness.checkpoint("items", key) for key in keys}
        return {key: checkpoint.position for key, checkpoint in found.items() if checkpoint is not None}

    first = runs(None)
    assert len(first) == len(keys) >= 2
    after_first = _moment()
    older_target, newer_target = tmp_path / "after-first.duckdb", tmp_path / "after-second.duckdb"
    shutil.copy(harness.warehouse, older_target)  # the target's own restore point
    second = runs("second")
    assert second != first
    after_second = _moment()
    harness.instance.dispose()

    # the target restored to its older copy, the storage to after the second runs: every partition is ahead
    shutil.copy(harness.warehouse, newer_target)
    shutil.copy(older_target, harness.warehouse)
    active = settings.embedded.root
    with pytest.raises(RestoreRefused) as refused:
        restore_storage(settings, after_second, timeout=120)
    message = str(refused.value)
    for key in keys:
        assert f"items partition {key}: the restored checkpoint counts" in message, message
    assert "items: " not in message, message  # a partitioned stream has no checkpoint of its own to compare
    assert settings.embedded.root == active

    # the storage restored to before the target's state: allowed, each partition replays from its checkpoint
    shutil.copy(newer_target, harness.warehouse)
    restored = restore_storage(settings, after_first, timeout=120)
    assert restored.warnings == [] and settings.embedded.root == restored.server.root
    harness.instance = _instance(settings)
    assert {key: harness.checkpoint("items", key).position for key in keys} == first  # type: ignore[union-attr]
    runs("third")
    harness.instance.dispose()


def test_a_restore_behind_a_cdc_slot_warns_and_the_next_run_meets_a_wal_gap(
    storage_home: Path, source_db: SourceDb, tmp_path: Path
) -> None:
    """The storage goes back to before the second CDC run, the slot does not: the changes between the restored
    checkpoint and the slot's acknowledged position are gone from it. The restore names the source and the
    slot; the next run stops (on_wal_gap: fail) instead of carrying on from the slot, or copies again (resync)."""
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    bring_up(settings)
    archive = durability.archive_for(storage_home)
    durability.enable_archiving(settings.embedded, archive)
    durability.base_backup(settings.embedded, archive)
    harness = StreamHarness(tmp_path, storage_home, _instance(settings), source_db)
    slot = f"ingest_{harness.source_name}"
    source_db.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO orders (id, status) SELECT g, 'new' FROM generate_series(1, 2000) g"
    )

    def cdc_catalog(on_wal_gap: str) -> None:
        harness.write_catalog(
            {"orders": {"table": "orders", "primary_key": "id"}},
            mode="cdc",
            cdc={"max_seconds": 2, "on_wal_gap": on_wal_gap, "retries": {"max_attempts": 1}},
        )

    def exact() -> None:
        columns = source_db.columns("orders")
        target = harness.target_rows_where("orders", columns, "id", "_ingest_deleted_at IS NULL")
        assert target == source_db.rows("orders", "id")

    try:
        cdc_catalog("fail")
        settings = harness.settings
        assert harness.materialize().success  # the snapshot
        after_snapshot = _moment()
        source_db.execute("UPDATE orders SET status = 'shipped', updated_at = now() WHERE id % 4 = 0")
        assert harness.materialize().success  # the changes: the slot is acknowledged past the first checkpoint
        exact()
        harness.instance.dispose()

        restored = restore_storage(settings, after_snapshot, timeout=120)
        assert restored.warnings == []  # the checkpoint is older than the target: allowed
        (gap,) = restored.wal_gaps
        assert f"source {harness.source_name}, slot {slot}:" in gap and "on_wal_gap: fail" in gap, gap
        source_db.execute("UPDATE orders SET status = 'returned', updated_at = now() WHERE id % 10 = 0")

        harness.instance = _instance(settings)
        result = harness.materialize(raise_on_error=False)
        assert not result.success  # not a silent carry-on from the slot's position
        failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
        message = str(failure.step_failure_data.error)
        assert f"the slot {slot} can no longer deliver the changes after the checkpoint" in message, message

        cdc_catalog("resync")
        assert harness.materialize().success  # a fresh snapshot: the target equals the source again
        exact()
    finally:
        with contextlib.suppress(Exception):
            harness.instance.dispose()
        drop_slot(source_db.url, slot)
        source_db.execute(f"DROP PUBLICATION IF EXISTS {slot}")


def _ingest(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> str:
    """`ingest ARGV` on this installation; its output (stdout and stderr), asserting it succeeded."""
    from ingestion_assets.cli import main

    monkeypatch.setenv("INGEST_HOME", str(home))
    status = main(list(argv))
    out = capsys.readouterr()
    assert status == 0, f"ingest {' '.join(argv)} exited {status}: {out.out}{out.err}"
    return out.out + out.err


def _archived_runs(
    storage_home: Path,
    source_db: SourceDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> StreamHarness:
    """`ingest up --archive --standby`, then a first run of a stream into DuckDB."""
    monkeypatch.setenv("INGEST_CATALOG", str(storage_home / "none.yaml"))  # not the demo's: no demo API
    _ingest(monkeypatch, capsys, storage_home, "up", "--archive", "--standby")
    harness = StreamHarness(
        tmp_path, storage_home, _instance(Settings(storage_home, storage_home / "unused.yaml")), source_db
    )
    source_db.execute(ITEMS)
    harness.write_catalog(
        {"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 2_000}}
    )
    monkeypatch.setenv("INGEST_CATALOG", str(harness.catalog_path))
    _runs(harness)
    return harness


def _next_runs(harness: StreamHarness, label: str) -> object:
    harness.source.execute(f"UPDATE items SET label = '{label}', updated_at = now() WHERE id % 5 = 0")
    _runs(harness)
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None
    return checkpoint.position


def test_archiving_goes_on_after_promotion_and_a_restore_reaches_past_it(
    storage_home: Path,
    source_db: SourceDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The promoted standby archives (its timeline as well as the old primary's last segment), so a restore
    to a time after the promotion, from the backup taken before it, replays across the timeline switch."""
    harness = _archived_runs(storage_home, source_db, tmp_path, monkeypatch, capsys)
    harness.instance.dispose()
    _ingest(monkeypatch, capsys, storage_home, "storage", "promote")
    harness.instance = _instance(harness.settings)
    after_promotion = _next_runs(harness, "after promotion")
    moment = _moment()
    assert _next_runs(harness, "later") != after_promotion
    _ingest(monkeypatch, capsys, storage_home, "storage", "backup")
    harness.instance.dispose()

    # a segment the recovery needs is missing: the restore stops and says which, and what it recovered to
    wal = durability.archive_for(storage_home).wal
    crossing = min(p for p in wal.glob("00000002*") if len(p.name) == 24)  # the new timeline's first segment
    crossing.rename(crossing.with_suffix(".aside"))
    active = durability.active_server(storage_home).root
    from ingestion_assets.cli import main

    assert main(["storage", "restore", "--to", moment.isoformat(), "--timeout", "120"]) == 2
    err = capsys.readouterr().err
    assert f"recovery to {moment.isoformat()}" in err and "waits for WAL segment 0000000" in err, err
    assert durability.active_server(storage_home).root == active and not list(storage_home.glob("pg-restored-*"))
    crossing.with_suffix(".aside").rename(crossing)

    out = _ingest(
        monkeypatch, capsys, storage_home, "storage", "restore", "--to", moment.isoformat(), "--timeout", "120"
    )
    assert "restored Dagster's storage" in out
    kept = EmbeddedPostgres(active)  # the promoted standby, now replaced: stopped and kept
    assert f"stopped and kept in {active}" in out and not kept.is_running()
    # refused commands start nothing: not the kept server (the standby folder names it), not the restore's
    for argv in (["storage", "promote"], ["storage", "restore", "--to", "2999-01-01T00:00:00Z"]):
        assert main(argv) == 2
        capsys.readouterr()
    assert main(["storage", "restore", "--to", "2001-01-01T00:00:00Z", "--timeout", "60"]) == 2
    assert "no base backup" in capsys.readouterr().err
    assert not kept.is_running()
    harness.instance = _instance(harness.settings)
    restored = harness.checkpoint("items")
    assert restored is not None and restored.position == after_promotion  # the post-promotion checkpoint
    _next_runs(harness, "after restore")  # replays from it; the target stays exact
    harness.instance.dispose()


def test_a_restore_rebuilds_the_standby_and_a_stale_standby_is_never_promoted(
    storage_home: Path,
    source_db: SourceDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ingestion_assets.cli import main

    harness = _archived_runs(storage_home, source_db, tmp_path, monkeypatch, capsys)
    first = harness.checkpoint("items")
    moment = _moment()
    second = _next_runs(harness, "second")
    harness.instance.dispose()
    out = _ingest(
        monkeypatch, capsys, storage_home, "storage", "restore", "--to", moment.isoformat(), "--timeout", "120"
    )
    assert "rebuilt from the restored primary" in out, out
    _ingest(monkeypatch, capsys, storage_home, "storage", "promote")  # the rebuilt standby follows the restore
    harness.instance = _instance(harness.settings)
    promoted = harness.checkpoint("items")
    assert first is not None and promoted is not None and promoted.position == first.position != second
    harness.instance.dispose()

    # a standby whose primary is no longer the primary (here: another server made primary) is refused
    standby = durability.start_standby(settings_primary := durability.active_server(storage_home), storage_home)
    other = EmbeddedPostgres(storage_home / "pg-other").ensure_running()
    durability.make_active(storage_home, other)
    assert main(["storage", "promote"]) == 2
    err = capsys.readouterr().err
    assert f"follows the server on port {settings_primary.port()}" in err and "roll" in err, err
    assert durability.is_standby(standby) and durability.active_server(storage_home).root == other.root


def _wal_receiver_pid(standby: EmbeddedPostgres) -> int:
    pids: list[int] = []

    def streaming() -> bool:
        with contextlib.closing(psycopg2.connect(standby.url())) as conn, conn.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'")
            pids[:] = [row[0] for row in cur.fetchall()]
        return bool(pids)

    _wait(streaming, 60)
    return pids[0]


def test_a_standby_that_cannot_finish_promoting_is_refused_and_never_left_promoting(
    storage_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A standby whose WAL receiver is frozen while the primary writes: promotion is refused before anything
    stops, naming both positions; a promotion that does not finish is withdrawn and the server stopped (it
    would otherwise finish on its own later: a second primary); `ingest down` stops every server."""
    from ingestion_assets.cli import main

    monkeypatch.setenv("INGEST_CATALOG", str(storage_home / "none.yaml"))
    _ingest(monkeypatch, capsys, storage_home, "up", "--archive", "--standby")
    primary, standby = durability.active_server(storage_home), durability.standby_server(storage_home)
    receiver = _wal_receiver_pid(standby)
    os.kill(receiver, signal.SIGSTOP)
    try:
        with contextlib.closing(psycopg2.connect(primary.url())) as conn, conn.cursor() as cur:
            conn.autocommit = True
            cur.execute("CREATE TABLE written AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 30000) g")
            cur.execute("SELECT pg_current_wal_flush_lsn()::text")
            row = cur.fetchone()
        assert row is not None
        assert main(["storage", "promote"]) == 2
        err = capsys.readouterr().err
        assert "has replayed WAL only up to" in err and "the running primary" in err, err
        assert durability.active_server(storage_home).root == primary.root and primary.is_running()

        primary.stop("immediate")  # the primary is gone: nothing to compare with, and pg_ctl promote hangs
        with pytest.raises(EmbeddedServerError, match="promotion request was withdrawn"):
            durability.promote(standby, storage_home, timeout=5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(receiver, signal.SIGCONT)
    time.sleep(3)  # a pending promotion would finish now
    assert not standby.is_running() and durability.is_standby(standby)
    assert durability.active_server(storage_home).root == primary.root

    primary.ensure_running()
    standby.ensure_running()
    _ingest(monkeypatch, capsys, storage_home, "down")
    assert not [root for root in storage_home.glob("pg*") if EmbeddedPostgres(root).is_running()]


def _mark(settings: Settings, label: str) -> None:
    with contextlib.closing(psycopg2.connect(settings.embedded.url())) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute("CREATE TABLE IF NOT EXISTS marks (label text)")
        cur.execute("INSERT INTO marks VALUES (%s)", (label,))


def _marks(settings: Settings) -> list[str]:
    with contextlib.closing(psycopg2.connect(settings.embedded.url())) as conn, conn.cursor() as cur:
        cur.execute("SELECT label FROM marks ORDER BY label DESC")
        return [row[0] for row in cur.fetchall()]


def test_a_restore_follows_the_timeline_that_was_current_at_its_target(
    storage_home: Path, source_db: SourceDb, tmp_path: Path
) -> None:
    """Restore to T1, then to an earlier T0, then to T1 again: the third recovers T1's state, not the newest
    timeline's (the T0 restore's branch, whose first commit is after T1, would stop it at T0's state)."""
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    bring_up(settings)
    archive = durability.archive_for(storage_home)
    durability.enable_archiving(settings.embedded, archive)
    durability.base_backup(settings.embedded, archive)
    harness = StreamHarness(tmp_path, storage_home, _instance(settings), source_db)
    harness.instance.dispose()
    source_db.execute(ITEMS)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}})
    settings = harness.settings
    _mark(settings, "zero")
    t0 = _moment()
    _mark(settings, "one")
    t1 = _moment()
    _mark(settings, "two")
    for to, expected in ((t1, ["zero", "one"]), (t0, ["zero"]), (t1, ["zero", "one"])):
        restored = restore_storage(settings, to, timeout=120)
        assert settings.embedded.root == restored.server.root
        assert _marks(settings) == expected, f"restored to {to.isoformat()}"


def test_a_restore_rolls_back_the_servers_other_databases_only_when_asked_and_says_so(
    storage_home: Path,
    source_db: SourceDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A source database on the embedded server (the demo's `shop`) is rolled back with Dagster's storage: only
    with --include-other-databases, and the restore says which databases and the server's new port."""
    settings = Settings(home=storage_home, catalog_path=storage_home / "unused.yaml")
    bring_up(settings)
    archive = durability.archive_for(storage_home)
    durability.enable_archiving(settings.embedded, archive)
    durability.base_backup(settings.embedded, archive)
    harness = StreamHarness(tmp_path, storage_home, _instance(settings), source_db)
    source_db.execute(ITEMS)
    monkeypatch.setenv("INGEST_CATALOG", str(harness.write_catalog({"items": {"table": "items", "primary_key": "id"}})))
    harness.instance.dispose()
    old = settings.embedded
    with contextlib.closing(psycopg2.connect(old.url())) as conn:
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE shop")
    with contextlib.closing(psycopg2.connect(old.url("shop"))) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE sales (id int); INSERT INTO sales VALUES (1)")
        conn.commit()
        moment = _moment()
        cur.execute("INSERT INTO sales VALUES (2)")
        conn.commit()
    from ingestion_assets.cli import main

    monkeypatch.setenv("INGEST_HOME", str(storage_home))
    assert main(["storage", "restore", "--to", moment.isoformat()]) == 2
    assert "also holds database(s) shop:" in capsys.readouterr().err
    out = _ingest(
        monkeypatch, capsys, storage_home, "storage", "restore", "--to", moment.isoformat(), "--include-other-databases"
    )
    restored = durability.active_server(storage_home)
    assert f"WARNING: databases shop were rolled back to {moment.isoformat()} as well" in out, out
    assert f"now listens on port {restored.port()}, not {old.port()}" in out, out
    with contextlib.closing(psycopg2.connect(restored.url("shop"))) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM sales")
        assert cur.fetchall() == [(1,)]
