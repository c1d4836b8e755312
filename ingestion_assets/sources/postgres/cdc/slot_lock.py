"""The per-source lock that keeps one run reading (and acknowledging) a replication slot at a time, and who
holds it when a run finds it taken."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg2

from ingestion_assets.sources.postgres.cdc.errors import CdcError, SlotInUseError
from ingestion_assets.sources.postgres.reader import connect

APPLICATION = "ingest-cdc-lock"  # + " live <run id>" or " run <run id>": who holds the lock, in pg_stat_activity
REPLAY = "replay"  # the run id of `ingest dlq replay`, which holds the lock while it reads and loads parked rows


class SlotHeldByLiveRun(CdcError):
    """A live run holds the slot, for up to its `live_seconds`: waiting for it would look like a hung run, and a
    retry would only wait again. Permanent: stop that run first, or let it be."""


@dataclass(frozen=True)
class Holder:
    pid: int
    application: str  # empty: a session of another role, whose name this role may not see
    since: dt.datetime | None

    @property
    def live(self) -> bool:
        return self.application.startswith(f"{APPLICATION} live ")

    @property
    def run_id(self) -> str:
        return self.application.rsplit(" ", 1)[-1] if self.application.startswith(f"{APPLICATION} ") else ""

    def describe(self) -> str:
        since = f", since {self.since.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" if self.since else ""
        who = f"Dagster run {self.run_id}" if self.run_id else "another run"
        if self.run_id == REPLAY:
            who = "`ingest dlq replay`"
        return f"{who}{' (a live run)' if self.live else ''} (backend pid {self.pid} on the source{since})"


@contextlib.contextmanager
def reading_slot(
    url: str,
    slot: str,
    wait_seconds: float,
    run_id: str = "",
    live: bool = False,
    say: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the source's advisory lock for `slot`. A `live` run that finds it taken by another live run fails at
    once, naming it (one live run per source applies every stream's changes). Otherwise (a batch run, a history
    range, which take turns) it says at once who holds it, then waits for it up to `wait_seconds`. A session
    lock: it ends with its connection, so a killed run never leaves it behind."""
    conn = connect(url, f"{APPLICATION} {'live' if live else 'run'} {run_id or '-'}"[:63])
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            key = lock_key(slot)
            cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
            if not cur.fetchone()[0]:
                _wait(cur, slot, key, wait_seconds, live, say)
        yield
    finally:
        conn.close()


def _wait(
    cur: psycopg2.extensions.cursor,
    slot: str,
    key: int,
    wait_seconds: float,
    live: bool,
    say: Callable[[str], None] | None,
) -> None:
    holder = lock_holder(cur, key)
    held = holder.describe() if holder else "another run (gone a moment ago)"
    if live and holder is not None and holder.live:
        raise SlotHeldByLiveRun(
            f"replication slot {slot!r} is held by {held}, which keeps it for up to its cdc.live_seconds: this run "
            "did not start and is not retried. One live run per source applies every stream's changes; stop that "
            'run first (see "Stopping a run" in the README) if this one is to take over'
        )
    if say is not None:
        say(
            f"replication slot {slot!r} is held by {held}: waiting up to {wait_seconds:.0f} s (cdc.lock_wait_seconds) "
            "for it to end; runs of one source take turns"
        )
    cur.execute("SET lock_timeout = %s", (f"{int(wait_seconds * 1000)}ms",))
    try:
        cur.execute("SELECT pg_advisory_lock(%s)", (key,))
    except psycopg2.errors.LockNotAvailable as exc:
        raise SlotInUseError(
            f"replication slot {slot!r} has been held by {held} for over {wait_seconds:.0f} s "
            "(cdc.lock_wait_seconds); this run did not start and may be retried"
        ) from exc
    cur.execute("SET lock_timeout = 0")


def lock_key(slot: str) -> int:
    digest = hashlib.sha256(f"ingest_cdc:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_holder(cur: psycopg2.extensions.cursor, key: int) -> Holder | None:
    """The session holding the lock: a bigint advisory lock shows in pg_locks as its high and low 32 bits."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    cur.execute(
        "SELECT l.pid, coalesce(a.application_name, ''), a.backend_start FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.objsubid = 1 AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid",
        (unsigned >> 32, unsigned & 0xFFFF_FFFF),
    )
    row = cur.fetchone()
    return None if row is None else Holder(int(row[0]), str(row[1]), row[2])
