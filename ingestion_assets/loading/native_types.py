"""Values in the form a PostgreSQL destination's CSV load reads exactly (the destination's own column types are
loading/type_mappers.py's)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.postgres import temporal

CSV_SAFE = {  # what Arrow's CSV writer prints as PostgreSQL reads it: four-digit years AD, no infinity
    "date": (temporal.days_from_civil(1, 1, 1), temporal.days_from_civil(10000, 1, 1) - 1),
    "timestamp": (
        temporal.days_from_civil(1, 1, 1) * temporal.US_PER_DAY,
        temporal.days_from_civil(10000, 1, 1) * temporal.US_PER_DAY - 1,
    ),
    "time": (0, temporal.US_PER_DAY - 1),
}


def for_postgres(table: pa.Table) -> pa.Table:
    """dlt loads PostgreSQL through CSV written by Arrow, which prints infinity as a year-294247 timestamp (a
    different value PostgreSQL would accept) and BC dates in a form it refuses. A temporal column holding such
    a value travels as PostgreSQL's text instead (rare, so per value). Bytes travel as bytea's hex text: Arrow
    would write them raw, which fails on bytes that are not UTF-8 and reads back changed where they hold a
    backslash. Every other column is left alone."""
    for index, field in enumerate(table.schema):
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            hexed = [None if v is None else "\\x" + v.hex() for v in table.column(index).to_pylist()]
            table = table.set_column(index, field.name, pa.array(hexed, pa.string()))
            continue
        kind = temporal_kind(field.type)
        if kind is None or table.column(index).null_count == table.num_rows:
            continue
        storage = pa.int32() if kind == "date" else pa.int64()
        integers = pc.cast(table.column(index), storage)
        low, high = CSV_SAFE["timestamp" if kind.startswith("timestamp") else kind]
        bounds = pc.min_max(integers)
        if bounds["min"].as_py() >= low and bounds["max"].as_py() <= high:
            continue
        texts = [None if v is None else temporal.format_value(v, kind) for v in integers.to_pylist()]
        table = table.set_column(index, field.name, pa.array(texts, pa.string()))
    return table


def temporal_kind(arrow_type: pa.DataType) -> str | None:
    if pa.types.is_timestamp(arrow_type):
        return "timestamptz" if arrow_type.tz else "timestamp"
    if pa.types.is_date32(arrow_type):
        return "date"
    if pa.types.is_time64(arrow_type):
        return "time"
    return None
