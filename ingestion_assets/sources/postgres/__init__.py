"""PostgreSQL table streams: ordered keyset reads through COPY into Arrow, one slice at a time."""

from __future__ import annotations

from collections.abc import Iterator

import dlt

from ingestion_assets.sources.postgres.introspect import discover_table
from ingestion_assets.sources.postgres.query import Position, ReadPlan
from ingestion_assets.sources.postgres.reader import connect, copy_batches
from ingestion_assets.sources.slices import Slice, rechunk


def plan_table_read(
    url: str, schema: str, table: str, cursor: tuple[str, ...], primary_key: tuple[str, ...]
) -> ReadPlan:
    """Discover the table and check the named columns exist, so a typo fails before any read."""
    conn = connect(url, "ingest-discover")
    try:
        shape = discover_table(conn, schema, table)
    finally:
        conn.close()
    names = {c.name for c in shape.columns}
    for role, columns in (("cursor", cursor), ("primary_key", primary_key)):
        missing = [c for c in columns if c not in names]
        if missing:
            raise LookupError(f"{role} column(s) {missing} not in {schema}.{table}; it has {sorted(names)}")
    return ReadPlan(shape=shape, cursor=cursor, primary_key=primary_key)


def table_slices(url: str, plan: ReadPlan, after: Position | None, slice_rows: int, name: str) -> Iterator[Slice]:
    """Every row after `after`, in (cursor, primary key) order, as slices of `slice_rows` rows."""
    conn = connect(url, f"ingest:{name}")
    try:
        statement = plan.copy_statement(conn, after)
    finally:
        conn.close()
    batches = copy_batches(url, statement, plan.shape, application_name=f"ingest:{name}")
    for index, table in enumerate(rechunk(batches, slice_rows)):
        yield Slice(table=table, position=plan.position_of_last_row(table), index=index)


@dlt.resource(standalone=True)
def postgres_table(
    url: str,
    schema: str,
    table: str,
    primary_key: tuple[str, ...],
    cursor: tuple[str, ...] = (),
    slice_rows: int = 250_000,
) -> Iterator[object]:
    """Standalone use without Dagster: the whole table as Arrow tables, one per slice."""
    plan = plan_table_read(url, schema, table, cursor, primary_key)
    for piece in table_slices(url, plan, None, slice_rows, name=table):
        yield piece.table
