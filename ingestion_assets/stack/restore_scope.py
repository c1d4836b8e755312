"""What a storage restore rolls back besides Dagster's storage: the other databases on the embedded server.

A restore recovers the whole embedded server (PostgreSQL's point-in-time recovery has no per-database scope),
so a source or target database that lives there (the demo's `{embedded: shop}`) loses every write after `--to`
too. Such a restore is refused unless asked for by name (`--include-other-databases`)."""

from __future__ import annotations

import contextlib
import datetime as dt

import psycopg2

from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets.stack.instance import DAGSTER_DATABASE
from ingestion_assets.stack.recovery import RestoreRefused

FLAG = "--include-other-databases"


def other_databases(server: EmbeddedPostgres) -> list[str]:
    """The databases on `server` other than Dagster's storage, `postgres` and the templates."""
    with contextlib.closing(psycopg2.connect(server.url())) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT datname FROM pg_database WHERE NOT datistemplate AND datname <> ALL(%s) ORDER BY 1",
            (["postgres", DAGSTER_DATABASE],),
        )
        return [str(row[0]) for row in cur.fetchall()]


def refuse_other_databases(to: dt.datetime, databases: list[str], include: bool) -> None:
    """Refuse a restore that would roll back databases the user did not name as acceptable to lose."""
    if databases and not include:
        raise RestoreRefused(
            f"the embedded server also holds database(s) {', '.join(databases)}: a restore recovers the whole "
            f"server, so they would lose every write after {to.isoformat()} too (a source or target there loses "
            f"rows), and the server moves to another port. Move them off the embedded server first, or pass {FLAG} "
            "to roll them back as well: nothing was changed"
        )
