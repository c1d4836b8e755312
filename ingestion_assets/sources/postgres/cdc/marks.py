"""What a stream's log depends on besides its table's rows, as catalog row versions: the publication's own row
(its xmin changes with every ALTER PUBLICATION ... SET, publish options included), the row(s) that put the table
in it (pg_publication_rel: a new oid or xmin when the table is dropped and added back, or its row filter or column
list changes; pg_publication_namespace for a schema), and the labels of the enum values its columns may hold.
None of these changes is in the log: pgoutput leaves out every change the publication did not cover when it was
made, and ALTER TYPE ... RENAME VALUE changes what rows hold without a change for them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from ingestion_assets.sources.postgres.cdc.publication import TableName
from ingestion_assets.sources.postgres.reader import connect

_PUBLICATION_SQL = "SELECT oid::text || '/' || xmin::text, puballtables FROM pg_publication WHERE pubname = %s"
_MEMBERSHIP_SQL = """
SELECT coalesce(string_agg(mark, ',' ORDER BY mark), '') FROM (
    SELECT 'table ' || r.oid::text || '/' || r.xmin::text AS mark FROM pg_publication_rel r
    JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = %(publication)s AND r.prrelid = to_regclass(%(table)s)
    {schemas}
) marks
"""
_SCHEMAS_SQL = """
    UNION ALL SELECT 'schema ' || s.oid::text || '/' || s.xmin::text FROM pg_publication_namespace s
    JOIN pg_publication p ON p.oid = s.pnpubid JOIN pg_class c ON c.relnamespace = s.pnnspid
    WHERE p.pubname = %(publication)s AND c.oid = to_regclass(%(table)s)
"""
# The enum types a column holds, as itself, through a domain or as an array's elements
_ENUMS_SQL = """
WITH RECURSIVE types(oid) AS (
    SELECT atttypid FROM pg_attribute WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped
    UNION
    SELECT v.oid FROM types JOIN pg_type t ON t.oid = types.oid, LATERAL (VALUES (t.typbasetype), (t.typelem)) v(oid)
    WHERE v.oid <> 0
)
SELECT e.oid::text, e.enumlabel::text FROM pg_enum e WHERE e.enumtypid IN (SELECT oid FROM types)
"""

PUBLISHED = "published"  # the checkpoint detail holding a stream's marks


def publication_marks(
    url: str, publication: str, tables: Sequence[TableName], conn: PgConnection | None = None
) -> dict[TableName, dict[str, Any]]:
    """Each table's marks now: {"publication": "oid/xmin", "membership": "...", "enums": {oid: label}}.
    `conn`: an open connection to read them on (kept open), else its own."""
    own = conn is None
    conn = connect(url, "ingest-cdc-marks") if conn is None else conn
    try:
        with conn.cursor() as cur:
            cur.execute(_PUBLICATION_SQL, (publication,))
            row = cur.fetchone()
            pub = str(row[0]) if row else None
            schemas = _SCHEMAS_SQL if conn.server_version >= 150000 else ""
            marks: dict[TableName, dict[str, Any]] = {}
            for schema, table in tables:
                name = sql.Identifier(schema, table).as_string(conn)
                params = {"publication": publication, "table": name}
                cur.execute(_MEMBERSHIP_SQL.format(schemas=schemas), params)
                membership = "all tables" if row and row[1] else str(cur.fetchone()[0])
                cur.execute(_ENUMS_SQL, params)
                enums = {str(oid): str(label) for oid, label in cur.fetchall()}
                marks[(schema, table)] = {"publication": pub, "membership": membership, "enums": enums}
            return marks
    finally:
        if own:
            conn.close()


def marks_changed(publication: str, stored: Mapping[str, Any], now: Mapping[str, Any], own: set[str]) -> str | None:
    """Why the log no longer holds every change of the stream's table since the checkpoint that stored `stored`,
    or None. `own`: the publication row versions the run's own ALTER PUBLICATION replaced (no operator's change)."""
    if stored.get("publication") != now.get("publication") and stored.get("publication") not in own:
        return (
            f"the publication {publication} was altered since its checkpoint (ALTER PUBLICATION ... SET: its publish "
            "options, say): the log holds none of the changes it did not publish meanwhile"
        )
    if stored.get("membership") != now.get("membership"):
        return (
            f"its table was taken out of the publication {publication} and put back, or its row filter or column "
            "list changed, since its checkpoint: the log holds none of the changes it did not publish meanwhile"
        )
    renamed = sorted(
        f"{label!r} -> {now['enums'][oid]!r}"
        for oid, label in (stored.get("enums") or {}).items()
        if oid in (now.get("enums") or {}) and now["enums"][oid] != label
    )
    if renamed:
        return (
            f"enum value(s) {', '.join(renamed)} renamed since its checkpoint (ALTER TYPE ... RENAME VALUE): the log "
            "carries no change for the rows holding them"
        )
    return None
