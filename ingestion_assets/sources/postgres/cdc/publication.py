"""The publication that names the tables a slot streams: create it, extend it, and check what it leaves out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import OpenTransactions, Problem
from ingestion_assets.sources.postgres.reader import connect

TableName = tuple[str, str]  # (schema, table)
PUBLISHED_ACTIONS = ("pubinsert", "pubupdate", "pubdelete", "pubtruncate")


def publication_problems(
    cur: PgCursor, publication: str, tables: Sequence[TableName], will_publish: bool = False
) -> list[Problem]:
    """What keeps `publication` from streaming every change of `tables`. With `will_publish`, a missing
    publication or table is fine when the run may create or add it (it does so only after every check)."""
    subject = f"publication {publication!r}"
    cur.execute("SELECT to_jsonb(p) FROM pg_publication p WHERE pubname = %s", (publication,))
    row = cur.fetchone()
    if row is None:
        if will_publish:
            return _privilege_problems(cur, subject, tables, create=True)
        return [
            Problem(
                subject,
                "does not exist; the first run creates it, or: CREATE PUBLICATION "
                f"{ident(cur, publication)} FOR TABLE {_table_list(cur, tables)} WITH (publish_via_partition_root = "
                "true)",
            )
        ]
    pub = row[0]
    problems = []
    missing = [action[3:] for action in PUBLISHED_ACTIONS if not pub.get(action, True)]
    if missing:
        problems.append(
            Problem(
                subject,
                f"does not publish {', '.join(missing)}, so those changes never arrive; "
                f"ALTER PUBLICATION {ident(cur, publication)} SET (publish = "
                "'insert, update, delete, truncate')",
            )
        )
    members = published_tables(cur, publication)
    absent = [t for t in tables if t not in members]
    if absent and not will_publish:
        problems += [
            Problem(
                subject,
                f"does not include table {ident(cur, *t)}; ALTER PUBLICATION {ident(cur, publication)} ADD TABLE "
                f"{ident(cur, *t)} (a run adds it once every check passes)",
            )
            for t in absent
        ]
    elif absent:
        problems += _privilege_problems(cur, subject, absent, create=False)
    problems += _partition_problems(cur, subject, publication, bool(pub.get("pubviaroot")), tables)
    cur.execute("SELECT to_jsonb(t) FROM pg_publication_tables t WHERE pubname = %s", (publication,))
    published = {(r["schemaname"], r["tablename"]): r for (r,) in cur.fetchall()}
    for schema, table in tables:
        entry = published.get((schema, table))
        name = ident(cur, schema, table)
        if entry is None:
            continue
        if entry.get("rowfilter"):
            problems.append(
                Problem(
                    subject,
                    f"publishes only rows of {name} WHERE {entry['rowfilter']}; changes of other rows never "
                    f"arrive: ALTER PUBLICATION {ident(cur, publication)} SET TABLE {name} (no WHERE)",
                )
            )
        elif entry.get("attnames") is not None and _has_column_list(cur, publication, schema, table):
            problems += _column_list_problems(cur, subject, schema, table, entry["attnames"])
    return problems


def _has_column_list(cur: PgCursor, publication: str, schema: str, table: str) -> bool:
    """Whether the publication names columns for the table (PostgreSQL 15+). pg_publication_tables lists every
    column without a list, but read apart from pg_attribute a column added in between looked left out."""
    if cur.connection.server_version < 150000:
        return False
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "WHERE p.pubname = %s AND r.prrelid = %s::regclass AND r.prattrs IS NOT NULL)",
        (publication, ident(cur, schema, table)),
    )
    return bool(cur.fetchone()[0])


def published_tables(cur: PgCursor, publication: str) -> set[TableName]:
    """Tables the publication names, itself or by schema, or all of them: a partitioned table counts as
    published as itself (pg_publication_tables lists only its partitions without publish_via_partition_root)."""
    cur.execute(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_publication p ON p.pubname = %s WHERE c.relkind IN ('r', 'p') AND (p.puballtables "
        "OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = c.oid)"
        + (
            " OR EXISTS (SELECT 1 FROM pg_publication_namespace s WHERE s.pnpubid = p.oid AND s.pnnspid = n.oid)"
            if cur.connection.server_version >= 150000
            else ""
        )
        + ")",
        (publication,),
    )
    return {(schema, table) for schema, table in cur.fetchall()}


def _partition_problems(
    cur: PgCursor, subject: str, publication: str, via_root: bool, tables: Sequence[TableName]
) -> list[Problem]:
    """Without publish_via_partition_root the changes of a partitioned table arrive under each partition's
    name, which no stream reads."""
    if via_root:
        return []
    partitioned = [t for t in tables if relkind(cur, *t) == "p"]
    return [
        Problem(
            subject,
            f"publishes the partitions of the partitioned table {ident(cur, *t)} under their own names, so its "
            f"changes never reach the stream; ALTER PUBLICATION {ident(cur, publication)} SET "
            "(publish_via_partition_root = true)",
        )
        for t in partitioned
    ]


def relkind(cur: PgCursor, schema: str, table: str) -> str | None:
    """pg_class.relkind of the table (r, p, v, ...), None if there is none."""
    cur.execute(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    )
    row = cur.fetchone()
    return str(row[0]) if row else None


def _privilege_problems(cur: PgCursor, subject: str, tables: Sequence[TableName], create: bool) -> list[Problem]:
    """Creating a publication needs CREATE on the database; publishing a table needs to own it."""
    problems = []
    if create:
        cur.execute("SELECT has_database_privilege(current_database(), 'CREATE'), current_user")
        allowed, user = cur.fetchone()
        if not allowed:
            problems.append(
                Problem(subject, f"cannot be created by {user!r}: GRANT CREATE ON DATABASE to it, or create it")
            )
    for schema, table in tables:
        cur.execute(
            "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (schema, table),
        )
        row = cur.fetchone()
        if row is not None and not row[0]:
            problems.append(
                Problem(
                    subject,
                    f"cannot include {ident(cur, schema, table)}: only its owner may publish it; have the owner "
                    "create or extend the publication",
                )
            )
    return problems


def _column_list_problems(cur: PgCursor, subject: str, schema: str, table: str, published: list[str]) -> list[Problem]:
    cur.execute(
        "SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''",
        (ident(cur, schema, table),),
    )
    left_out = [column for column in cur.fetchone()[0] if column not in published]
    if not left_out:
        return []
    return [
        Problem(
            subject,
            f"leaves columns {left_out} of {ident(cur, schema, table)} out (a column list); "
            "remove the column list or those columns stay empty",
        )
    ]


class Ensured(NamedTuple):
    """What `ensure_publication` did: the tables it added, and the publication row's version ("oid/xmin") its
    own ALTER PUBLICATION replaced (None: the row is as it was, or new), which is no operator's change."""

    added: tuple[TableName, ...]
    replaced: str | None = None


