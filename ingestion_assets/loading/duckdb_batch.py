"""Several tables' slices of one batch into a DuckDB target in ONE transaction, without dlt's load step.

dlt keeps the schema: it creates or alters a table from an empty slice with the load's hints, and only when
the table is missing or a column is new (once per run, typically never). The data moves in SQL on one
connection: the newest version per key, the version guard (a row the target holds at a newer version is
never overwritten), the merge on the key, a truncate, hard deletes (purged) and soft ones (flagged, the last
values kept), the soft-delete marks of rows only the target holds, the parked rows that now loaded leaving
the dead-letter table, and every table's bindings row. One commit makes all of it durable or none of it, so
the checkpoint that follows covers every table of the batch. A dlt load per table instead costs a package's
extract, normalize and load plus dlt's configuration resolution (seconds on a busy machine for a thousand
rows; see BENCHMARKS.md).

A table stream's slice that no target row can match (its first full read into an empty table, an `append`
stream) comes here from `Loader.load` as an `append` slice: inserted from Arrow as it is, with its bindings row.
Every other merge slice of `Loader.load` comes as a `checked` slice: the loader's own version check (a file read
again replaces its rows whatever their versions) and the newest version per key, under the same lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.bindings import write_marker
from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.loading.metadata_columns import DELETED_AT, POSITION
from ingestion_assets.loading.number_order import ordered_position
from ingestion_assets.loading.parked import dead_letter_resource, delete_parked_in
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.versions import check_keys, newest_per_key, quote_name

INCOMING = "_ingest_batch_incoming"
NEWEST = "_ingest_batch_newest"
MARKS = "_ingest_batch_marks"
ROW = "_ingest_batch_row"
_COLUMNS_SQL = "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?"


@dataclass
class TableSlice:
    """One table's part of a batch. `rows`: upserts and delete tombstones in source column names (several
    versions of a key may come: the newest wins); `marks`: soft deletes of rows whose values only the target
    holds (each key column as the log's text, `_ingest_position`, `_ingest_deleted_at`)."""

    loader: Loader
    rows: pa.Table | None = None
    dead_letters: pa.Table | None = None
    marks: pa.Table | None = None
    truncate: bool = False  # the source table was truncated before `rows`
    hard_deletes: bool = False  # tombstones leave the table once merged
    append: bool = False  # no row of the target can match (its first full read, an append stream): inserted as is
    checked: bool = False  # `Loader.load`'s merge: its loader's version check (`check_keys`), not `_newest`


@dataclass(frozen=True)
class SliceLoaded:
    rows: int  # rows merged (stale versions and duplicates left out)
    has_rows: bool | None  # whether the table still holds rows; asked only after a truncate or a hard delete


def batch_loadable(loader: Loader) -> bool:
    """A plain merge into DuckDB on a key (a CDC batch); everything else (lakes, nesting, other SQL) loads through
    `Loader.load`, whose destination-specific paths it needs (its DuckDB appends come back here)."""
    return (
        type(loader) is Loader
        and loader.destination.type == "duckdb"
        and loader.target.write_disposition == "merge"
        and bool(loader.key)
        and loader.max_table_nesting == 0
    )


def load_tables(slices: list[TableSlice]) -> list[SliceLoaded]:
    """Every slice in one transaction; returns after the commit (each loader's binding then says one more
    slice). The slices' loaders share one DuckDB file and dataset (one source's streams)."""
    if not slices:
        return []
    first = slices[0].loader
    strays = [s.loader.target.dataset for s in slices if s.loader.target.dataset != first.target.dataset]
    if strays:
        raise ValueError(f"one batch load takes one dataset's tables: {first.target.dataset} and {strays[0]}")
    for part in slices:
        part.rows = part.loader._with_target_names(part.rows) if part.rows is not None else None
        _park(part)
        _prepare(part)
    markers = [part.loader.next_marker() for part in slices]
    released: list[list[str]] = []
    with first._lock(), first.reused_client() as client, client.begin_transaction():
        done = []
        for part, marker in zip(slices, markers, strict=True):
            loaded, keys = _write(client, part)
            done.append(loaded)
            released.append(keys)
            if marker is not None:
                write_marker(client, part.loader.stream_name, part.loader._bound_partition, marker)
    for part, marker, keys in zip(slices, markers, released, strict=True):
        loader = part.loader
        loader._loads += 1
        if marker is not None:
            loader.bound = marker
        if keys and loader._parked_keys is not None:
            loader._parked_keys -= set(keys)
    return done


def _park(part: TableSlice) -> None:
    """Dead letters go first, through dlt (rare; merged on their key, so a re-read never doubles them)."""
    loader = part.loader
    if part.dead_letters is not None and part.dead_letters.num_rows:
        with loader._lock():
            loader.pipeline.run([dead_letter_resource(part.dead_letters)])
        loader._parked_keys = None
    if loader._parked_keys is None:
        loader._parked_keys = loader.parked()  # once per run: the batch's statements must not fail


def _prepare(part: TableSlice) -> None:
    """The target table with every column of the slice; dlt creates or alters it when one is missing."""
    loader = part.loader
    needed = set(part.rows.column_names) if part.rows is not None else set()
    known = loader._target_columns
    if known is not None and needed <= known:
        return
    columns = _target_columns(loader)
    if part.rows is not None and not needed <= columns:
        import dlt  # a new table or new columns: dlt's schema makes them

        with loader._lock():
            empty = dlt.resource([part.rows.slice(0, 0)], **loader._resource_hints("append"))
            loader._run([empty], "parquet")
        columns = _target_columns(loader)
    loader._target_columns = columns
    loader._known_to_exist = bool(columns)


def _target_columns(loader: Loader) -> frozenset[str]:
    """The columns the target table has now (empty: no such table)."""
    with loader.client() as client:
        rows = client.execute_sql(_COLUMNS_SQL.replace("?", "%s"), client.dataset_name, loader.target.table)
    return frozenset(str(row[0]) for row in rows or ())


def _write(client: Any, part: TableSlice) -> tuple[SliceLoaded, list[str]]:
    loader = part.loader
    if not loader._target_columns:  # no table yet and nothing to create it with: nothing to truncate or mark
        return SliceLoaded(0, False if part.truncate else None), []
    con = client.native_connection
    table = client.make_qualified_table_name(loader.target.table)
    if part.truncate:
        con.execute(f"DELETE FROM {table}")
    merged, released = 0, []
    if part.rows is not None and part.rows.num_rows:
        fresh = part.append  # no target row holds one of its keys
        if part.append:
            newest = part.rows
        elif part.checked:
            newest, fresh = _checked(client, loader, part.rows)
        else:
            newest = _newest(con, table, loader.key, part.rows, loader.target.numeric_position)
        if not fresh:
            _delete_keys(con, table, loader.key, newest)
        _insert(con, table, newest)
        merged, released = newest.num_rows, _release_parked(client, loader, newest)
    if part.marks is not None and part.marks.num_rows:
        _mark(con, table, loader.key, part.marks)
    rows = part.rows
    tombstones = part.hard_deletes and rows is not None and bool(pc.any(pc.is_valid(rows[DELETED_AT])).as_py())
    if tombstones:
        con.execute(f"DELETE FROM {table} WHERE {DELETED_AT} IS NOT NULL")
    has_rows = bool(con.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()) if part.truncate or tombstones else None
    return SliceLoaded(merged, has_rows), released


def _newest(con: Any, table: str, key: tuple[str, ...], rows: pa.Table, numeric: bool = False) -> pa.Table:
    """The newest version per key, without those the target holds at a newer version (`numeric`: versions are
    a numeric's text, compared by value). Only the keys and positions go through SQL: DuckDB's window turns a
    -0.0 it carries into 0.0, so the rows are taken in Arrow."""
    keys = ", ".join(quote_name(k) for k in key)
    match = " AND ".join(f"t.{quote_name(k)} = n.{quote_name(k)}" for k in key)
    mine, ours, theirs = (ordered_position(column, numeric) for column in (POSITION, f"n.{POSITION}", f"t.{POSITION}"))
    numbered = rows.select([*key, POSITION]).append_column(ROW, pa.array(range(rows.num_rows), pa.int64()))
    con.register(INCOMING, numbered)
    try:
        kept = con.sql(
            f"SELECT n.{ROW} FROM (SELECT * FROM {INCOMING} QUALIFY row_number() OVER "
            f"(PARTITION BY {keys} ORDER BY {mine} DESC NULLS LAST) = 1) AS n "
            f"LEFT JOIN {table} AS t ON {match} WHERE NOT coalesce({theirs} > {ours}, false)"
        ).to_arrow_table()
    finally:
        con.unregister(INCOMING)
    indices = pc.unique(kept.column(0).combine_chunks())
    return rows.take(indices.take(pc.array_sort_indices(indices)))  # in their order


def _checked(client: Any, loader: Loader, rows: pa.Table) -> tuple[pa.Table, bool]:
    """What dlt's merge with the loader's version check made of a slice: the keys the target holds at a newer
    version left out (with `version_source`, a row read again from its own file replaces it whatever the versions),
    then the newest version per key (`_ingest_position`, then the later row). Also whether no target row matched."""
    numeric = loader.target.numeric_position
    if not loader.guard_versions:
        return newest_per_key(rows, loader.key, numeric), False
    check = check_keys(
        client, "duckdb", loader.target.table, loader.key, rows, loader.source_column, loader.released_sources, numeric
    )
    return newest_per_key(check.rows, loader.key, numeric), check.existing == 0


def _delete_keys(con: Any, table: str, key: tuple[str, ...], newest: pa.Table) -> None:
    """The target's rows of these keys give way to the newest versions (with `_insert`: a merge on the key)."""
    match = " AND ".join(f"t.{quote_name(k)} = n.{quote_name(k)}" for k in key)
    con.register(NEWEST, newest.select(list(key)))
    try:
        con.execute(f"DELETE FROM {table} AS t USING {NEWEST} AS n WHERE {match}")
    finally:
        con.unregister(NEWEST)


def _insert(con: Any, table: str, rows: pa.Table) -> None:
    """DuckDB reads the Arrow buffers in place, by column name, each value cast to its column's type (as dlt's
    load reads its Parquet file: `INSERT ... BY NAME SELECT * FROM read_parquet(...)`)."""
    con.register(NEWEST, rows)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {NEWEST}")
    finally:
        con.unregister(NEWEST)


def _mark(con: Any, table: str, key: tuple[str, ...], marks: pa.Table) -> None:
    """Flag the rows, keep every value; a row already deleted or at a newer version is left alone."""
    match = " AND ".join(f"t.{quote_name(k)} = m.{quote_name(k)}" for k in key)  # typed as the rows landed
    con.register(MARKS, marks)
    try:
        con.execute(
            f"UPDATE {table} AS t SET {DELETED_AT} = m.{DELETED_AT}, {POSITION} = m.{POSITION} FROM {MARKS} AS m "
            f"WHERE {match} AND t.{DELETED_AT} IS NULL AND (t.{POSITION} IS NULL OR t.{POSITION} < m.{POSITION})"
        )
    finally:
        con.unregister(MARKS)


def _release_parked(client: Any, loader: Loader, newest: pa.Table) -> list[str]:
    """Parked rows of the stream that the target now took leave the dead-letter table (in the transaction)."""
    if not loader._parked_keys or not newest.num_rows:
        return []
    loaded = record_keys(newest, loader.key)
    keys = sorted(set(loaded.to_pylist()) & loader._parked_keys)
    delete_parked_in(client, loader.stream_name, keys)
    return keys
