"""A slice into a PostgreSQL target in one transaction: COPY (binary where every column's value travels exactly,
see postgres_binary.py, else CSV; both streamed from the Arrow batches) into a temporary staging table, then
one set-based `INSERT … ON CONFLICT DO UPDATE` with the version guard.

dlt's own load of the same slice writes CSV files, opens a load package, copies into its staging dataset and
merges by DELETE + INSERT without an index: about a third of what COPY allows. Here the slice never touches
disk, the merge is one statement driven by a unique index on the key, and the bindings row commits in the
same transaction (see Loader.load), so a crash leaves the target before or after the slice, never between.
ON CONFLICT rather than MERGE: under READ COMMITTED, two writers inserting one new key make MERGE fail with a
unique violation, while ON CONFLICT waits for the other and then applies the guard to the committed row.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.native_types import for_postgres
from ingestion_assets.loading.number_order import ordered_position
from ingestion_assets.loading.postgres_binary import BinaryStream, binary_plan, column_types
from ingestion_assets.loading.versions import newest_per_key, released_sql

STAGE = "_ingest_stage"
_CSV = pacsv.WriteOptions(include_header=False, batch_size=8192)


@dataclass(frozen=True)
class SliceWrite:
    """What one slice does to its table: `append` COPYs straight in, `merge` goes through the stage."""

    table: str  # qualified and quoted
    key: tuple[str, ...]  # primary key columns, as the target names them
    mode: str  # append | replace | merge
    guard: bool = False  # keep the target's row where its version is newer (several writers)
    bytewise: bool = False  # the version is text: compare it with COLLATE "C"
    numeric: bool = False  # the version is a numeric's text: compare it by value (loading/number_order.py)
    source: str | None = None  # files: a row read again from the same file replaces its own (versions.check_keys)
    released: frozenset[str] = frozenset()  # files gone from the source: their rows are never newer
    keyed: bool = False  # the target has its unique index on the key (a merge may then try COPY straight in)


class CsvStream:
    """A file-like object COPY reads: CSV of one record batch at a time, so a slice is never held twice."""

    def __init__(self, table: pa.Table) -> None:
        self._batches = iter(table.to_batches(max_chunksize=65536))
        self._buffer = b""
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        """At most `size` bytes (fewer at a batch's end: COPY reads until it gets nothing)."""
        while self._offset >= len(self._buffer):
            batch = next(self._batches, None)
            if batch is None:
                return b""
            sink = pa.BufferOutputStream()
            pacsv.write_csv(batch, sink, write_options=_CSV)
            self._buffer, self._offset = sink.getvalue().to_pybytes(), 0
        end = len(self._buffer) if size < 0 else min(self._offset + size, len(self._buffer))
        chunk, self._offset = self._buffer[self._offset : end], end
        return chunk


def csv_ready(table: pa.Table) -> pa.Table:
    """Timestamps with a time zone travel as UTC wall time (the transaction's TimeZone is UTC): Arrow's CSV
    writer formats zoned timestamps ~40 times slower than naive ones (the bench table's two such columns
    cost more than the rest of the slice)."""
    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            naive = pc.cast(table.column(index), pa.timestamp(field.type.unit))
            table = table.set_column(index, field.name, naive)
    return table


def write_slice(cursor: Any, write: SliceWrite, table: pa.Table, target_columns: list[str]) -> int:
    """Run inside the caller's transaction; returns how many rows the target took (stale versions skipped)."""
    cursor.execute("SET LOCAL TimeZone = 'UTC'")
    types = column_types(cursor, write.table)  # the stage is made LIKE the target: the same types
    if write.mode == "replace":
        cursor.execute(f"TRUNCATE {write.table}")
    if write.mode in ("append", "replace"):
        copy_slice(cursor, write.table, table, types)
        return int(table.num_rows)
    if write.keyed and _new_keys_only(cursor, write, table) and _copied_straight_in(cursor, write, table, types):
        return int(table.num_rows)
    unique = newest_per_key(table, write.key, write.numeric)
    cursor.execute("SET LOCAL work_mem = '256MB'")  # the stage's hash join and sort stay in memory
    cursor.execute(f"CREATE TEMP TABLE {STAGE} (LIKE {write.table}) ON COMMIT DROP")
    copy_slice(cursor, STAGE, unique, types)
    cursor.execute(upsert_sql(write, table.column_names, target_columns))
    taken = int(cursor.rowcount)
    return int(table.num_rows) - (int(unique.num_rows) - taken)


def _new_keys_only(cursor: Any, write: SliceWrite, table: pa.Table) -> bool:
    """Whether the target holds no key within the slice's range (an integer key: a backfill range, a first
    snapshot): then the slice needs no stage. Only a hint: the unique index is what guarantees it."""
    if len(write.key) != 1 or not pa.types.is_integer(table.schema.field(write.key[0]).type):
        return False
    bounds = pc.min_max(table.column(write.key[0]))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    key = quote(write.key[0])
    cursor.execute(f"SELECT 1 FROM {write.table} WHERE {key} BETWEEN %s AND %s LIMIT 1", (low, high))
    return cursor.fetchone() is None


def copy_slice(cursor: Any, target: str, table: pa.Table, types: dict[str, str]) -> None:
    """COPY the slice into `target` (of column types `types`): in binary when every column travels exactly so,
    else as CSV. A binary COPY the server refuses (a value its type rejects, such as a NUL in text) is taken
    back and the slice sent as CSV instead, so a slice fails, or loads, exactly as the CSV path alone did."""
    columns = ", ".join(quote(name) for name in table.column_names)
    plan = binary_plan(table, types)
    if plan is not None:
        cursor.execute("SAVEPOINT _ingest_binary")
        try:
            statement = f"COPY {target} ({columns}) FROM STDIN (FORMAT binary)"
            cursor.copy_expert(statement, BinaryStream(table, plan), size=1 << 20)
        except psycopg2.DataError:
            cursor.execute("ROLLBACK TO SAVEPOINT _ingest_binary")
        else:
            cursor.execute("RELEASE SAVEPOINT _ingest_binary")
            return
    cursor.copy_expert(_copy_sql(target, columns), CsvStream(csv_ready(for_postgres(table))), size=1 << 20)


def _copied_straight_in(cursor: Any, write: SliceWrite, table: pa.Table, types: dict[str, str]) -> bool:
    """COPY into the target under a savepoint; a key that is there after all (another writer, a key twice
    in the slice) violates the unique index and the slice goes through the stage instead."""
    cursor.execute("SAVEPOINT _ingest_direct")
    try:
        copy_slice(cursor, write.table, table, types)
    except psycopg2.errors.UniqueViolation:
        cursor.execute("ROLLBACK TO SAVEPOINT _ingest_direct")
        return False
    cursor.execute("RELEASE SAVEPOINT _ingest_direct")
    return True


def upsert_sql(write: SliceWrite, slice_columns: list[str], target_columns: list[str]) -> str:
    """Every non-key column takes the incoming value, NULL where the slice lacks the column (a column the
    source dropped): the row is replaced whole, as dlt's delete-and-insert merge did."""
    columns = ", ".join(quote(name) for name in slice_columns)
    updated = [c for c in target_columns if c not in write.key and not c.startswith("_dlt_")]
    assignments = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in updated)
    action = f"DO UPDATE SET {assignments}" if assignments else "DO NOTHING"
    statement = (
        f"INSERT INTO {write.table} AS t ({columns}) SELECT {columns} FROM {STAGE} "
        f"ON CONFLICT ({', '.join(quote(k) for k in write.key)}) {action}"
    )
    if write.guard and assignments and POSITION in target_columns:
        # text versions (several cursor columns) order bytewise; see metadata_columns.sortable_text
        collate = ' COLLATE "C"' if write.bytewise else ""
        target, incoming = (ordered_position(f"{side}.{POSITION}", write.numeric) for side in ("t", "EXCLUDED"))
        newer = f"{target}{collate} > {incoming}{collate}"
        if write.source is not None and write.source in target_columns:
            newer += f" AND t.{quote(write.source)} IS DISTINCT FROM EXCLUDED.{quote(write.source)}"
            newer += released_sql("t", write.source, write.released)
        statement += f" WHERE ({newer}) IS NOT TRUE"
    return statement


def _copy_sql(table: str, columns: str) -> str:
    return f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT CSV, NULL '', ENCODING 'utf-8')"


def target_columns(cursor: Any, table: str) -> list[str]:
    """The table's columns in order; empty when there is no such table (asked without a failing statement)."""
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        (table,),
    )
    return [str(row[0]) for row in cursor.fetchall()]


def ensure_unique_key(cursor: Any, table: str, name: str, key: tuple[str, ...]) -> bool:
    """ON CONFLICT needs a unique index on the key; dlt creates none. Made once per table: free on the empty
    table dlt just created, one index build on a table an earlier version loaded. True if it was made."""
    cursor.execute(
        "SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indisvalid "
        "AND i.indpred IS NULL AND i.indexprs IS NULL AND (SELECT array_agg(a.attname::text ORDER BY a.attname) "
        "FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) = %s::text[]",
        (table, sorted(key)),
    )
    if cursor.fetchone() is not None:
        return False
    index = quote(f"{name[:40]}_{zlib.crc32(name.encode()):08x}_ingest_key")
    cursor.execute(f"CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {table} ({', '.join(quote(k) for k in key)})")
    return True


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
