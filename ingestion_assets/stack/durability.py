"""Dagster storage that outlives its server: WAL archiving, base backups, a streaming standby, promotion."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2

from ingestion_assets.stack import server_tls
from ingestion_assets.stack.embedded import SYSTEM_USER, EmbeddedPostgres, EmbeddedServerError, run_as_user, user_ids

ACTIVE_FILE = "pg.active"  # names the server folder under INGEST_HOME that holds Dagster's storage now
STANDBY_ROOT = "pg-standby"
STANDBY_FILE = "pg.standby"  # names the standby's folder when it is not STANDBY_ROOT
ARCHIVE_CONF = "ingest_archive.conf"
REPLICATION_KEYS = "replication"  # under a standby's tls/: its copy of the client key, owned by the server's user


def active_server(home: Path) -> EmbeddedPostgres:
    """The primary: INGEST_HOME/pg, or the folder a promotion or a restore made primary."""
    try:
        name = (home / ACTIVE_FILE).read_text().strip()
    except FileNotFoundError:
        name = "pg"
    return EmbeddedPostgres(home / name)


def stop_all(home: Path) -> list[Path]:
    """Stop every server under INGEST_HOME (primary, standbys, restored copies, replaced ones); their folders."""
    stopped = []
    for root in sorted(home.glob("pg*")):
        server = EmbeddedPostgres(root)
        if (server.data_dir / "PG_VERSION").exists() and server.is_running():
            server.stop()
            stopped.append(root)
    return stopped


def make_active(home: Path, server: EmbeddedPostgres) -> None:
    staged = home / f"{ACTIVE_FILE}.{os.getpid()}"
    staged.write_text(server.root.name)
    staged.replace(home / ACTIVE_FILE)


@dataclass(frozen=True)
class Archive:
    """INGEST_HOME/storage-archive: `wal/` (every WAL segment the primary completes) and `base/<time>/`."""

    root: Path

    @property
    def wal(self) -> Path:
        return self.root / "wal"

    @property
    def base(self) -> Path:
        return self.root / "base"

    def backups(self) -> list[tuple[dt.datetime, Path]]:
        """Completed base backups, oldest first, with the time each started (WAL replays from there)."""
        found = []
        for folder in sorted(self.base.glob("*")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                label = json.loads((folder / "ingest_backup.json").read_text())
                found.append((dt.datetime.fromisoformat(label["started_at"]), folder / "data"))
        return sorted(found)


def archive_for(home: Path) -> Archive:
    return Archive(home / "storage-archive")


def enable_archiving(server: EmbeddedPostgres, archive: Archive) -> None:
    """archive_mode=on with a copy into the archive that never overwrites; restarts the server if it must."""
    for folder in (archive.root, archive.wal, archive.base):
        folder.mkdir(parents=True, exist_ok=True)
        if run_as_user() is not None:
            os.chown(folder, *user_ids(SYSTEM_USER))
    server.ensure_running()
    conf = server.data_dir / ARCHIVE_CONF
    wanted = (
        "archive_mode = on\n"
        # A file there already with the same bytes is archived (a promoted standby may offer a segment the old
        # primary archived): PostgreSQL's advice; different bytes still fail, loudly, in pg_stat_archiver.
        f"archive_command = 'test ! -f {archive.wal}/%f && cp %p {archive.wal}/%f || cmp -s %p {archive.wal}/%f'\n"
        "archive_timeout = 60\n"  # a quiet instance still archives its last minute
    )
    if conf.exists() and conf.read_text() == wanted:
        return
    conf.write_text(wanted)
    server.include_conf(ARCHIVE_CONF)
    server.stop()
    server.ensure_running()


def base_backup(server: EmbeddedPostgres, archive: Archive) -> Path:
    """A full copy of the running primary (pg_basebackup, WAL streamed in); PITR starts from one of these."""
    started = dt.datetime.now(dt.UTC)
    folder = archive.base / started.strftime("%Y%m%dT%H%M%S.%fZ")
    folder.mkdir(parents=True)
    if run_as_user() is not None:
        os.chown(folder, *user_ids(SYSTEM_USER))
    with tempfile.TemporaryDirectory(prefix="ingest-backup-key-") as scratch:  # the key copy goes with it
        os.chmod(scratch, 0o711)  # the server's user passes through to its own 0700 folder inside
        url = tool_url(server, server, Path(scratch) / "tls")
        server.run_tool(["pg_basebackup", "-D", str(folder / "data"), "-X", "stream", "-c", "fast", "-d", url])
    (folder / "ingest_backup.json").write_text(json.dumps({"started_at": started.isoformat()}))
    return folder / "data"


def standby_server(home: Path) -> EmbeddedPostgres:
    """The standby's folder: INGEST_HOME/pg-standby, or the one a later `start_standby` chose."""
    try:
        name = (home / STANDBY_FILE).read_text().strip()
    except FileNotFoundError:
        name = STANDBY_ROOT
    return EmbeddedPostgres(home / name)


def is_standby(server: EmbeddedPostgres) -> bool:
    return (server.data_dir / "standby.signal").exists()


