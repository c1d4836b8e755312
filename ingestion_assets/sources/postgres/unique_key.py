"""Whether a table stream's declared `primary_key` holds one row per value.

The target keeps one row per key: rows of the source sharing a key value would land twice on a first read
(slices appended) and collapse into one on the next merge, silently. A key that a unique index (or the primary
key) guarantees needs no look; any other key (a view, a table without constraints) is looked at once, on a
stream's first full read (a partition's: its window's rows), with one GROUP BY (found by a README-only attacker:
a view keyed by a column that is not unique loaded its rows twice, status ok).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2.errors
from psycopg2 import sql

from ingestion_assets.sources.postgres.cdc.keys import unique_keys

SHOWN = 3


def repeated_keys(
    conn: Any, schema: str, table: str, key: tuple[str, ...], within: Sequence[sql.Composable] = ()
) -> tuple[list[tuple[Any, ...]], int]:
    """Up to `SHOWN` key values that several rows hold (with how many each) and how many such values there are
    in all; ([], 0) when the key is guaranteed or holds one row per value. Rows without a key value are not
    counted (they are parked as bad rows). `within`: conditions of a partition's window, whose rows alone are
    looked at (a key range holds every row of its key values; a time window those of its own rows)."""
    relation = sql.Identifier(schema, table)
    with conn.cursor() as cur:
        if key_guaranteed(cur, schema, table, key):
            conn.rollback()
            return [], 0
        columns = sql.SQL(", ").join(sql.Identifier(k) for k in key)
        conditions = [*(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in key), *within]
        present = sql.SQL(" AND ").join(conditions)
        cur.execute(
            sql.SQL(
                "SELECT {columns}, count(*) AS rows, count(*) OVER () AS keys FROM {relation} AS t WHERE {present} "
                "GROUP BY {columns} HAVING count(*) > 1 ORDER BY count(*) DESC LIMIT {shown}"
            ).format(columns=columns, relation=relation, present=present, shown=sql.Literal(SHOWN))
        )
        found = cur.fetchall()
    conn.rollback()
    if not found:
        return [], 0
    return [tuple(row[: len(key) + 1]) for row in found], int(found[0][-1])


def key_guaranteed(cur: Any, schema: str, table: str, key: tuple[str, ...]) -> bool:
    """A valid, non-partial unique index on plain columns all among the key's makes the key unique."""
    return any(set(index.columns) <= set(key) for index in unique_keys(cur, schema, table))


@dataclass(frozen=True)
class KeyLook:
    """What `ingest check` found of a declared key: guaranteed by an index, looked at, or not in time."""

    guaranteed: bool = False
    timed_out: bool = False
    repeated: tuple[tuple[Any, ...], ...] = ()
    count: int = 0


def look_at_key(conn: Any, schema: str, table: str, key: tuple[str, ...], timeout_seconds: float) -> KeyLook:
    """`repeated_keys` over the whole relation for `ingest check`, on `conn`, a session of its own (autocommit),
    made read only and bounded by `statement_timeout` (a view over a large table may take long: the check says it
    stopped instead of holding the source busy)."""
    with conn.cursor() as cur:
        guaranteed = key_guaranteed(cur, schema, table, key)
    conn.rollback()
    if guaranteed:
        return KeyLook(guaranteed=True)
    with conn.cursor() as cur:  # the session is the check's own, closed after it
        cur.execute("SET default_transaction_read_only = on")
        cur.execute("SELECT set_config('statement_timeout', %s, false)", (f"{max(1, int(timeout_seconds * 1000))}ms",))
    try:
        repeated, count = repeated_keys(conn, schema, table, key)
    except psycopg2.errors.QueryCanceled:
        conn.rollback()
        return KeyLook(timed_out=True)
    return KeyLook(repeated=tuple(repeated), count=count)


def repeated_key_error(stream: str, key: tuple[str, ...], repeated: list[tuple[Any, ...]], count: int) -> str:
    shown = "; ".join(
        f"{', '.join(f'{k}={v!r}' for k, v in zip(key, row[:-1], strict=True))} in {row[-1]} rows" for row in repeated
    )
    return (
        f"stream {stream}: primary_key {list(key)} is not unique in the source: {count} value(s) are held by several "
        f"rows ({shown}), and the target keeps one row per key. No unique index guarantees it (a view, or a table "
        "without that constraint): set primary_key to columns that are unique, or make them unique in the source; "
        "nothing was loaded"
    )
