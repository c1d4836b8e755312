"""Whether a CDC stream's declared primary key is a real key of its table, as the log carries it.

The loader merges every change on the declared key. If the table does not guarantee it unique and NOT NULL,
rows sharing a value collapse into one row in the target (no error anywhere), or NULL keys fail the load of
the whole source. And a delete carries only the replica identity's columns: a key outside them finds no row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import Problem
from ingestion_assets.sources.postgres.cdc.publication import TableName, ident

# Unique indexes that make their key columns a key of every row: not partial, no expressions, valid; with
# `nullable` false only when every key column is NOT NULL (INCLUDE columns are not part of the key).
_UNIQUE_KEYS = """
SELECT quote_ident(ic.relname), i.indisprimary, i.indisreplident,
       array_agg(a.attname::text ORDER BY k.n), bool_and(a.attnotnull)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_namespace s ON s.oid = c.relnamespace
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE s.nspname = %s AND c.relname = %s AND i.indisunique AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL AND k.n <= i.indnkeyatts
GROUP BY i.indexrelid, ic.relname, i.indisprimary, i.indisreplident
ORDER BY NOT i.indisprimary, NOT i.indisreplident, 1
"""


@dataclass(frozen=True)
class DeclaredKey:
    """The catalog's `primary_key` of a CDC stream, and the table it reads."""

    stream: str  # source.stream
    table: TableName
    columns: tuple[str, ...]


@dataclass(frozen=True)
class UniqueKey:
    index: str
    primary: bool
    identity: bool
    columns: tuple[str, ...]
    not_null: bool

    def shown(self) -> str:
        kind = "primary key" if self.primary else f"unique index {self.index}"
        return f"({', '.join(self.columns)}) [{kind}{', the replica identity' if self.identity else ''}]"


def key_problems(cur: PgCursor, key: DeclaredKey) -> list[Problem]:
    """Why the stream's declared key is not one the table guarantees and the log carries (none if it is)."""
    cur.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (ident(cur, *key.table),))
    identity = str(cur.fetchone()[0])
    keys = unique_keys(cur, *key.table)
    declared = set(key.columns)
    subject = f"stream {key.stream} (table {ident(cur, *key.table)})"
    matching = next((k for k in keys if k.not_null and set(k.columns) == declared), None)
    if matching is None:
        return [Problem(subject, _not_unique(key, keys), table=key.table)]
    carried = _carried(identity, keys)
    if carried is not None and not declared <= set(carried.columns):
        return [Problem(subject, _not_carried(cur, key, identity, carried, matching), table=key.table)]
    return []


def unique_keys(cur: PgCursor, schema: str, table: str) -> list[UniqueKey]:
    """The table's unique indexes that make their columns a key of every row (the primary key first)."""
    cur.execute(_UNIQUE_KEYS, (schema, table))
    return [UniqueKey(str(r[0]), r[1], r[2], tuple(r[3]), r[4]) for r in cur.fetchall()]


def _carried(identity: str, keys: Sequence[UniqueKey]) -> UniqueKey | None:
    """The key a delete's old row holds (None: every column, REPLICA IDENTITY FULL)."""
    if identity == "f":
        return None
    wanted = (lambda k: k.primary) if identity == "d" else (lambda k: k.identity)
    return next((k for k in keys if wanted(k)), UniqueKey("", False, False, (), False))


def _not_unique(key: DeclaredKey, keys: Sequence[UniqueKey]) -> str:
    real = [k for k in keys if k.not_null]
    found = "; ".join(k.shown() for k in real) if real else "none (no primary key, no unique index on NOT NULL columns)"
    fix = f"set primary_key to {list(real[0].columns)}" if real else "add a primary key to the table"
    columns = ", ".join(key.columns)
    return (
        f"primary_key {list(key.columns)} is not a key of the table: no primary key or unique index on NOT NULL "
        f"columns is on exactly those columns, so rows sharing a value would collapse into one row in the target "
        f"(or a NULL would fail the load). The table's keys: {found}. Fix: {fix}, or add a unique index on "
        f"({columns}) with those columns NOT NULL; the stream was not published"
    )


def _not_carried(cur: PgCursor, key: DeclaredKey, identity: str, carried: UniqueKey, matching: UniqueKey) -> str:
    name = ident(cur, *key.table)
    which = "DEFAULT (the primary key)" if identity == "d" else "USING INDEX"
    index = matching.index
    return (
        f"primary_key {list(key.columns)} is a key of the table ({index}), but with REPLICA IDENTITY {which} the "
        f"log's deletes carry only ({', '.join(carried.columns) or 'no column'}), so deletes could not find their "
        f"row in the target. Fix: set primary_key to {list(carried.columns)}, or ALTER TABLE {name} REPLICA "
        f"IDENTITY USING INDEX {index} (or REPLICA IDENTITY FULL); the stream was not published"
    )
