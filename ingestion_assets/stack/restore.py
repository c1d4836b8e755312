"""Point-in-time recovery of Dagster's storage: base backup + archived WAL up to a moment, checked, then primary."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import psycopg2
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.settings import Settings
from ingestion_assets.stack.durability import archive_for, copy_tls, make_active, rebuild_standby
from ingestion_assets.stack.embedded import EmbeddedPostgres, EmbeddedServerError
from ingestion_assets.stack.instance import DAGSTER_DATABASE, bring_up, instance_config
from ingestion_assets.stack.recovery import RestoreRefused, restore_command, start_recovery, wait_for_recovery
from ingestion_assets.stack.restore_check import cdc_slots_past_checkpoints, checkpoints_ahead_of_target
from ingestion_assets.stack.restore_scope import other_databases, refuse_other_databases
from ingestion_assets.stack.timelines import backup_position, recovered_from, timeline_at

__all__ = ["RestoreRefused", "Restored", "restore_storage"]

RECOVERY_CONF = "ingest_recovery.conf"


@dataclass(frozen=True)
class Restored:
    server: EmbeddedPostgres  # the new primary
    backup_started_at: dt.datetime
    previous: Path  # the folder of the server it replaced (kept: delete it once satisfied)
    warnings: list[str]  # with force: the checkpoints that are ahead of the target
    standby: str  # what became of the standby, which followed the replaced server
    wal_gaps: list[str] = field(default_factory=list)  # CDC sources whose slot is past their restored checkpoints
    rolled_back: list[str] = field(default_factory=list)  # the server's other databases, restored to `to` as well
    previous_port: int | None = None  # the replaced server's: URLs naming it reach nothing now


def restore_storage(
    settings: Settings,
    to: dt.datetime,
    force: bool = False,
    timeout: float = 300.0,
    include_other_databases: bool = False,
) -> Restored:
    """Recover the storage as it was at `to` into a new server folder; refuse if any restored checkpoint is
    ahead of what the target holds (the next run would skip rows), unless `force`, and if the server holds
    other databases than Dagster's (they are rolled back too), unless `include_other_databases`. Only then does
    the recovered server replace the current one, which is stopped and kept."""
    if to > dt.datetime.now(dt.UTC):
        raise RestoreRefused(f"{to.isoformat()} is in the future: nothing has been archived up to it yet")
    current = settings.embedded
    archive = archive_for(settings.home)
    others = other_databases(current) if current.is_running() else []
    refuse_other_databases(to, others, include_other_databases)  # before anything is done
    previous_port = current.port() if current.is_running() else None
    if current.is_running():
        _archive_up_to_now(current, timeout)
    earlier = [(started, data) for started, data in archive.backups() if started <= to]
    if not earlier:
        raise RestoreRefused(f"no base backup started before {to.isoformat()} in {archive.base}")
    timeline = timeline_at(archive.wal, to)  # not the newest: a later restore's branch holds another history
    candidates = [(started, data) for started, data in earlier if timeline.holds(*backup_position(data))]
    if not candidates:
        raise RestoreRefused(
            f"no base backup before {to.isoformat()} lies on timeline {timeline.tli}, the one Dagster's storage "
            f"was on then (the backups in {archive.base} before it are on branches a later restore left)"
        )
    started, backup = candidates[-1]
    server = EmbeddedPostgres(settings.home / f"pg-restored-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}")
    server.prepare_root(current.bin_dir())
    try:
        problems, wal_gaps = _recover(settings, server, (backup, timeline.tli), current, to, timeout)
        others = sorted({*others, *other_databases(server)})  # the current server's, if it was stopped
        refuse_other_databases(to, others, include_other_databases)
    except BaseException:
        _discard(server)  # nothing changed: the current server is still primary
        raise
    if problems and not force:
        _discard(server)
        raise RestoreRefused(
            f"restoring the storage to {to.isoformat()} would put checkpoints ahead of the target, and the next "
            "runs would skip the rows in between:\n  " + "\n  ".join(problems) + "\nrestore to a time at or before "
            "the target's own restore point (older checkpoints only replay), or pass --force and reset those streams"
        )
    current.stop()
    make_active(settings.home, server)
    bring_up(settings)
    standby = rebuild_standby(settings.home, server, current)
    return Restored(server, started, current.root, problems, standby, wal_gaps, others, previous_port)


def _recover(
    settings: Settings,
    server: EmbeddedPostgres,
    source: tuple[Path, int],
    current: EmbeddedPostgres,
    to: dt.datetime,
    timeout: float,
) -> tuple[list[str], list[str]]:
    """Replay the archive onto the copy of a backup along timeline `source[1]` up to `to`; the checkpoints the
    result holds that are ahead of the target, and the CDC slots acknowledged past the checkpoints it holds."""
    archive = archive_for(settings.home)
    backup, tli = source
    _copy_backup(backup, server, current)
    target = to.astimezone(dt.UTC).isoformat()
    conf = (
        f"restore_command = '{restore_command(server, archive.wal)}'\n"
        f"recovery_target_time = '{target}'\n"
        f"recovery_target_action = 'promote'\nrecovery_target_timeline = '{tli}'\n"
        "primary_conninfo = ''\n"  # the archive only: never stream from a server the backup's copy still names
    )
    (server.data_dir / RECOVERY_CONF).write_text(conf)
    server.include_conf(RECOVERY_CONF)
    start_recovery(server, target, archive.wal)
    wait_for_recovery(server, target, archive.wal, timeout)
    _check_branched_off(server, tli, target)
    (server.data_dir / RECOVERY_CONF).write_text("# the recovery to the time above is done\n")
    catalog = load_catalog(settings.catalog_path)
    with _instance_on(server, settings) as instance:
        ahead = checkpoints_ahead_of_target(settings, catalog, instance)
        return ahead, cdc_slots_past_checkpoints(settings, catalog, instance)


def _check_branched_off(server: EmbeddedPostgres, tli: int, target: str) -> None:
    """The finished recovery started its new timeline from `tli` (the one current at the target), and its last
    replayed commit is not after the target: else it holds another moment's state."""
    with contextlib.closing(psycopg2.connect(server.url())) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT pg_walfile_name(pg_current_wal_lsn()), pg_last_xact_replay_timestamp() > %s::timestamptz",
            (target,),
        )
        row = cur.fetchone()
    assert row is not None
    parent = recovered_from(server.data_dir, int(str(row[0])[:8], 16))
    if parent != tli or row[1]:
        raise RestoreRefused(
            f"the recovery to {target} did not end on timeline {tli}, the one current then (it branched off "
            f"timeline {parent}{', after a commit later than the target' if row[1] else ''}): nothing was changed"
        )


