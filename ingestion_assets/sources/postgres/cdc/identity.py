"""Replica identity of published tables: a table that publishes updates and deletes without one makes
PostgreSQL reject the application's own UPDATE and DELETE on it, so such a table leaves the product's
publication at once (a key dropped after the table was published: the run, `ingest check` and the slot
sensor all look)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg2 import sql
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.publication import TableName, ident, published_tables, relkind
from ingestion_assets.sources.postgres.reader import connect

_IDENTITY_SQL = (
    "SELECT c.relreplident, c.relkind, "
    "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), "
    "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident) "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"
)


_LEAVES_SQL = """
WITH RECURSIVE tree(oid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = %s::regclass
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT n.nspname::text, c.relname::text FROM tree JOIN pg_class c ON c.oid = tree.oid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' ORDER BY 1, 2
"""


def identity_gap(cur: PgCursor, schema: str, table: str) -> str | None:
    """Why the table's updates and deletes would carry no key (None: they carry one, or it is no table). A
    partitioned table's rows are written in its partitions: each needs an identity of its own (REPLICA
    IDENTITY FULL on the parent does not reach them)."""
    gap = _own_gap(cur, schema, table)
    if gap is not None or relkind(cur, schema, table) != "p":
        return gap
    cur.execute(_LEAVES_SQL, (ident(cur, schema, table),))
    for leaf in cur.fetchall():
        leaf_gap = _own_gap(cur, *leaf)
        if leaf_gap is not None:
            name = ident(cur, *leaf)
            return f"has partition {name} that {leaf_gap} (ALTER TABLE {name} REPLICA IDENTITY FULL, or a key)"
    return None


def _own_gap(cur: PgCursor, schema: str, table: str) -> str | None:
    cur.execute(_IDENTITY_SQL, (schema, table))
    row = cur.fetchone()
    if row is None or row[1] not in ("r", "p"):
        return None
    identity, _, has_primary_key, has_identity_index = row
    if identity == "d" and not has_primary_key:
        return "has no primary key"
    if identity == "n":
        return "has REPLICA IDENTITY NOTHING"
    if identity == "i" and not has_identity_index:
        return "lost its replica identity index"
    return None


def identity_fix(cur: PgCursor, schema: str, table: str) -> str:
    name = ident(cur, schema, table)
    cur.execute(_IDENTITY_SQL, (schema, table))
    row = cur.fetchone()
    if row is not None and row[0] == "n" and row[2]:  # NOTHING on a table that has a primary key
        return f"ALTER TABLE {name} REPLICA IDENTITY DEFAULT (its primary key)"
    return (
        "add a primary key, or a unique index on the stream's primary_key (NOT NULL columns) and "
        f"ALTER TABLE {name} REPLICA IDENTITY FULL"
    )


@dataclass(frozen=True)
class Unidentified:
    """A table of the streams without a usable replica identity, and what was done about its publication."""

    table: TableName
    reason: str  # "has no primary key", ...
    fix: str  # the statement that gives it an identity
    published: bool  # it was in the publication when looked at
    removed: bool  # the product took it out of its own publication just now
    unpublish: str  # the statement that takes it out of the publication (for a publication of the user's)


def unpublish_unidentified(url: str, publication: str, tables: Sequence[TableName], owned: bool) -> list[Unidentified]:
    """Every table of `tables` that lacks a usable replica identity. One still in `publication` makes the
    application's UPDATE and DELETE on it fail: when the publication is the product's (`owned`) it is taken
    out at once; a publication of the user's is left as it is (the entry says the statement to run). In the
    product's publication every member is looked at, also a table no stream reads any more (a stream removed
    while the runs failed, so the run that takes such tables out did not come)."""
    conn = connect(url, "ingest-cdc-admin")
    try:
        with conn.cursor() as cur:
            members = published_tables(cur, publication)
            looked_at = [*tables, *sorted(members - set(tables))] if owned else list(tables)
            lacking = [(t, gap) for t in looked_at if (gap := identity_gap(cur, *t)) is not None]
            found = []
            for table, gap in lacking:
                published = table in members
                statement = f"ALTER PUBLICATION {ident(cur, publication)} DROP TABLE {ident(cur, *table)}"
                removed = published and owned and _drop(cur, publication, table)
                fix = identity_fix(cur, *table)
                found.append(Unidentified(table, gap, fix, published, removed, statement))
            return found
    finally:
        conn.close()


def _drop(cur: PgCursor, publication: str, table: TableName) -> bool:
    """Out of a publication that names it (one FOR ALL TABLES or a schema cannot drop one table)."""
    cur.execute(
        "SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "WHERE p.pubname = %s AND r.prrelid = %s::regclass",
        (publication, ident(cur, *table)),
    )
    if cur.fetchone() is None:
        return False
    statement = sql.SQL("ALTER PUBLICATION {} DROP TABLE {}")
    cur.execute(statement.format(sql.Identifier(publication), sql.Identifier(*table)))
    return True
