"""PostgreSQL table streams: ordered keyset reads through COPY into Arrow, one slice at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow.compute as pc
from psycopg2 import sql

from ingestion_assets.sources.postgres.bad_values import mark_problems
from ingestion_assets.sources.postgres.introspect import TableShape, discover_table
from ingestion_assets.sources.postgres.query import SETTLED, Position, ReadPlan, Settled, Window
from ingestion_assets.sources.postgres.reader import connect, copy_batches
from ingestion_assets.sources.slices import Slice, rechunk


def plan_table_read(
    url: str,
    schema: str,
    table: str,
    cursor: tuple[str, ...],
    primary_key: tuple[str, ...],
    max_value_bytes: int = 16 << 20,
    skip_columns: frozenset[str] = frozenset(),
    destination: str = "duckdb",
) -> ReadPlan:
    """Discover the table and check the named columns exist, so a typo fails before any read. The columns land
    as `destination` (duckdb or postgres) holds them."""
    conn = connect(url, "ingest-discover")
    try:
        shape = discover_table(conn, schema, table, destination)
    finally:
        conn.close()
    if skip_columns:
        shape = TableShape(shape.schema, shape.table, tuple(c for c in shape.columns if c.name not in skip_columns))
    names = {c.name for c in shape.columns}
    for role, columns in (("cursor", cursor), ("primary_key", primary_key)):
        missing = [c for c in columns if c not in names]
        if missing:
            raise LookupError(f"{role} column(s) {missing} not in {schema}.{table}; it has {sorted(names)}")
    return ReadPlan(
        shape=shape,
        cursor=cursor,
        primary_key=primary_key,
        max_value_bytes=max_value_bytes,
    )


def dry_run(url: str, plan: ReadPlan) -> None:
    """Run the stream's real read with `LIMIT 0`: a query the server cannot run fails here, before a sync."""
    conn = connect(url, "ingest-check")
    try:
        with conn.cursor() as cur:
            cur.execute(plan.dry_run_statement(conn))
    finally:
        conn.close()


def table_slices(
    url: str,
    plan: ReadPlan,
    after: Position | None,
    slice_rows: int,
    name: str,
    window: Window | None = None,
    keys: Sequence[Sequence[str | None]] | None = None,
    snapshot: str | None = None,
    settled: Settled | None = None,
    limit: int | None = None,
) -> Iterator[Slice]:
    """Every row of `window` after `after` (or with one of `keys`), in (cursor, primary key) order, as slices
    (only the first `limit` rows, with one).

    With `settled`, a slice's position is its last settled row's (or the one before it, if none is): rows
    past it are loaded now and read again next time, when no open transaction can still commit before them."""
    conn = connect(url, f"ingest:{name}")
    try:
        statement = plan.copy_statement(conn, after, window, keys_in=keys, settled=settled, limit=limit)
    finally:
        conn.close()
    shape = plan.wire_shape if settled is None else plan.settled_wire_shape
    batches = copy_batches(url, statement, shape, f"ingest:{name}", snapshot=snapshot)
    checked = [column.name for column, _ in plan.checks]
    position = after if settled is None else settled.floor
    for index, table in enumerate(rechunk(batches, slice_rows)):
        if settled is not None:
            eligible = pc.indices_nonzero(table.column(SETTLED))
            table = table.drop_columns([SETTLED])
        marked = mark_problems(table, plan.shape, checked, plan.max_value_bytes)
        if settled is None:
            position = plan.position_of_last_row(marked)
        elif len(eligible):
            position = plan.position_of_last_row(marked, int(eligible[-1].as_py()))
        yield Slice(table=marked, position=position, index=index)


def key_bounds(url: str, plan: ReadPlan, column: str) -> tuple[int, int] | None:
    """The smallest and largest value of an integer column (None for an empty table)."""
    kind = plan.shape.column(column).type_name
    if kind not in ("int2", "int4", "int8"):
        raise LookupError(f"key partitions need an integer column; {column!r} is {kind}")
    conn = connect(url, "ingest-plan")
    try:
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT min({c}), max({c}) FROM {t}").format(
                    c=sql.Identifier(column), t=sql.Identifier(plan.shape.schema, plan.shape.table)
                )
            )
            low, high = cur.fetchone() or (None, None)
    finally:
        conn.close()
    return None if low is None or high is None else (int(low), int(high))


def occupied_buckets(url: str, schema: str, table: str, column: str, chunk: int) -> set[int]:
    """`floor(key / chunk)` of every row of an integer key column: the ranges of `chunk` keys that hold rows
    (one index-only scan of the key)."""
    conn = connect(url, "ingest-plan")
    try:
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT DISTINCT floor({c}::numeric / %s)::bigint FROM {t}").format(
                    c=sql.Identifier(column), t=sql.Identifier(schema, table)
                ),
                (chunk,),
            )
            return {int(row[0]) for row in cur.fetchall()}
    finally:
        conn.close()


def __getattr__(name: str) -> Any:
    """`postgres_table`, the standalone dlt resource (the whole table as Arrow tables, one per slice), is made when
    it is first asked for: a stream's run reads through `table_slices` and imports dlt only when it loads."""
    if name != "postgres_table":
        raise AttributeError(name)
    import dlt

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

    globals()["postgres_table"] = postgres_table
    return postgres_table
