"""Check that a server, slot, publication and tables are ready for change data capture, naming each fix."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg2.extensions import cursor as PgCursor

from ingestion_assets.sources.postgres.cdc.errors import Problem
from ingestion_assets.sources.postgres.cdc.identity import identity_fix, identity_gap
from ingestion_assets.sources.postgres.cdc.keys import DeclaredKey, key_problems
from ingestion_assets.sources.postgres.cdc.publication import (
    TableName,
    ident,
    publication_problems,
    published_tables,
    relkind,
)
from ingestion_assets.sources.postgres.cdc.slots import slot_row
from ingestion_assets.sources.postgres.reader import connect


def check_cdc(
    url: str,
    slot: str,
    publication: str,
    tables: Sequence[TableName],
    expect_slot: bool = True,
    will_publish: bool = False,
    keys: Sequence[DeclaredKey] = (),
) -> list[Problem]:
    """Every reason change capture of `tables` through `slot` and `publication` would fail or miss rows.
    Read-only: it changes nothing on the server.

    With `expect_slot` False, a missing slot is fine (the first sync creates it with a snapshot). With
    `will_publish`, so is a missing publication or table in it (the run adds them once every check passed).
    Each of `keys` (the streams' declared primary keys) must be a key of its table that the log carries.
    """
    conn = connect(url, "ingest-cdc-check")
    try:
        with conn.cursor() as cur:
            problems = _server_problems(cur)
            problems += _slot_problems(cur, slot, expect_slot)
            tables_problems = [p for schema, table in tables for p in _table_problems(cur, schema, table, publication)]
            missing = {p.subject for p in tables_problems if p.message.startswith("does not exist")}
            present = [t for t in tables if f"table {ident(cur, *t)}" not in missing]
            problems += publication_problems(cur, publication, present, will_publish)
            problems += tables_problems
            failed = {p.subject for p in tables_problems}
            problems += [p for k in keys if f"table {ident(cur, *k.table)}" not in failed for p in key_problems(cur, k)]
    finally:
        conn.close()
    return problems


def _setting(cur: PgCursor, name: str) -> str:
    cur.execute("SELECT current_setting(%s)", (name,))
    return str(cur.fetchone()[0])


def _server_problems(cur: PgCursor) -> list[Problem]:
    problems = []
    wal_level = _setting(cur, "wal_level")
    if wal_level != "logical":
        problems.append(
            Problem(
                "server",
                f"wal_level is {wal_level!r}, so the server keeps no logical decoding information; run "
                "ALTER SYSTEM SET wal_level = logical and restart PostgreSQL",
            )
        )
    for name in ("max_replication_slots", "max_wal_senders"):
        if int(_setting(cur, name)) < 1:
            problems.append(Problem("server", f"{name} is 0; set it to at least 1 (ALTER SYSTEM) and restart"))
    cur.execute("SELECT rolreplication OR rolsuper, current_user FROM pg_roles WHERE rolname = current_user")
    allowed, user = cur.fetchone()
    if not allowed:
        problems.append(Problem("server", f"role {user!r} may not stream changes; run ALTER ROLE {user} REPLICATION"))
    return problems


def _slot_problems(cur: PgCursor, slot: str, expect_slot: bool) -> list[Problem]:
    subject = f"slot {slot!r}"
    row = slot_row(cur, slot)
    if row is None:
        cur.execute("SELECT count(*), current_setting('max_replication_slots')::int FROM pg_replication_slots")
        used, allowed = cur.fetchone()
        if used >= allowed:
            return [
                Problem(
                    subject,
                    f"cannot be created: all {allowed} max_replication_slots are used; "
                    "drop an unused slot or raise max_replication_slots and restart",
                )
            ]
        if expect_slot:
            return [
                Problem(
                    subject,
                    "does not exist, although the streams have read from it: the changes since it went are not in "
                    "the log any more, so the streams must be copied again; `ingest cdc status SOURCE` lists the "
                    "`ingest state reset` commands (or set `cdc.on_wal_gap: resync`)",
                )
            ]
        return []
    problems = []
    if row["slot_type"] != "logical" or row["plugin"] != "pgoutput":
        problems.append(
            Problem(
                subject,
                f"is a {row['slot_type']} slot with plugin {row['plugin']!r}, not a pgoutput "
                "logical slot; choose another slot name",
            )
        )
    if row["database"] != row["current_database"]:
        problems.append(
            Problem(
                subject,
                f"belongs to database {row['database']!r}, not {row['current_database']!r}; "
                "slots decode one database: use another slot name",
            )
        )
    if row["active"]:
        pid = row["active_pid"]
        problems.append(
            Problem(
                subject,
                f"is in use by process {pid}; stop that reader, or SELECT pg_terminate_backend({pid})",
                transient=True,
            )
        )
    if row.get("wal_status") == "lost" or row.get("invalidation_reason"):
        problems.append(
            Problem(
                subject,
                "was invalidated: the server removed WAL it needed, so changes were lost; "
                "drop it and take a new snapshot, and raise max_slot_wal_keep_size",
            )
        )
    if row.get("two_phase"):
        problems.append(
            Problem(
                subject, "was created with two_phase; recreate it without (drop_slot, then create_slot_with_snapshot)"
            )
        )
    return problems


def _table_problems(cur: PgCursor, schema: str, table: str, publication: str) -> list[Problem]:
    name = ident(cur, schema, table)
    kind = relkind(cur, schema, table)
    subject = f"table {name}"
    if kind is None:
        return [Problem(subject, "does not exist; check the schema and table name", table=(schema, table))]
    if kind not in ("r", "p"):
        return [
            Problem(subject, f"is not a table (relkind {kind!r}); only tables can be published", table=(schema, table))
        ]
    gap = identity_gap(cur, schema, table)
    if gap is None:
        return []
    fix = identity_fix(cur, schema, table)
    if (schema, table) in published_tables(cur, publication):
        return [
            Problem(
                subject,
                f"{gap} but is in publication {publication!r}, so PostgreSQL rejects the application's UPDATE and "
                f"DELETE on it now; ALTER PUBLICATION {ident(cur, publication)} DROP TABLE {name} at once (a run "
                f"does it for the product's own publication), then {fix}; the stream is then copied again",
                table=(schema, table),
            )
        ]
    return [
        Problem(
            subject,
            f"{gap}, so its updates and deletes carry no key, and once published PostgreSQL would reject the "
            f"application's UPDATE and DELETE on it; it was not published. {fix}",
            table=(schema, table),
        )
    ]
