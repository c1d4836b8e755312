"""Whether a cursor's values compare outside PostgreSQL as they do inside it.

Partitioned streams keep the newest version of a row by comparing cursor values in the target (the version
guard: several partitions, and `live`, write one table). A number, a date or a timestamp compares alike
everywhere; an enum compares by its labels' declared order, and text by its collation (`en_US`, ICU), while
the target compares their text byte by byte. A newer version would then lose to an older one, silently (found
by a README-only attacker: an enum cursor 'paid' → 'delivered' kept 'paid'). Such a cursor is refused for
partitioned streams; an unpartitioned stream reads in the source's own order and needs no guard.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

_BYTE_ORDERED = {"c", "posix", "c.utf8", "c.utf-8", "ucs_basic"}
_CURSOR_SQL = """
SELECT a.attname, bt.typtype = 'e', coalesce(co.collname, ''), coalesce(co.collcollate, ''),
       d.datcollate, coalesce(to_jsonb(d) ->> 'datlocprovider', 'c')  -- PostgreSQL 15 added the provider
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_collation co ON co.oid = a.attcollation
JOIN pg_database d ON d.datname = current_database()
WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s) AND NOT a.attisdropped
"""


def unordered_cursor_columns(conn: Any, schema: str, table: str, cursor: tuple[str, ...]) -> list[str]:
    """The cursor columns whose order the target cannot reproduce, each with why (empty: all compare alike)."""
    relation = sql.Identifier(schema, table).as_string(conn)
    with conn.cursor() as cur:
        cur.execute(_CURSOR_SQL, (relation, list(cursor)))
        rows = cur.fetchall()
    conn.rollback()
    found = []
    for name, is_enum, collation, collate, database_collate, provider in rows:
        if is_enum:
            found.append(f"{name} (an enum: its labels' declared order)")
            continue
        if not collation:
            continue  # not text: numbers, dates and timestamps compare alike everywhere
        if collation == "default":
            collation, collate = "the database's default", database_collate if provider == "c" else "ICU"
        if collation.lower() not in _BYTE_ORDERED and collate.lower() not in _BYTE_ORDERED:
            found.append(f"{name} (text in collation {collation}: {collate})")
    return found
