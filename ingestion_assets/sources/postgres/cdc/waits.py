"""What a copy waits for at the source: the transactions open there, told while it waits.

Creating a slot (its snapshot) waits for every transaction holding a transaction id to end, and a copy's
snapshot waits for the writers older than the publication; a session left `idle in transaction` holds
either for as long as it stays open. Nothing else says so: the run would look hung.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2

from ingestion_assets.sources.postgres.reader import connect

FIRST_SECONDS = 5.0  # a wait this short is common (a writer's transaction ending): told only when longer
EVERY_SECONDS = 10.0
SHOWN = 5  # transactions named per message (the oldest)

# Only what pg_stat_activity holds about sessions (no query text: it may carry values); another role's
# session shows its pid and xid but not its times without pg_read_all_stats.
_OPEN_SQL = """
SELECT pid, backend_xid::text, application_name, state, xact_start, query_start
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start NULLS LAST, pid
"""


@contextlib.contextmanager
def told_while_waiting(
    url: str, waiting: str, say: Callable[[str], None], first: float = FIRST_SECONDS, every: float = EVERY_SECONDS
) -> Iterator[None]:
    """While the block runs (it may wait on the source), say after `first` seconds and then every `every`
    which transactions are open at the source, each `waiting: ...`. One short autocommit connection reads
    pg_stat_activity (it holds no transaction id, so it delays nothing), opened only if the wait lasts."""
    done = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(url, waiting, say, done, first, every), name="ingest-cdc-wait", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def _watch(
    url: str, waiting: str, say: Callable[[str], None], done: threading.Event, first: float, every: float
) -> None:
    conn: Any = None
    pause = first
    try:
        while not done.wait(pause):
            pause = every
            if conn is None:
                conn = connect(url, "ingest-cdc-wait")
                with conn.cursor() as cur:
                    cur.execute("SET statement_timeout = '5s'")
            with conn.cursor() as cur:
                cur.execute(_OPEN_SQL)
                rows = cur.fetchall()
            if not done.is_set():
                say(f"{waiting}: {describe_open(rows)}")
    except psycopg2.Error as exc:  # the wait itself goes on; only the telling stops
        say(f"{waiting}: cannot read pg_stat_activity to say for what ({str(exc).strip()})")
    finally:
        if conn is not None:
            conn.close()


def describe_open(rows: list[tuple[Any, ...]], now: dt.datetime | None = None) -> str:
    """The open transactions as one line: pid, xid, application, state, how long open, last query start."""
    if not rows:
        return "waiting for transactions at the source to end (pg_stat_activity shows none open now)"
    now = now or dt.datetime.now(dt.UTC)
    parts = []
    for pid, xid, application, state, xact_start, query_start in rows[:SHOWN]:
        if xact_start is None:
            parts.append(f"pid {pid} (xid {xid}; its times are hidden from this role: grant it pg_read_all_stats)")
            continue
        age = str(now - xact_start).split(".")[0]
        started = f"{query_start.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" if query_start else "unknown"
        parts.append(
            f"pid {pid} (xid {xid}, application {application!r}, {state}, transaction open {age}, "
            f"last query started {started})"
        )
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return (
        f"waiting for {len(rows)} transaction(s) open at the source to end: {'; '.join(parts)}{more}. "
        "The copy goes on when they end (commit or roll back; pg_terminate_backend(pid) ends a forgotten session)"
    )
