"""How far a polled read may checkpoint: never past what a transaction still open could yet commit.

A transaction that began before a read can commit after it rows whose cursor (`now()`, a sequence value)
was assigned before the read's newest row: a cursor that had moved past them would never see them. The
source tells us what is open: `pg_stat_activity.xact_start` per session, `pg_prepared_xacts`.

A *probe* records, at one moment t by the server's clock, the newest position in the table M. Every
cursor value at or below M was assigned before t, by a transaction that began before t. Once every
transaction open now began after t, all of those have ended, so a read that starts now sees every row
at or below M: M is *settled*. A run takes a probe, waits a little for the transactions open at that
moment to end, and reads; its checkpoint never passes the newest settled probe.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from ingestion_assets.sources.postgres.query import Position, ReadPlan

# Sessions of the product itself only read; every other session in the database may write.
_OPEN_TRANSACTIONS = """
SELECT pid, coalesce(application_name, ''), coalesce(usename::text, ''), coalesce(state, ''), xact_start,
       backend_xid IS NOT NULL, clock_timestamp()
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND coalesce(backend_type, '') <> 'walsender'
  AND coalesce(application_name, '') NOT LIKE 'ingest:%%' AND coalesce(application_name, '') NOT LIKE 'ingest-%%'
"""
_HIDDEN_SESSIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type IS NULL AND state IS NULL
"""
_PREPARED = "SELECT gid, prepared FROM pg_prepared_xacts WHERE database = current_database()"


@dataclass(frozen=True)
class Probe:
    at: dt.datetime  # the server's clock
    position: Position | None  # the table's newest (cursor, key) then; None: the table was empty


@dataclass(frozen=True)
class OpenTransaction:
    pid: int | str
    application: str
    user: str
    state: str
    started: dt.datetime | None  # None: a prepared transaction, whose start the server does not keep
    written: bool  # it holds a transaction id: it has written something

    def describe(self, now: dt.datetime) -> str:
        if self.started is None:
            return f"prepared transaction {self.pid!r}"
        age = (now - self.started).total_seconds()
        return (
            f"pid {self.pid} ({self.application or 'no application_name'}, user {self.user}, {self.state}, "
            f"open {age:.0f}s{', has written' if self.written else ''})"
        )


@dataclass(frozen=True)
class Horizon:
    """What is open now: a probe taken before `oldest` is settled."""

    now: dt.datetime
    blockers: tuple[OpenTransaction, ...] = ()
    ignored: tuple[OpenTransaction, ...] = ()  # open long and never written: taken for readers
    hidden_sessions: int = 0  # sessions whose transactions this role cannot see (needs pg_read_all_stats)

    @property
    def oldest(self) -> dt.datetime | None:
        """The start of the oldest transaction that may still commit (None: none open)."""
        starts = [b.started or dt.datetime.min.replace(tzinfo=dt.UTC) for b in self.blockers]
        return min(starts) if starts else None

    def settles(self, probe: Probe) -> bool:
        oldest = self.oldest
        return oldest is None or probe.at < oldest


def take_probe(conn: PgConnection, plan: ReadPlan) -> Probe:
    """The newest (cursor, key) position of the table, and the server's clock after the snapshot that saw it."""
    names = [c.name for c in plan.ordering]
    # As PostgreSQL's own text: it reads it back exactly, infinity, BC and years past 9999 included.
    statement = sql.SQL("SELECT clock_timestamp(), {cols} FROM {table} t ORDER BY {order} LIMIT 1").format(
        cols=sql.SQL(", ").join(sql.SQL("t.") + sql.Identifier(n) + sql.SQL("::text") for n in names),
        table=sql.Identifier(plan.shape.schema, plan.shape.table),
        order=sql.SQL(", ").join(sql.SQL("{} DESC").format(e) for e in plan.order_expressions()),
    )
    with conn.cursor() as cur:
        cur.execute(statement)
        row = cur.fetchone()
        if row is None:
            cur.execute("SELECT clock_timestamp()")
            return Probe(_clock(cur), None)
    return Probe(row[0], dict(zip(names, row[1:], strict=True)))


def read_horizon(conn: PgConnection, max_reader_seconds: float | None) -> Horizon:
    """Open transactions that may still commit. One that has written nothing (no transaction id) for longer
    than `max_reader_seconds` is taken for a reader (a report, pg_dump), so it cannot hold every stream."""
    with conn.cursor() as cur:
        cur.execute(_OPEN_TRANSACTIONS)
        rows = cur.fetchall()
        now = _clock(cur)
        cur.execute(_HIDDEN_SESSIONS)
        (hidden,) = cur.fetchone() or (0,)
        cur.execute(_PREPARED)
        prepared = cur.fetchall()
    blockers: list[OpenTransaction] = []
    ignored: list[OpenTransaction] = []
    for pid, application, user, state, started, written, _ in rows:
        open_transaction = OpenTransaction(pid, application, user, state, started, bool(written))
        reader = max_reader_seconds is not None and not written and (now - started).total_seconds() > max_reader_seconds
        (ignored if reader else blockers).append(open_transaction)
    blockers += [OpenTransaction(gid, "", "", "prepared", None, True) for gid, _ in prepared]
    return Horizon(now, tuple(blockers), tuple(ignored), int(hidden))


def _clock(cur: Any) -> dt.datetime:
    cur.execute("SELECT clock_timestamp()")
    row = cur.fetchone()
    assert row is not None
    return row[0]


def wait_for_settling(
    conn: PgConnection, probe: Probe, wait_seconds: float, max_reader_seconds: float | None
) -> Horizon:
    """Poll until every transaction open at the probe has ended, or `wait_seconds` passed; the last horizon."""
    deadline = time.monotonic() + wait_seconds
    pause = 0.02
    while True:
        horizon = read_horizon(conn, max_reader_seconds)
        if horizon.settles(probe) or time.monotonic() >= deadline:
            return horizon
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
