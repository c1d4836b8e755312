"""Rows that cannot load are parked in `_ingest_dead_letter` with their reason, never dropped.

The source marks such rows (see sources/postgres/bad_values.py); here a slice is split into the rows
that load and the dead letters, or, with `on_bad_value: null`, the rows load with the value nulled and
the reason in `_ingest_meta`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.catalog import DeadLetters
from ingestion_assets.sources.postgres import values
from ingestion_assets.sources.postgres.bad_values import PROBLEMS, RAW

DEAD_LETTER_TABLE = "_ingest_dead_letter"
NULL_KEY = "\\N"  # a NULL among a parked row's key values, in its record_key (COPY's text for NULL)
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
    table, keyless = _null_keys(table, stream, primary_key)
    problems = table.column(PROBLEMS)
    clean = table.drop_columns([PROBLEMS, RAW])
    bad = pc.is_valid(problems)
    if not pc.any(bad).as_py():
        return Split(clean, None, None)
    if on_bad_value == "null":  # a value is nulled and its row loads; a row without its key cannot load: parked
        parked = [False] * table.num_rows if keyless is None else keyless.to_pylist()
        notes = [
            None if p is None or off else json.dumps({"nulled": p})
            for p, off in zip(problems.to_pylist(), parked, strict=True)
        ]
        kept = [not off for off in parked]
        meta = pa.array([n for n, keep in zip(notes, kept, strict=True) if keep], pa.string())
        dead = None
        if keyless is not None:
            dead = _dead_letters(table.filter(keyless), stream, partition, run_id, primary_key, ordering)
        return Split(clean.filter(pa.array(kept)), meta, dead, nulled=sum(n is not None for n in notes))
    dead = _dead_letters(table.filter(bad), stream, partition, run_id, primary_key, ordering)
    return Split(clean.filter(pc.invert(bad)), None, dead)


def _dead_letters(
    bad_rows: pa.Table,
    stream: str,
    partition: str | None,
    run_id: str,
    primary_key: Sequence[str],
    ordering: Sequence[str],
) -> pa.Table | None:
    """The dead-letter records of `bad_rows` (each with its problems and raw record; None: no row)."""
    if bad_rows.num_rows == 0:
        return None
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
    return pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)


def _null_keys(table: pa.Table, stream: str, primary_key: Sequence[str]) -> tuple[pa.Table, pa.Array | None]:
    """Name in `_ingest_problems` the rows with a NULL in a key column (a table or view whose declared key the
    source does not hold NOT NULL): the merge cannot key them, and a NOT NULL key column fails the whole load.
    Returns the table and the mask of those rows (None: every row has its key)."""
    present = [k for k in primary_key if k in table.column_names]
    masks = {k: pc.is_null(table.column(k)).combine_chunks() for k in present if table.column(k).null_count}
    if not masks:
        return table, None
    keyless = functools.reduce(pc.or_, masks.values())
    flags = {k: mask.to_pylist() for k, mask in masks.items()}
    problems, raws = table.column(PROBLEMS).to_pylist(), table.column(RAW).to_pylist()
    for index in pc.indices_nonzero(keyless).to_pylist():
        nulls = [k for k in present if k in flags and flags[k][index]]
        others = ", ".join(f"{k}={values.plain(table.column(k)[index])!r}" for k in present if k not in nulls)
        why = (
            f"stream {stream}: key column {', '.join(map(repr, nulls))} is null: the row cannot be merged on "
            f"primary_key {list(primary_key)}" + (f" (its other key values: {others})" if others else "")
        )
        problems[index] = problems[index] or why  # a key value nulled as unfit keeps that reason
        if raws[index] is None:
            row = {name: values.plain(table.column(name)[index]) for name in table.column_names}
            raws[index] = json.dumps({k: v for k, v in row.items() if k not in (PROBLEMS, RAW)}, default=str)
    table = table.set_column(table.schema.get_field_index(PROBLEMS), PROBLEMS, pa.array(problems, pa.string()))
    table = table.set_column(table.schema.get_field_index(RAW), RAW, pa.array(raws, pa.string()))
    return table, keyless


def record_keys(table: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """A row's primary key as text, the values joined by '|' (what `ingest dlq list` shows; a NULL, which only a
    parked row's key holds, as `\\N`). A backslash or '|' inside a value is escaped with a backslash, so the
    text reads back as the values it was made of (`key_values`): a text key `a|b` or `\\N` is no two values or
    no NULL.

    The one text of a key, whichever path parks a row or releases it: every path (a table's slices, a CDC
    change, a copy, `ingest dlq replay`) spells its rows' keys here, from the typed Arrow values; a path that
    spelled the source's own text instead (a CDC change's `2024-01-01 00:00:00+00` beside the load's
    `2024-01-01 00:00:00.000000Z`) parked rows no load ever released."""
    parts = [pc.fill_null(_escaped(_key_text(table.column(k))), NULL_KEY) for k in primary_key]
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "|")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _key_text(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A key column's values as text: Arrow's own cast where it has one; bytes as PostgreSQL's hex text
    (`\\x00ff`: Arrow's cast fails on bytes that are not UTF-8); lists and the like as JSON."""
    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        items = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        texts = [None if not s.is_valid else json.dumps(values.plain(s), default=str) for s in items]
        return pa.array(texts, pa.string())


def _escaped(values: Any) -> Any:
    return pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), "|", "\\|")


def key_part(value: str) -> str:
    """One key value as `record_keys` writes it into the key's text."""
    return value.replace("\\", "\\\\").replace("|", "\\|")


def key_values(text: str) -> list[str | None]:
    """The key values a `record_keys` text was made of (None for a whole value `\\N`)."""
    values: list[str | None] = []
    current: list[str] = []
    null = False
    i = 0
    while i < len(text):
        char, after = text[i], text[i + 1 : i + 2]
        if char == "|":
            values.append(None if null else "".join(current))
            current, null = [], False
        elif char == "\\" and after == "N" and not current and text[i + 2 : i + 3] in ("", "|"):
            null, i = True, i + 1
        elif char == "\\" and after in ("\\", "|"):
            current.append(after)
            i += 1
        else:
            current.append(char)
        i += 1
    values.append(None if null else "".join(current))
    return values


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
