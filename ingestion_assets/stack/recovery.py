"""Watching a point-in-time recovery: which WAL it asks the archive for, and a clear stop when it cannot finish.

A recovery that lacks a WAL segment (the archive stopped before the target) replays nothing more; without a
watch it looks like a hang. The restore command notes every file the archive did not have, and the watch
gives up once replay stalls on one of them, naming the segment and the recovery target."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psycopg2

from ingestion_assets.stack.embedded import EmbeddedPostgres, EmbeddedServerError

MISSING_FILE = "restore-missing"  # in the restored server's root: one line per file the archive lacked


class RestoreRefused(RuntimeError):
    """The restore would do harm (checkpoints newer than the target) or cannot be done; nothing was changed."""


def restore_command(server: EmbeddedPostgres, wal: Path) -> str:
    """Copy from the archive; a file it lacks is noted (PostgreSQL itself says nothing of a missing file)."""
    return f"cp {wal}/%f %p || {{ echo %f >> {server.root / MISSING_FILE}; exit 1; }}"


def wait_for_recovery(server: EmbeddedPostgres, target: str, wal: Path, timeout: float, stall: float = 20.0) -> None:
    """Until `server` finished its recovery to `target` and is primary; RestoreRefused when it stopped, when
    replay stalled `stall` seconds on a segment the archive lacks, or after `timeout`."""
    started = moved_at = time.monotonic()
    position: str | None = None
    while True:
        state = _state(server)
        if state is not None and not state[0]:
            return
        now = time.monotonic()
        if state is not None and state[1] != position:
            position, moved_at = state[1], now
        if not server.is_running():
            raise _stopped(server, target, wal)
        stalled = now - moved_at > stall and _missing_segment(server) is not None
        if stalled or now - started > timeout:
            replayed = f"replayed up to WAL position {state[1]} (last commit {state[2]})" if state else "not yet"
            raise RestoreRefused(
                f"the recovery to {target} did not finish in {now - started:.0f}s: {replayed}"
                f"{_waiting_for(server, wal)}"
            )
        time.sleep(0.2)


def start_recovery(server: EmbeddedPostgres, target: str, wal: Path) -> None:
    """Start the server in recovery; one that stops at once (a segment missing early) says why, as a refusal."""
    try:
        server.ensure_running()
    except EmbeddedServerError as exc:
        raise _stopped(server, target, wal) from exc


def _stopped(server: EmbeddedPostgres, target: str, wal: Path) -> RestoreRefused:
    tail = server.log_file.read_text(errors="replace").strip().splitlines()[-3:] if server.log_file.exists() else []
    return RestoreRefused(f"the recovery to {target} stopped: {' | '.join(tail)}{_waiting_for(server, wal)}")


def _state(server: EmbeddedPostgres) -> tuple[bool, str | None, str | None] | None:
    """(in recovery, replayed position, last replayed commit time); None while it admits no connection."""
    with (
        contextlib.suppress(psycopg2.OperationalError),
        contextlib.closing(psycopg2.connect(server.url(), connect_timeout=5)) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, pg_last_xact_replay_timestamp()::text")
        row = cur.fetchone()
        return None if row is None else (bool(row[0]), row[1], row[2])
    return None


def _missing_segment(server: EmbeddedPostgres) -> str | None:
    """The last WAL segment the recovery asked for and the archive lacked (history files are only probes)."""
    try:
        names = (server.root / MISSING_FILE).read_text().split()
    except FileNotFoundError:
        return None
    segments = [name for name in names if len(name) == 24 and not name.endswith(".history")]
    return segments[-1] if segments else None


def _waiting_for(server: EmbeddedPostgres, wal: Path) -> str:
    segment = _missing_segment(server)
    if segment is None:
        return ""
    return (
        f"; it waits for WAL segment {segment}, which is not in {wal}: the archive stops before the recovery "
        "target (see pg_stat_archiver on the primary: did archiving fail?); restore to an earlier time"
    )
