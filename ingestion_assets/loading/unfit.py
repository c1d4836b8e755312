"""Values a destination cannot hold as they are: the rows holding them are parked as dead letters with the
column and the reason, never loaded altered and never allowed to fail the slice (the rest of it loads).

MariaDB's DOUBLE has no NaN or infinity and its DATE/DATETIME span the years 1000-9999; the lake formats' readers
(delta-rs, pyiceberg, Spark) hold the years 1-9999 (a PostgreSQL `infinity`, a BC date or the year 10000 made
Delta's writer panic and pyiceberg's fail, failing the whole stream). PostgreSQL reaches 4713 BC and 294276 AD.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.dead_letters import DEAD_LETTER_SCHEMA, record_keys
from ingestion_assets.loading.metadata_columns import POSITION


@dataclass(frozen=True)
class Holds:
    """What a destination holds: the span of years of its dates and times, and whether its floats hold NaN."""

    dates: str  # what holds the dates and times, e.g. "MariaDB's DATE/DATETIME"
    floats: str  # what holds the floating-point values
    min_year: int
    max_year: int
    nan: bool = True


MARIADB = Holds("MariaDB's DATE/DATETIME", "MariaDB's DOUBLE/FLOAT", 1000, 9999, nan=False)
LAKE = Holds("the lake table format's readers", "the lake table format's readers", 1, 9999)


def unfit_reasons(table: pa.Table, holds: Holds) -> list[str | None]:
    """Per row: why the destination cannot hold it as it is (None: it can)."""
    reasons: list[str | None] = [None] * table.num_rows
    for name in table.column_names:
        column = table.column(name)
        kind = column.type
        if pa.types.is_floating(kind) and not holds.nan:
            bad = pc.or_(pc.is_nan(column), pc.is_inf(column))
            why = f"column {name}: {holds.floats} holds no NaN or infinity"
        elif pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            years = pc.year(column)
            bad = pc.or_(pc.less(years, holds.min_year), pc.greater(years, holds.max_year))
            why = f"column {name}: {holds.dates} span the years {holds.min_year}-{holds.max_year}"
        else:
            continue
        for index in pc.indices_nonzero(pc.fill_null(bad, False)).to_pylist():
            if reasons[index] is None:
                reasons[index] = why
    return reasons


def split_unfit(
    table: pa.Table,
    holds: Holds,
    where: str,
    stream: str,
    partition: str,
    primary_key: tuple[str, ...],
    run_id: str,
) -> tuple[pa.Table, pa.Table | None]:
    """The rows the destination holds, and dead letters of the others (None: every row fits)."""
    reasons = unfit_reasons(table, holds)
    if not any(reasons):
        return table, None
    unfit = pa.array([r is not None for r in reasons])
    parked = table.filter(unfit)
    now = dt.datetime.now(dt.UTC)
    keys = record_keys(parked, primary_key).to_pylist()
    records: list[dict[str, Any]] = []
    texts = as_text_temporals(parked).to_pylist()
    for key, reason, row in zip(keys, [r for r in reasons if r is not None], texts, strict=True):
        records.append(
            {
                "stream": stream,
                "partition": partition,
                "record_key": key,
                "run_id": run_id,
                "position": json.dumps({POSITION: row.get(POSITION)}, default=str),
                "error": f"{where} cannot hold this row: {reason}",
                "raw_record": json.dumps(row, default=str),
                "dead_lettered_at": now,
            }
        )
    return table.filter(pc.invert(unfit)), pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)


def with_parked(dead_letters: pa.Table | None, parked: pa.Table | None) -> pa.Table | None:
    if parked is None:
        return dead_letters
    return parked if dead_letters is None else pa.concat_tables([dead_letters, parked])


def as_text_temporals(rows: pa.Table) -> pa.Table:
    """Dates and times as Arrow's own text: Python's datetime stops at the year 9999 (a Parquet timestamp of the
    year 10000 would raise while being parked), and parking must never fail on the value it parks."""
    for index, kind in enumerate(rows.schema.types):
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            rows = rows.set_column(index, rows.field(index).name, pc.cast(rows.column(index), pa.string()))
    return rows