def start_standby(primary: EmbeddedPostgres, home: Path) -> EmbeddedPostgres:
    """A streaming replica of the primary in INGEST_HOME/pg-standby (read only until promoted); a folder that
    holds a former primary (promoted, then replaced by a restore) is left alone and a new one is made."""
    standby = standby_server(home)
    if (standby.data_dir / "PG_VERSION").exists() and not is_standby(standby):
        standby = EmbeddedPostgres(home / f"{STANDBY_ROOT}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}")
        staged = home / f"{STANDBY_FILE}.{os.getpid()}"
        staged.write_text(standby.root.name)
        staged.replace(home / STANDBY_FILE)
    if not (standby.data_dir / "PG_VERSION").exists():
        primary.ensure_running()
        standby.prepare_root(primary.bin_dir())
        copy_tls(primary, standby)
        # -R writes this URL into the standby's primary_conninfo: its key copy lives as long as the standby
        url = tool_url(primary, standby, standby.root / "tls" / REPLICATION_KEYS)
        standby.run_tool(["pg_basebackup", "-D", str(standby.data_dir), "-R", "-X", "stream", "-d", url])
    return standby.ensure_running()


def tool_url(server: EmbeddedPostgres, files_of: EmbeddedPostgres, key_folder: Path) -> str:
    """`server`'s URL for a program that runs as the server's system user (pg_basebackup, a WAL receiver):
    with TLS, the client key of `files_of` copied for that user into `key_folder` (see server_tls)."""
    if not server_tls.tls_enabled(server):
        return server.url()
    owner = user_ids(SYSTEM_USER) if run_as_user() is not None else None
    files = server_tls.files_for_user(files_of, key_folder, owner)
    return server_tls.tls_url(server, "postgresql", server.port(), "postgres", files)


def promote(standby: EmbeddedPostgres, home: Path, timeout: float = 60.0) -> EmbeddedPostgres:
    """Make the standby the primary: it takes writes (and checkpoints) from now on, and URLs point at it.
    Refused (PromotionRefused) unless it follows the current primary: promoting a standby of a server that is
    no longer primary would roll the storage back."""
    from ingestion_assets.stack.standby_check import check_follows

    primary = active_server(home)
    if primary.root != standby.root:
        check_follows(standby, primary)
    try:
        if is_standby(standby):
            standby.run_tool(["pg_ctl", "-D", str(standby.data_dir), "-w", "-t", str(int(timeout)), "promote"])
        wait_until_primary(standby, timeout)
    except EmbeddedServerError as exc:
        raise EmbeddedServerError(f"{exc}; {abandon_promotion(standby)}") from exc
    make_active(home, standby)
    shutil.rmtree(standby.root / "tls" / REPLICATION_KEYS, ignore_errors=True)  # it streams from no one now
    return standby


def abandon_promotion(standby: EmbeddedPostgres) -> str:
    """A promotion that did not finish stays pending: the server would finish it on its own later (a second
    primary nobody points at). Withdraw the request and stop the server; returns what was done, for the user."""
    (standby.data_dir / "promote").unlink(missing_ok=True)
    try:
        standby.stop("immediate")
    except EmbeddedServerError as exc:
        return f"the promotion request was withdrawn but stopping {standby.root} failed ({exc}): stop it by hand"
    return (
        f"the promotion request was withdrawn and the standby under {standby.root} stopped (-m immediate), so it "
        "cannot finish promoting on its own; it is still a standby (`ingest up --standby` starts it again)"
    )


def wait_until_primary(server: EmbeddedPostgres, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with (
            contextlib.suppress(psycopg2.OperationalError),
            contextlib.closing(psycopg2.connect(server.url(), connect_timeout=5)) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT pg_is_in_recovery()")
            row = cur.fetchone()
            if row is not None and not row[0]:
                return
        if not server.is_running():
            tail = server.log_file.read_text(errors="replace").strip().splitlines()[-3:]
            raise EmbeddedServerError(f"the server under {server.root} stopped in recovery: {' | '.join(tail)}")
        if time.monotonic() > deadline:
            raise EmbeddedServerError(f"the server under {server.root} is still in recovery; see {server.log_file}")
        time.sleep(0.2)


def copy_tls(source: EmbeddedPostgres, target: EmbeddedPostgres) -> None:
    """A copy of a server (standby, restore) keeps its certificates: its pg_hba.conf admits TLS only."""
    if (source.root / "tls").exists() and not (target.root / "tls").exists():
        subprocess.run(["cp", "-a", str(source.root / "tls"), str(target.root / "tls")], check=True)


def rebuild_standby(home: Path, primary: EmbeddedPostgres, replaced: EmbeddedPostgres) -> str:
    """After a restore the standby follows the replaced server; promoting it would undo the restore, so it is
    rebuilt from the new primary. Returns what happened, for the user."""
    standby = standby_server(home)
    if not is_standby(standby) or standby.root in (primary.root, replaced.root):
        return "there was no standby; `ingest up --standby` starts one"
    standby.stop("immediate")
    shutil.rmtree(standby.root)
    try:
        rebuilt = start_standby(primary, home)
    except EmbeddedServerError as exc:
        return (
            f"the standby under {standby.root} followed the replaced server and was removed (disabled); rebuilding "
            f"it failed: {exc}; `ingest up --standby` builds one"
        )
    return f"the standby under {rebuilt.root} followed the replaced server: rebuilt from the restored primary"
