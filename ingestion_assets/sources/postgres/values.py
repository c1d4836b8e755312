"""PostgreSQL's text of values into the Arrow types a column lands as, where Arrow's CSV reader cannot do it:
hex bytea, ISO 8601 intervals, arrays, and the temporal values of temporal.py.

A value that does not fit comes back as NULL with the reason by its row index; the caller parks the row.
"""

from __future__ import annotations

import bisect
import io
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ingestion_assets.sources.postgres import arrays, temporal
from ingestion_assets.sources.postgres.introspect import Column, TableShape
from ingestion_assets.sources.postgres.reader import csv_options, hex_bytes
from ingestion_assets.sources.postgres.temporal import Unfit

Problems = dict[int, str]  # row index -> the value and why it does not fit


class Unfitting(NamedTuple):
    """A value that does not fit its column: the row parks with this as its reason."""

    column: str
    text: str  # PostgreSQL's text of the value, kept in the raw record
    why: str  # the value and why, e.g. "{NaN}: element NaN has no exact decimal value"

    def __str__(self) -> str:
        return f"{self.column}: {self.why}"


_ISO_INTERVAL = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?)(\d+)(?:\.(\d+))?S)?)?"
)
_DECIMAL_SPECIAL = pa.array(["NaN", "Infinity", "-Infinity"])


def decode_texts(
    table: pa.Table, shape: TableShape, rare: dict[str, dict[int, str]]
) -> tuple[pa.Table, dict[int, list[Unfitting]]]:
    """Intervals and arrays decoded from their text, and `rare` temporal texts (column -> row -> text, left NULL
    by the CSV reader) parsed and put in. What does not fit stays NULL and is returned by row."""
    found: dict[int, list[Unfitting]] = {}
    for column in shape.columns:
        if column.decode not in ("interval", "array") and column.name not in rare:
            continue
        texts = table.column(column.name).combine_chunks()
        if column.decode in ("interval", "array"):
            decoded, problems = from_text(texts, column)
        else:
            indexes = sorted(rare[column.name])
            parsed, problems = from_text(pa.array([rare[column.name][i] for i in indexes], pa.string()), column)
            decoded = patch(texts, {i: parsed[n].cast(_storage(parsed.type)).as_py() for n, i in enumerate(indexes)})
            problems = {indexes[n]: why for n, why in problems.items()}
        for index, why in problems.items():
            text = rare.get(column.name, {}).get(index) or str(texts[index].as_py())
            found.setdefault(index, []).append(Unfitting(column.name, text, why))
        table = table.set_column(table.schema.get_field_index(column.name), column.name, decoded)
    return table, found


def from_text(texts: pa.Array, column: Column) -> tuple[pa.Array, Problems]:
    """The column's Arrow values of PostgreSQL's texts (NULL stays NULL)."""
    kind, target = column.kind, column.arrow_type
    if column.decode == "binary":
        return hex_bytes(texts), {}
    if column.decode == "interval":
        return _per_value(texts, interval_text, pa.string())
    if column.decode == "array":
        assert column.element is not None
        return _lists(texts, column.element)
    if kind in temporal.TEMPORAL:
        return _temporal(texts, kind, target)
    if pa.types.is_decimal(target):
        special = pc.fill_null(pc.is_in(texts, _DECIMAL_SPECIAL), False)
        problems = {i: f"{texts[i]} has no exact decimal value" for i in pc.indices_nonzero(special).to_pylist()}
        return _parsed(pc.if_else(special, None, texts), target), problems
    return (texts if pa.types.is_string(target) else _parsed(texts, target)), {}


def interval_text(iso: str) -> str:
    """An interval's months, days and microseconds, kept apart as PostgreSQL and DuckDB keep them, in text
    both read exactly (IntervalStyle iso_8601 prints e.g. P1Y2M-3DT4H5M6.789S)."""
    match = _ISO_INTERVAL.fullmatch(iso)
    if match is None:
        raise Unfit("has no DuckDB INTERVAL value" if "infinity" in iso else "is not an interval PostgreSQL writes")
    years, months, days, hours, minutes, sign, seconds, fraction = match.groups()
    total_months = int(years or 0) * 12 + int(months or 0)
    micros = (int(hours or 0) * 60 + int(minutes or 0)) * 60_000_000
    micros += (-1 if sign else 1) * (int(seconds or 0) * 1_000_000 + int((fraction or "").ljust(6, "0")))
    return f"{total_months} months {int(days or 0)} days {micros} microseconds"


