"""CSV column inference fuzzed through the CSV reader: whatever the texts, a typed value reads back as the text it
came from (an integer, a decimal or a double is the number written, a date, time or timestamp the moment written), or the
column stays text with every character. Before, `007` read as 7 and `1e-400` as 0.0."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ingestion_assets.catalog.files import CsvOptions
from ingestion_assets.sources.files.csv import read_csv
from ingestion_assets.sources.files.parquet import read_parquet
from ingestion_assets.sources.files.pieces import Resume

_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.from_regex(r"[+-]?0[0-9]{1,5}(\.[0-9]{0,3})?", fullmatch=True),
)
_TEXTS = st.one_of(
    _NUMBERS,
    st.dates().map(str),
    st.datetimes().map(lambda d: d.isoformat(sep=" ")),
    st.times().map(str),
    st.sampled_from(["true", "false", "TRUE", "n/a", "1e-400", "1e400", "4.9e-324"]),
    st.text(st.characters(blacklist_characters="\r\n\x00", blacklist_categories=["Cs"]), min_size=1, max_size=8),
)


@settings(max_examples=200)
@given(values=st.lists(st.one_of(st.none(), _TEXTS), min_size=1, max_size=8), numbers=st.lists(_NUMBERS, max_size=8))
@example(values=["007"], numbers=["1", "2"])
@example(values=["1e-400"], numbers=[])
@example(values=["99999999999999999999"], numbers=["0.1234567890123456789"])
def test_a_typed_value_reads_back_as_its_text(values: list[str | None], numbers: list[str]) -> None:
    for texts in (values, [*numbers, *values[:1]]):
        typed = _read([*texts])
        for text, value in zip(texts, typed.to_pylist(), strict=True):
            assert (text is None) == (value is None)
            if text is not None:
                _same(text, value, typed.type)


def _read(texts: list[str | None]) -> pa.ChunkedArray:
    """The texts as a CSV column (None: an empty field, unquoted beside another), read back by the files source's
    CSV reader."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["v", "k"])
    writer.writerows([["" if text is None else text, "k"] for text in texts])
    data = buffer.getvalue().encode()
    pieces = list(read_csv(lambda: pa.BufferReader(data), CsvOptions(), Resume()))
    assert not any(piece.bad for piece in pieces)
    return pa.concat_tables([piece.table for piece in pieces if piece.table is not None]).column("v")


def _same(text: str, value: object, kind: pa.DataType) -> None:
    if pa.types.is_string(kind):
        assert value == text
    elif pa.types.is_integer(kind):
        assert str(value) == text.lstrip("+") or (text in ("-0", "+0") and value == 0)
    elif pa.types.is_decimal(kind):
        assert isinstance(value, Decimal) and value == Decimal(text) and "e" not in text.lower()
    elif pa.types.is_floating(kind):
        assert isinstance(value, float) and Decimal(repr(value)) == Decimal(text)
    elif pa.types.is_boolean(kind):
        assert value == (text.lower() == "true")
    elif pa.types.is_date(kind):
        assert value == dt.date.fromisoformat(text)
    elif pa.types.is_time(kind):
        assert value == dt.time.fromisoformat(text)
    elif pa.types.is_timestamp(kind):
        assert value == dt.datetime.fromisoformat(text).replace(tzinfo=value.tzinfo)  # type: ignore[union-attr]
    else:
        raise AssertionError(f"{text!r} typed {kind}")


_UNITS = {"ms": 1_000, "us": 1, "ns": None}  # what Parquet stores (seconds are written as milliseconds)


@settings(max_examples=60)
@given(
    unit=st.sampled_from(sorted(_UNITS)),
    counts=st.lists(st.one_of(st.none(), st.integers(-(2**63) + 1, 2**63 - 1)), min_size=1, max_size=6),
)
@example(unit="ns", counts=[1_700_000_000_000_000_789, 1_700_000_000_000_000_000])
@example(unit="ms", counts=[2**62, -5])
def test_parquet_times_of_any_unit_load_in_microseconds_exactly_or_park_their_row(
    unit: str, counts: list[int | None]
) -> None:
    """Timestamps and durations of every unit: a value microseconds hold loads as exactly that many; any other
    (nanoseconds, milliseconds past what 64-bit microseconds count) parks its row, naming the column."""
    table = pa.table(
        {
            "at": pa.array(counts, pa.timestamp(unit, tz="UTC")),
            "took": pa.array(counts, pa.duration(unit)),
            "seen": pa.array(counts, pa.timestamp(unit)).dictionary_encode(),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    data = buffer.getvalue()
    pieces = list(read_parquet(lambda: pa.BufferReader(data), 1000, Resume()))
    loaded = pa.concat_tables([p.table for p in pieces if p.table is not None])
    parked = {bad.row: bad.error for p in pieces for bad in p.bad}
    rows = dict(zip(loaded.column("_ingest_file_row").to_pylist(), range(loaded.num_rows), strict=True))
    at, took = loaded.column("at").cast(pa.int64()).to_pylist(), loaded.column("took").to_pylist()
    seen = loaded.column("seen").cast(pa.int64()).to_pylist()
    for row, count in enumerate(counts, start=1):
        if count is not None and _exact_us(count, unit) is None:
            assert row in parked and "the target counts microseconds" in parked[row]
            continue
        assert row in rows
        micros = None if count is None else _exact_us(count, unit)
        assert (at[rows[row]], took[rows[row]], seen[rows[row]]) == (micros, micros, micros)


def _exact_us(count: int, unit: str) -> int | None:
    """`count` of `unit` in microseconds, when a signed 64-bit count of microseconds holds it exactly."""
    if unit == "ns":
        return count // 1000 if count % 1000 == 0 else None
    micros = count * _UNITS[unit]  # type: ignore[operator]
    return micros if -(2**63) < micros < 2**63 else None
