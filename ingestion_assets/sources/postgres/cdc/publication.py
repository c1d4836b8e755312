"""The publication that names the tables a slot streams: create it, extend it, and check what it leaves out."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2 import sql
from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import Problem
from ingestion_assets.sources.postgres.reader import connect

TableName = tuple[str, str]  # (schema, table)
PUBLISHED_ACTIONS = ("pubinsert", "pubupdate", "pubdelete", "pubtruncate")


def publication_problems(cur: PgCursor, publication: str, tables: Sequence[TableName]) -> list[Problem]:
    subject = f"publication {publication!r}"
    cur.execute("SELECT to_jsonb(p) FROM pg_publication p WHERE pubname = %s", (publication,))
    row = cur.fetchone()
    if row is None:
        return [
            Problem(
                subject,
                "does not exist; create it with ensure_publication(), or CREATE PUBLICATION "
                f"{ident(cur, publication)} FOR TABLE {_table_list(cur, tables)}",
            )
        ]
    problems = []
    missing = [action[3:] for action in PUBLISHED_ACTIONS if not row[0].get(action, True)]
    if missing:
        problems.append(
            Problem(
                subject,
                f"does not publish {', '.join(missing)}, so those changes never arrive; "
                f"ALTER PUBLICATION {ident(cur, publication)} SET (publish = "
                "'insert, update, delete, truncate')",
            )
        )
    cur.execute("SELECT to_jsonb(t) FROM pg_publication_tables t WHERE pubname = %s", (publication,))
    published = {(r["schemaname"], r["tablename"]): r for (r,) in cur.fetchall()}
    for schema, table in tables:
        entry = published.get((schema, table))
        name = ident(cur, schema, table)
        if entry is None:
            problems.append(
                Problem(
                    subject,
                    f"does not include table {name}; ALTER PUBLICATION "
                    f"{ident(cur, publication)} ADD TABLE {name} (or ensure_publication)",
                )
            )
        elif entry.get("rowfilter"):
            problems.append(
                Problem(
                    subject,
                    f"publishes only rows of {name} WHERE {entry['rowfilter']}; changes of other rows never "
                    f"arrive: ALTER PUBLICATION {ident(cur, publication)} SET TABLE {name} (no WHERE)",
                )
            )
        elif entry.get("attnames") is not None:
            problems += _column_list_problems(cur, subject, schema, table, entry["attnames"])
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


def ensure_publication(url: str, publication: str, tables: Sequence[TableName]) -> tuple[TableName, ...]:
    """Create the publication for `tables`, or add the ones it lacks; returns the tables added."""
    conn = connect(url, "ingest-cdc-admin")
    try:
        with conn.cursor() as cur:
            pub = sql.Identifier(publication)
            cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
            row = cur.fetchone()
            if row is None:
                cur.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(pub, _table_sql(tables)))
                return tuple(tables)
            if row[0]:
                return ()
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
            present = set(cur.fetchall())
            missing = tuple(t for t in tables if t not in present)
            if missing:
                cur.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, _table_sql(missing)))
            return missing
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