def _discard(server: EmbeddedPostgres) -> None:
    with contextlib.suppress(EmbeddedServerError):
        server.stop("immediate")
    shutil.rmtree(server.root, ignore_errors=True)


def _archive_up_to_now(server: EmbeddedPostgres, timeout: float) -> None:
    """Close the current WAL segment and wait until the archive holds it: recovery can then reach now."""
    with contextlib.closing(psycopg2.connect(server.url())) as conn, conn.cursor() as cur:
        conn.autocommit = True
        # Recovery to a time stops at the first commit after it, and fails if it meets none: commit one now.
        cur.execute("SELECT txid_current()")
        cur.execute("SELECT pg_walfile_name(pg_switch_wal())")
        row = cur.fetchone()
        assert row is not None
        segment, deadline = str(row[0]), time.monotonic() + min(timeout, 60.0)
        failing_since: float | None = None
        while True:
            cur.execute(
                "SELECT coalesce(last_archived_wal, ''), coalesce(last_failed_wal, ''), failed_count, "
                "coalesce(last_failed_time > coalesce(last_archived_time, '-infinity'), false) FROM pg_stat_archiver"
            )
            archived, failed, failures, stuck = cur.fetchone() or ("", "", 0, False)
            if archived >= segment:
                return
            now = time.monotonic()
            failing_since = (failing_since or now) if stuck else None
            if now > deadline or (failing_since is not None and now - failing_since > 10):
                raise RestoreRefused(
                    f"WAL segment {segment} of {server.root} is not in the archive, so no restore can reach now: "
                    + (
                        f"archive_command fails for {failed} ({failures} failures; {server.log_file} says why)"
                        if stuck
                        else "archiving has not reached it (is archive_mode on? `ingest storage backup`)"
                    )
                )
            time.sleep(0.1)


def _copy_backup(backup: Path, server: EmbeddedPostgres, current: EmbeddedPostgres) -> None:
    subprocess.run(["cp", "-a", str(backup), str(server.data_dir)], check=True, capture_output=True)
    for leftover in ("postmaster.pid", "standby.signal"):
        (server.data_dir / leftover).unlink(missing_ok=True)
    auto = server.data_dir / "postgresql.auto.conf"  # a backup of a promoted standby names its old upstream
    if auto.exists():
        kept = [
            line
            for line in auto.read_text().splitlines(True)
            if not line.startswith(("primary_conninfo", "primary_slot_name"))
        ]
        auto.write_text("".join(kept))
    signal = server.data_dir / "recovery.signal"
    signal.write_text("")
    owner = (server.data_dir / "PG_VERSION").stat()
    os.chown(signal, owner.st_uid, owner.st_gid)
    copy_tls(current, server)


@contextlib.contextmanager
def _instance_on(server: EmbeddedPostgres, settings: Settings) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance on a server that is not (yet) the installation's own."""
    with tempfile.TemporaryDirectory(prefix="ingest-restore-") as home:
        config = instance_config(server.url(DAGSTER_DATABASE, driver="psycopg2"), settings)
        (Path(home) / "dagster.yaml").write_text(yaml.safe_dump(config))
        with dg.DagsterInstance.from_config(home) as instance:
            yield instance
