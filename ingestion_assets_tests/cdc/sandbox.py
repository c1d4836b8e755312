"""A schema, slot and publication of one test on a real server, dropped afterwards; plus a replica to apply changes to."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2

from ingestion_assets.sources.postgres.cdc import (
    UNCHANGED_TOAST,
    ChangeBatch,
    Op,
    RowChange,
    Value,
    parse_lsn,
    read_changes,
)

SENTINEL = "cdc-test-end"  # prefix of the logical message that marks the end of a test's changes


@dataclass
class Sandbox:
    url: str
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def schema(self) -> str:
        return f"cdc_{self.tag}"

    @property
    def slot(self) -> str:
        return f"slot_{self.tag}"

    @property
    def publication(self) -> str:
        return f"pub_{self.tag}"

    def table(self, name: str) -> tuple[str, str]:
        return (self.schema, name)

    def qualified(self, name: str) -> str:
        return f'"{self.schema}"."{name}"'

    @contextlib.contextmanager
    def connect(self, autocommit: bool = True) -> Iterator[Any]:
        conn = psycopg2.connect(self.url, application_name="cdc-test")
        conn.autocommit = autocommit
        try:
            yield conn
        finally:
            conn.close()

    def execute(self, *statements: str, params: Sequence[Any] | None = None) -> None:
        """Run the statements in one transaction."""
        with self.connect(autocommit=False) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, params)
            conn.commit()

    def query(self, statement: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def text_rows(self, name: str, columns: Sequence[str], key: str = "id") -> dict[str, tuple[str | None, ...]]:
        """The table as PostgreSQL's text output, keyed by the text of `key`: what pgoutput sends."""
        cols = ", ".join(f'"{c}"::text' for c in columns)
        rows = self.query(f'SELECT "{key}"::text, {cols} FROM {self.qualified(name)}')
        return {row[0]: tuple(row[1:]) for row in rows}

    def setup(self) -> None:
        self.execute(f'CREATE SCHEMA "{self.schema}"')

    def teardown(self) -> None:
        """Slots retain WAL until dropped: end any holder, then drop slot, publication and schema."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active",
                (self.slot,),
            )
            for _ in range(100):
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
                row = cur.fetchone()
                if row is None:
                    break
                if not row[0]:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    break
                cur.execute("SELECT pg_sleep(0.05)")
            cur.execute(f'DROP PUBLICATION IF EXISTS "{self.publication}"')
            cur.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class Replica:
    """Applies row changes to a dict keyed by the first key column, as a loader's merge would."""

    def __init__(self, rows: Mapping[str, tuple[Value, ...]] | None = None, strict: bool = False) -> None:
        self.rows: dict[str, tuple[Value, ...]] = dict(rows or {})
        self.strict = strict  # an insert of a present key, or a change of a missing row, is an error

    def apply(self, changes: Iterable[RowChange]) -> None:
        for change in changes:
            if change.op is Op.TRUNCATE:
                self.rows.clear()
                continue
            old_key = change.key()[0]
            assert isinstance(old_key, str)
            previous = self.rows.pop(old_key, None)
            if self.strict:
                assert (previous is None) == (change.op is Op.INSERT), f"{change.op} of key {old_key}: overlap or gap"
            if change.op is Op.DELETE:
                continue
            assert change.new is not None
            new = tuple(
                previous[i] if value is UNCHANGED_TOAST and previous is not None else value
                for i, value in enumerate(change.new)
            )
            new_key = new[change.table.columns.index(change.table.key_columns[0])]
            assert isinstance(new_key, str)
            self.rows[new_key] = new

    def without_key(self, key_index: int = 0) -> dict[str, tuple[Value, ...]]:
        """Rows without their key column, to compare with Sandbox.text_rows."""
        return {k: v[:key_index] + v[key_index + 1 :] for k, v in self.rows.items()}


COLUMNS = ("name", "big", "n")


def prepare(box: Sandbox, *extra: str) -> str:
    t = box.qualified("t")
    box.execute(
        f"CREATE TABLE {t} (id int PRIMARY KEY, name text, big text, n numeric)",
        f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL",
        *extra,
        f"CREATE PUBLICATION {box.publication} FOR TABLE {t}",
    )
    box.query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (box.slot,))
    return t


def read_all(box: Sandbox, start: int, **limits: object) -> list[ChangeBatch]:
    """Batches from `start`, each resuming at the previous end_lsn (the stored checkpoint), until caught up."""
    batches: list[ChangeBatch] = []
    while True:
        batch = read_changes(box.url, box.slot, box.publication, start, **limits)  # type: ignore[arg-type]
        batches.append(batch)
        assert batch.end_lsn >= start
        start = batch.end_lsn
        if batch.caught_up:
            return batches


def confirmed_flush(box: Sandbox) -> int:
    (row,) = box.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (box.slot,))
    return parse_lsn(row[0])


def wal_level(url: str) -> str:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            return str(cur.fetchone()[0])
    finally:
        conn.close()
