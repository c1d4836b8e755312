"""Rows that cannot load are parked in `_ingest_dead_letter` with their reason, never dropped.

The source marks such rows (see sources/postgres/bad_values.py); here a slice is split into the rows
that load and the dead letters, or, with `on_bad_value: null`, the rows load with the value nulled and
the reason in `_ingest_meta`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.catalog import DeadLetters
from ingestion_assets.sources.postgres.bad_values import PROBLEMS, RAW

DEAD_LETTER_TABLE = "_ingest_dead_letter"
DEAD_LETTER_KEY = ("stream", "partition", "record_key")
DEAD_LETTER_HINTS: dict[str, dict[str, Any]] = {
    "stream": {"data_type": "text", "nullable": False, "primary_key": True},
    "partition": {"data_type": "text", "nullable": False, "primary_key": True},
    "record_key": {"data_type": "text", "nullable": False, "primary_key": True},
    "run_id": {"data_type": "text", "nullable": True},
    "position": {"data_type": "json", "nullable": True},
    "error": {"data_type": "text", "nullable": False},
    "raw_record": {"data_type": "json", "nullable": True},
    "dead_lettered_at": {"data_type": "timestamp", "timezone": True, "precision": 6, "nullable": False},
}


@dataclass(frozen=True)
class Split:
    rows: pa.Table  # what loads (without the problems and raw columns)
    meta: pa.Array | None  # `_ingest_meta` per loaded row when values were nulled
    dead: pa.Table | None  # dead-letter records
    nulled: int = 0

    @property
    def dead_count(self) -> int:
        return 0 if self.dead is None else int(self.dead.num_rows)


def split_bad_rows(
    table: pa.Table,
    stream: str,
    partition: str | None,
    run_id: str,
    primary_key: Sequence[str],
    ordering: Sequence[str],
    on_bad_value: str,
) -> Split:
    if PROBLEMS not in table.column_names:
        return Split(table, None, None)
    problems = table.column(PROBLEMS)
    clean = table.drop_columns([PROBLEMS, RAW])
    bad = pc.is_valid(problems)
    if not pc.any(bad).as_py():
        return Split(clean, None, None)
    if on_bad_value == "null":
        notes = [None if p is None else json.dumps({"nulled": p}) for p in problems.to_pylist()]
        return Split(clean, pa.array(notes, pa.string()), None, nulled=sum(n is not None for n in notes))
    bad_rows = table.filter(bad)
    now = dt.datetime.now(dt.UTC)
    records = []
    keys = record_keys(bad_rows, primary_key).to_pylist()
    for key, row in zip(keys, bad_rows.select([PROBLEMS, RAW]).to_pylist(), strict=True):
        raw = json.loads(row[RAW]) if row[RAW] else {}
        records.append(
            {
                "stream": stream,
                "partition": partition or "",
                "record_key": key,
                "run_id": run_id,
                "position": json.dumps({name: raw.get(name) for name in ordering}, default=str),
                "error": row[PROBLEMS],
                "raw_record": row[RAW],
                "dead_lettered_at": now,
            }
        )
    dead = pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)
    return Split(clean.filter(pc.invert(bad)), None, dead)


def record_keys(table: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """A row's primary key as text, the values joined by '|' (what `ingest dlq list` shows)."""
    parts = [pc.fill_null(pc.cast(table.column(k), pa.string()), "") for k in primary_key]
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "|")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("partition", pa.string()),
        ("record_key", pa.string()),
        ("run_id", pa.string()),
        ("position", pa.string()),
        ("error", pa.string()),
        ("raw_record", pa.string()),
        ("dead_lettered_at", pa.timestamp("us", tz="UTC")),
    ]
)


class DeadLetterThreshold(RuntimeError):
    """So many rows could not load that the mapping, not the data, is likely wrong."""

    transient = False


def dead_letter_limit(stream: str, limits: DeadLetters, result: Any) -> None:
    """Stop the stream (after its slice is safe) when too many rows could not load."""
    too_many = limits.max_count is not None and result.dead_letters > limits.max_count
    share = result.dead_letters / result.rows if result.rows else 0.0
    too_high = result.rows >= limits.min_rows and share > limits.max_share
    if too_many or too_high:
        raise DeadLetterThreshold(
            f"stream {stream}: {result.dead_letters:,} of {result.rows:,} rows read could not load "
            f"({share:.1%}; limits: {limits.max_count} rows, {limits.max_share:.0%}). So many bad rows usually "
            f"mean a mapping error: see `ingest dlq list {stream}`, fix the catalog or the source, "
            f"then `ingest dlq replay {stream}`. Every good row and the parked ones are committed."
        )
