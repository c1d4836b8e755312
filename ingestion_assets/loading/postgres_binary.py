"""Arrow slices as PostgreSQL's binary COPY format (encoded by pgpq), for the columns whose value it carries exactly.

The server then stores each value as sent instead of parsing CSV text (numeric, timestamptz and jsonb parsing was
most of a slice's COPY). Binary COPY carries no type per field: each field's bytes go to the target column's own
receive function, so a column travels in binary only where the Arrow type's encoding is that column type's binary
form; `binary_plan` returns None for any other slice, which then takes the CSV path (postgres_merge.CsvStream) as
before, value for value:

- strings into a type other than text, varchar, bpchar, json or jsonb (numeric without a precision, uuid,
  interval, arrays, ranges, inet ... land as PostgreSQL's text: their binary forms differ from it);
- dates, times and timestamps outside the range native_types.for_postgres keeps as values (infinity, BC, years
  past 9999: our Arrow holds infinity as DuckDB's sentinel, which binary COPY would store as a finite instant);
- any Arrow type not listed in `_RECEIVERS` (nanosecond timestamps, lists, dictionaries ...), and domains.
"""

from __future__ import annotations

from typing import Any

import pgpq
import pyarrow as pa
import pyarrow.compute as pc
from pgpq import encoders
from pgpq._pgpq import Jsonb

from ingestion_assets.loading.native_types import CSV_SAFE, temporal_kind

_BATCH_ROWS = 65536
# Arrow type -> the target column types (pg_type.typname) whose receive function reads pgpq's encoding of it.
_RECEIVERS: dict[pa.DataType, frozenset[str]] = {
    pa.int16(): frozenset({"int2"}),
    pa.int32(): frozenset({"int4"}),
    pa.int64(): frozenset({"int8"}),
    pa.float32(): frozenset({"float4"}),
    pa.float64(): frozenset({"float8"}),
    pa.bool_(): frozenset({"bool"}),
    pa.date32(): frozenset({"date"}),
    pa.time64("us"): frozenset({"time"}),
    pa.timestamp("us"): frozenset({"timestamp"}),
    pa.binary(): frozenset({"bytea"}),
    pa.large_binary(): frozenset({"bytea"}),
}
_TEXT_RECEIVERS = frozenset({"text", "varchar", "bpchar", "json"})  # the UTF-8 bytes as they are (NUL refused)


def column_types(cursor: Any, table: str) -> dict[str, str]:
    """Each column's type name (pg_type.typname; a domain keeps its own name, so it is never sent in binary)."""
    cursor.execute(
        "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (table,),
    )
    return {str(name): str(kind) for name, kind in cursor.fetchall()}


def binary_plan(table: pa.Table, types: dict[str, str]) -> dict[str, Any] | None:
    """pgpq's encoder for each column, or None when one column cannot travel in binary exactly."""
    plan: dict[str, Any] = {}
    for field in table.schema:
        builder = _encoder(field, types.get(field.name), table.column(field.name))
        if builder is None:
            return None
        plan[field.name] = builder
    return plan


def _encoder(field: pa.Field, target: str | None, column: pa.ChunkedArray) -> Any:
    kind = field.type
    if target is None:
        return None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        builder = encoders.StringEncoderBuilder if pa.types.is_string(kind) else encoders.LargeStringEncoderBuilder
        if target == "jsonb":  # jsonb's binary form: a version byte, then the text
            return builder.new_with_output(field, Jsonb())
        return builder(field) if target in _TEXT_RECEIVERS else None
    if pa.types.is_decimal128(kind):
        return encoders.Decimal128EncoderBuilder(field) if target == "numeric" else None
    if pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz is not None:
        accepted: frozenset[str] = frozenset({"timestamptz"})  # an instant: the zone is Arrow's display only
    else:
        accepted = _RECEIVERS.get(kind, frozenset())
    if target not in accepted or not _within_values(kind, column):
        return None
    return pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(field)


def _within_values(kind: pa.DataType, column: pa.ChunkedArray) -> bool:
    """Dates and times within the range both Arrow's and PostgreSQL's calendars agree on, infinity excluded."""
    temporal = temporal_kind(kind)
    if temporal is None or column.null_count == len(column):
        return True
    integers = pc.cast(column, pa.int32() if temporal == "date" else pa.int64())
    bounds = pc.min_max(integers)
    low, high = CSV_SAFE["timestamp" if temporal.startswith("timestamp") else temporal]
    return bool(bounds["min"].as_py() >= low and bounds["max"].as_py() <= high)


class BinaryStream:
    """A file-like object COPY … (FORMAT binary) reads: pgpq's encoding of one record batch at a time."""

    def __init__(self, table: pa.Table, plan: dict[str, Any]) -> None:
        self._encoder = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(table.schema, plan)
        self._batches = iter(table.to_batches(max_chunksize=_BATCH_ROWS))
        self._buffer = self._encoder.write_header()
        self._offset = 0
        self._done = False

    def read(self, size: int = -1) -> bytes:
        """At most `size` bytes (fewer at a batch's end: COPY reads until it gets nothing)."""
        while self._offset >= len(self._buffer):
            if self._done:
                return b""
            batch = next(self._batches, None)
            if batch is None:
                self._buffer, self._done = self._encoder.finish(), True
            else:
                self._buffer = self._encoder.write_batch(batch)
            self._offset = 0
        end = len(self._buffer) if size < 0 else min(self._offset + size, len(self._buffer))
        chunk, self._offset = self._buffer[self._offset : end], end
        return chunk