def ensure_publication(
    url: str,
    publication: str,
    tables: Sequence[TableName],
    partition_root: bool = True,
    owned: bool = True,
    conn: PgConnection | None = None,
) -> Ensured:
    """Create the publication for `tables` (publish_via_partition_root, so a partitioned table's changes come
    under its own name), or add the ones it lacks. Call it only after check_cdc found nothing: a table without a
    key must never be published. `owned`: the product made the publication (its default name), so it may also
    turn on publish_via_partition_root. `conn`: an open autocommit connection to use (kept open), else its own."""
    own = conn is None
    conn = connect(url, "ingest-cdc-admin") if conn is None else conn
    try:
        with conn.cursor() as cur:
            return _ensure(cur, publication, tables, partition_root, owned)
    finally:
        if own:
            conn.close()


def _ensure(
    cur: PgCursor, publication: str, tables: Sequence[TableName], partition_root: bool, owned: bool
) -> Ensured:
    pub = sql.Identifier(publication)
    cur.execute(
        "SELECT puballtables, pubviaroot, oid::text || '/' || xmin::text FROM pg_publication WHERE pubname = %s",
        (publication,),
    )
    row = cur.fetchone()
    options = sql.SQL(" WITH (publish_via_partition_root = true)") if partition_root else sql.SQL("")
    if row is None:
        cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}").format(pub, _table_sql(tables), options))
        return Ensured(tuple(tables))
    altered = False
    if owned and partition_root and not row[1] and any(relkind(cur, *t) == "p" for t in tables):
        cur.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(pub))
        altered = True
    missing: tuple[TableName, ...] = ()
    if not row[0]:
        present = published_tables(cur, publication)
        missing = tuple(t for t in tables if t not in present)
        if missing:
            cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, _table_sql(missing)))
            altered = True
    if not altered:
        return Ensured(missing)
    cur.execute("SELECT oid::text || '/' || xmin::text FROM pg_publication WHERE pubname = %s", (publication,))
    after = cur.fetchone()
    return Ensured(missing, str(row[2]) if after is None or after[0] != row[2] else None)


def drop_unread_tables(url: str, publication: str, read: Sequence[TableName]) -> tuple[TableName, ...]:
    """Take the tables no stream reads any more (a stream removed from the catalog) out of a publication the
    product made, so the slot stops decoding their changes; returns them. Dropping a table from a publication
    never affects the source's own writes. A publication of all tables is left as it is."""
    conn = connect(url, "ingest-cdc-admin")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
            row = cur.fetchone()
            if row is None or row[0]:
                return ()
            unread = tuple(sorted(published_tables(cur, publication) - set(read)))
            if unread:
                statement = sql.SQL("ALTER PUBLICATION {} DROP TABLE {}")
                cur.execute(statement.format(sql.Identifier(publication), _table_sql(unread)))
            return unread
    finally:
        conn.close()


def await_older_writers(url: str, seconds: float) -> None:
    """Wait until every transaction holding an xid now has ended. A transaction that wrote a table before
    the table was published and commits after does not publish those rows; a copy's snapshot taken once it
    has ended sees them."""
    conn = connect(url, "ingest-cdc-admin")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_snapshot()::text")
            _, _, listed = str(cur.fetchone()[0]).split(":")
            running = [int(x) for x in listed.split(",") if x]
            deadline = time.monotonic() + seconds
            while running:
                cur.execute(
                    "SELECT x FROM unnest(%s::bigint[]) x WHERE pg_xact_status(x::text::xid8) = 'in progress'",
                    (running,),
                )
                running = [int(r[0]) for r in cur.fetchall()]
                if running and time.monotonic() > deadline:
                    raise OpenTransactions(
                        f"transactions {running[:5]} have been open for over {seconds:.0f} s since before the copy "
                        "started; its snapshot must see what they wrote. Nothing was copied; retry when they end "
                        "(pg_stat_activity shows them: backend_xid)"
                    )
                time.sleep(0.1)
    finally:
        conn.close()


def _table_sql(tables: Sequence[TableName]) -> sql.Composable:
    if not tables:
        raise ValueError("a publication needs at least one table")
    return sql.SQL(", ").join(sql.Identifier(schema, table) for schema, table in tables)


def ident(cur: PgCursor, *parts: str) -> str:
    return str(sql.Identifier(*parts).as_string(cur))


def _table_list(cur: PgCursor, tables: Sequence[TableName]) -> str:
    return ", ".join(ident(cur, s, t) for s, t in tables) or "..."