def _temporal(texts: pa.Array, kind: str, target: pa.DataType) -> tuple[pa.Array, Problems]:
    """Arrow parses the ordinary values; the rest (infinity, BC, far years, 24:00) are parsed here."""
    pattern = "^24:" if kind == "time" else r"infinity$| BC$|^\d{5,}-"  # what temporal.needs_parse finds
    mask = pc.fill_null(pc.match_substring_regex(texts, pattern), False)
    if not pc.any(mask).as_py():
        return _parsed(texts, target), {}
    rare = pc.indices_nonzero(mask).to_pylist()
    parsed = _parsed(pc.if_else(mask, None, texts), target)
    values: list[int | None] = []
    problems: Problems = {}
    for index in rare:
        try:
            values.append(temporal.parse(texts[index].as_py(), kind))
        except Unfit as exc:
            values.append(None)
            problems[index] = f"{texts[index]} {exc}"
    return patch(parsed, dict(zip(rare, values, strict=True))), problems


def _parsed(texts: pa.Array, target: pa.DataType) -> pa.Array:
    """Texts parsed by Arrow's CSV reader with the options COPY output is read with, so an array's element
    means what the same text means as a column value (t/f booleans, +00 offsets, NaN and Infinity)."""
    if len(texts) == 0:
        return pa.array([], target)
    buffer = io.BytesIO()
    pacsv.write_csv(pa.table({"v": texts}), buffer, write_options=pacsv.WriteOptions(include_header=False))
    options = csv_options(TableShape("", "", (Column("v", "text", "text", True, target),)))
    options["parse_options"] = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
    parsed = pacsv.read_csv(io.BytesIO(buffer.getvalue()), **options).column(0)
    return parsed.combine_chunks()


def patch(values: pa.Array | pa.ChunkedArray, replacements: dict[int, int | None]) -> pa.Array:
    """`values` with the integers of temporal values put in at their row indexes (NULL where None)."""
    storage = _storage(values.type)
    as_integers = pc.cast(values, storage)
    mask = _index_mask(len(values), sorted(replacements))
    filled = pa.array([replacements[i] for i in sorted(replacements)], storage)
    return pc.replace_with_mask(as_integers, mask, filled).cast(values.type)


def _storage(arrow_type: pa.DataType) -> pa.DataType:
    return pa.int32() if pa.types.is_date32(arrow_type) else pa.int64()


def _index_mask(length: int, indexes: Sequence[int]) -> pa.Array:
    flags = [False] * length
    for index in indexes:
        flags[index] = True
    return pa.array(flags, pa.bool_())


def _per_value(texts: pa.Array, convert: Callable[[str], object], target: pa.DataType) -> tuple[pa.Array, Problems]:
    values: list[object] = []
    problems: Problems = {}
    for index, text in enumerate(texts.to_pylist()):
        try:
            values.append(None if text is None else convert(text))
        except Unfit as exc:
            values.append(None)
            problems[index] = f"{text} {exc}"
    return pa.array(values, target), problems


def _lists(texts: pa.Array, element: Column) -> tuple[pa.Array, Problems]:
    """Arrays as Arrow lists of the element type; an array with one element that does not fit does not fit."""
    offsets, flat, problems, valid = [0], [], {}, []
    for index, text in enumerate(texts.to_pylist()):
        parts: list[str | None] = []
        if text is not None:
            try:
                parts = arrays.elements(text)
            except Unfit as exc:
                problems[index] = f"{text} {exc}"
        valid.append(text is not None and index not in problems)
        flat.extend(parts)
        offsets.append(len(flat))
    values, element_problems = from_text(pa.array(flat, pa.string()), element)
    for position, why in element_problems.items():
        owner = bisect.bisect_right(offsets, position) - 1
        problems.setdefault(owner, f"{texts[owner]}: element {why}")
    mask = pa.array([not ok or row in problems for row, ok in enumerate(valid)], pa.bool_())
    lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)
    return lists, problems


def plain(scalar: pa.Scalar) -> Any:
    """A slice's value as Python holds it, or as PostgreSQL's text where Python cannot (±infinity, BC, 24:00)."""
    if isinstance(scalar, pa.ListScalar) and scalar.is_valid:
        return [plain(item) for item in scalar.values]
    if pa.types.is_time(scalar.type) and scalar.is_valid and scalar.cast(pa.int64()).as_py() >= temporal.US_PER_DAY:
        return temporal.format_value(scalar.cast(pa.int64()).as_py(), "time")  # Python's time wraps 24:00 to 0:00
    try:
        return scalar.as_py()
    except (OverflowError, ValueError):
        kind = _TEMPORAL_OF_ARROW.get(str(scalar.type))
        if kind is None and pa.types.is_timestamp(scalar.type) and scalar.type.unit == "us":
            kind = "timestamptz" if scalar.type.tz else "timestamp"  # any zone's name: a repair's keys (found
        if kind is None:  # by a README-only attack: an infinity key crashed the repair of every other row)
            raise
        return temporal.format_value(scalar.cast(_storage(scalar.type)).as_py(), kind)


_TEMPORAL_OF_ARROW = {"date32[day]": "date", "timestamp[us]": "timestamp", "timestamp[us, tz=UTC]": "timestamptz"}
