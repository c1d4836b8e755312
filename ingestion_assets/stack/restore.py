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
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psycopg2
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.settings import Settings
from ingestion_assets.stack.durability import archive_for, copy_tls, make_active, wait_until_primary
from ingestion_assets.stack.embedded import EmbeddedPostgres, EmbeddedServerError
from ingestion_assets.stack.instance import DAGSTER_DATABASE, bring_up, instance_config
from ingestion_assets.stack.restore_check import checkpoints_ahead_of_target

RECOVERY_CONF = "ingest_recovery.conf"


class RestoreRefused(RuntimeError):
    """The restore would do harm (checkpoints newer than the target) or cannot be done; nothing was changed."""


@dataclass(frozen=True)
class Restored:
    server: EmbeddedPostgres  # the new primary
    backup_started_at: dt.datetime
    previous: Path  # the folder of the server it replaced (kept: delete it once satisfied)
    warnings: list[str]  # with force: the checkpoints that are ahead of the target


def restore_storage(settings: Settings, to: dt.datetime, force: bool = False, timeout: float = 300.0) -> Restored:
    """Recover the storage as it was at `to` into a new server folder; refuse if any restored checkpoint is
    ahead of what the target holds (the next run would skip rows), unless `force`. Only then does the
    recovered server replace the current one, which is stopped and kept."""
    if to > dt.datetime.now(dt.UTC):
        raise RestoreRefused(f"{to.isoformat()} is in the future: nothing has been archived up to it yet")
    current = settings.embedded
    archive = archive_for(settings.home)
    if current.is_running():
        _archive_up_to_now(current, timeout)
    candidates = [(started, data) for started, data in archive.backups() if started <= to]
    if not candidates:
        raise RestoreRefused(f"no base backup started before {to.isoformat()} in {archive.base}")
    started, backup = candidates[-1]
    server = EmbeddedPostgres(settings.home / f"pg-restored-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}")
    server.prepare_root(current.bin_dir())
    _copy_backup(backup, server, current)
    conf = (
        f"restore_command = 'cp {archive.wal}/%f %p'\n"
        f"recovery_target_time = '{to.astimezone(dt.UTC).isoformat()}'\n"
        "recovery_target_action = 'promote'\nrecovery_target_timeline = 'latest'\n"
    )
    (server.data_dir / RECOVERY_CONF).write_text(conf)
    server.include_conf(RECOVERY_CONF)
    server.ensure_running()
    wait_until_primary(server, timeout)
    (server.data_dir / RECOVERY_CONF).write_text("# the recovery to the time above is done\n")
    with _instance_on(server, settings) as instance:
        problems = checkpoints_ahead_of_target(settings, load_catalog(settings.catalog_path), instance)
    if problems and not force:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
        raise RestoreRefused(
            f"restoring the storage to {to.isoformat()} would put checkpoints ahead of the target, and the next "
            "runs would skip the rows in between:\n  " + "\n  ".join(problems) + "\nrestore to a time at or before "
            "the target's own restore point (older checkpoints only replay), or pass --force and reset those streams"
        )
    current.stop()
    make_active(settings.home, server)
    bring_up(settings)
    return Restored(server, started, current.root, problems)


def _archive_up_to_now(server: EmbeddedPostgres, timeout: float) -> None:
    """Close the current WAL segment and wait until the archive holds it: recovery can then reach now."""
    with contextlib.closing(psycopg2.connect(server.url())) as conn, conn.cursor() as cur:
        conn.autocommit = True
        # Recovery to a time stops at the first commit after it, and fails if it meets none: commit one now.
        cur.execute("SELECT txid_current()")
        cur.execute("SELECT pg_walfile_name(pg_switch_wal())")
        row = cur.fetchone()
        assert row is not None
        segment, deadline = str(row[0]), time.monotonic() + timeout
        while True:
            cur.execute("SELECT coalesce(last_archived_wal, ''), coalesce(last_failed_wal, '') FROM pg_stat_archiver")
            archived = cur.fetchone()
            if archived is not None and archived[0] >= segment:
                return
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"WAL segment {segment} was not archived (failed: {archived})")
            time.sleep(0.1)


def _copy_backup(backup: Path, server: EmbeddedPostgres, current: EmbeddedPostgres) -> None:
    subprocess.run(["cp", "-a", str(backup), str(server.data_dir)], check=True, capture_output=True)
    for leftover in ("postmaster.pid", "standby.signal"):
        (server.data_dir / leftover).unlink(missing_ok=True)
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
