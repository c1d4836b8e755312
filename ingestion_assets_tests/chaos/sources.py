"""The chaos run's sources: a table stream's table, a CDC table and the demo API, changed by a writer thread
while runs are killed, and read back row by row to compare with the targets."""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import psycopg2.errors

from ingestion_assets.demo.api_server import DemoApi

SETUP = """
CREATE TABLE IF NOT EXISTS items (id bigint PRIMARY KEY, value int NOT NULL, label text,
                                  updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
INSERT INTO items SELECT g, g % 1000, lpad((g % 997)::text, 6, '0'),
                         timestamptz '2024-01-01 00:00:00.000001+00' + (g / 3) * interval '1 ms'
FROM generate_series(1, %(items)s) g ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS events (id int PRIMARY KEY, status text NOT NULL, amount numeric(12,2), note text);
INSERT INTO events SELECT g, 'new', g * 1.25, CASE WHEN g %% 40 = 0 THEN repeat(md5(g::text), 300) END
FROM generate_series(1, %(events)s) g ON CONFLICT DO NOTHING;
"""
# Fetch the comparable part of each stream: key, then the values that must match.
SOURCE_QUERIES = {
    "tbl/items": "SELECT id, value, label, updated_at FROM items",
    "cdc/events": "SELECT id, status, amount, note FROM events",
}
TARGET_QUERIES = {
    "tbl/items": "SELECT id, value, label, updated_at FROM tbl.items",
    "cdc/events": "SELECT id, status, amount, note FROM cdc.events WHERE _ingest_deleted_at IS NULL",
    "api/orders": "SELECT id, updated_at, status FROM api.orders",
}


def create_sources(url: str, items: int, events: int) -> None:
    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute(SETUP.replace("%(items)s", str(items)).replace("%(events)s", str(events)).replace("%%", "%"))
        conn.commit()


@dataclass
class Writer:
    """One thread, one connection, autocommit: inserts, updates, deletes and key changes, and API edits.

    A single serial writer stamps `updated_at` in commit order, as an application with one writer does;
    the table stream's `lookback_seconds` covers the rest. A crashed server breaks the connection: the
    writer reconnects and goes on, as an application would.
    """

    url: str
    api: DemoApi
    seed: int
    changes: int = 0
    error: BaseException | None = None  # a bug in the writer itself: the chaos run must not pass quietly
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="chaos-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.error is not None:
            raise RuntimeError("the chaos writer failed") from self.error

    def _loop(self) -> None:
        try:
            self._write_until_stopped()
        except Exception as exc:  # noqa: BLE001 - handed to stop(), which raises it in the main thread
            self.error = exc

    def _write_until_stopped(self) -> None:
        while not self._stop.is_set():
            try:
                with contextlib.closing(psycopg2.connect(self.url, connect_timeout=5)) as conn:
                    conn.autocommit = True
                    with conn.cursor() as cur:
                        while not self._stop.is_set():
                            with contextlib.suppress(psycopg2.errors.UniqueViolation):  # a key reused
                                self._one_change(cur)
                            time.sleep(0.02)
            except psycopg2.Error:
                time.sleep(0.3)  # the server is restarting

    def _one_change(self, cur: Any) -> None:
        kind, rng = self.rng.random(), self.rng
        if kind < 0.3:
            start = rng.randint(10**6, 10**9)
            cur.execute(
                "INSERT INTO items (id, value, label) SELECT g, g %% 1000, lpad(g::text, 8, '0') "
                "FROM generate_series(%s, %s) g ON CONFLICT DO NOTHING",
                (start, start + rng.randint(1, 40)),
            )
        elif kind < 0.5:
            cur.execute(
                "UPDATE items SET value = value + 1, updated_at = clock_timestamp() WHERE id IN "
                "(SELECT id FROM items TABLESAMPLE SYSTEM (1) LIMIT %s)",
                (rng.randint(1, 30),),
            )
        elif kind < 0.62:
            cur.execute(
                "INSERT INTO events (id, status, amount) VALUES (%s, 'new', %s) ON CONFLICT DO NOTHING",
                (rng.randint(10**5, 10**8), Decimal(rng.randint(0, 10**6)) / 100),
            )
        elif kind < 0.75:
            cur.execute(
                "UPDATE events SET status = %s, amount = amount + 1 WHERE id = (SELECT id FROM events "
                "TABLESAMPLE SYSTEM (2) LIMIT 1)",
                (rng.choice(["paid", "shipped", "void"]),),
            )
        elif kind < 0.82:
            cur.execute("DELETE FROM events WHERE id = (SELECT id FROM events TABLESAMPLE SYSTEM (2) LIMIT 1)")
        elif kind < 0.85:  # a primary-key change: the old key is a delete, the new one an insert
            cur.execute(
                "UPDATE events SET id = id + 200000000 WHERE id = (SELECT id FROM events WHERE id < 200000000 "
                "ORDER BY random() LIMIT 1)"
            )
        else:
            self.api.mutate("orders", inserts=rng.randint(0, 3), updates=rng.randint(0, 3))
        self.changes += 1


def source_rows(url: str, api: DemoApi) -> dict[str, dict[Any, tuple[Any, ...]]]:
    rows: dict[str, dict[Any, tuple[Any, ...]]] = {}
    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")
        for name, query in SOURCE_QUERIES.items():
            cur.execute(query)
            rows[name] = {row[0]: tuple(_plain(v) for v in row[1:]) for row in cur.fetchall()}
    rows["api/orders"] = {
        r["id"]: (dt.datetime.fromisoformat(r["updated_at"]), r["status"]) for r in api.records("orders")
    }
    return rows


def target_rows(warehouse: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every target row, duplicates kept (a key twice is what the comparison looks for)."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    with duckdb.connect(str(warehouse), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        for name, query in TARGET_QUERIES.items():
            try:
                rows[name] = [tuple(_plain(v) for v in row) for row in con.execute(query).fetchall()]
            except duckdb.CatalogException:
                rows[name] = []
    return rows


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value
