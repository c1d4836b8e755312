"""The type of a CSV column, inferred from its text batch by batch, such that every value reads back as written:
a code with leading zeros (007) stays text; integers are bigint, or exact decimals past int64; numbers written
with a point are exact decimals (1.50 keeps its scale) up to 38 digits, else text; only exponents, NaN and
infinities make doubles, when a double reads back as written; booleans, dates, times and timestamps by Arrow's
strict ISO parsers."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import TEXT
from ingestion_assets.sources.json_numbers import DECIMAL_DIGITS, DOUBLE_DIGITS, SMALLEST_NORMAL

_NUMBER = re.compile(r"[+-]?[0-9.]")
_LEADING_ZERO = r"^[+-]?0[0-9]"  # 007, 00.5: a code, or digits a number would not keep
_PLAIN = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$"  # digits with at most a point: no exponent, NaN or infinity
_TRUE, _FALSE = ["true", "True", "TRUE"], ["false", "False", "FALSE"]
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_ZONE = re.compile(r"[0-9](Z|[+-][0-9]{2}(:?[0-9]{2})?)$")
_TIME = re.compile(r"[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?$")


def typed(table: pa.Table, texts: set[str]) -> pa.Table:
    """`table` with each column of `texts` (strings as read) in the narrowest type that holds all its values; a
    column typed so keeps its text beside it (TEXT + name), for a target column that is or becomes text."""
    for name in texts:
        index = table.schema.get_field_index(name)
        if index >= 0:
            text = table.column(index)
            column = infer(text)
            if column.type != text.type:
                table = table.set_column(index, pa.field(name, column.type), column).append_column(TEXT + name, text)
    return table


def infer(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """`values` in the type all of them fit. An empty text (a quoted "" field) is the empty string in a text column
    but the missing value in a typed one (a writer quoting every field writes a missing number as "")."""
    blank = pc.equal(values, "")
    if not pc.any(blank).as_py():
        return _infer(values)
    kind = _infer(pc.if_else(blank, pa.scalar(None, values.type), values))
    return values if pa.types.is_string(kind.type) or pa.types.is_null(kind.type) else kind


def _infer(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """The first value says which type to try (a text column costs one look); every value must then fit it."""
    present = values.drop_null()
    if len(present) == 0:
        return pa.chunked_array([pa.nulls(len(values))])
    first = present[0].as_py()
    if first in _TRUE or first in _FALSE:
        if pc.all(pc.is_in(present, pa.array([*_TRUE, *_FALSE]))).as_py():
            return pc.if_else(pc.is_valid(values), pc.is_in(values, pa.array(_TRUE)), pa.scalar(None, pa.bool_()))
        return values
    if _DATE.fullmatch(first):
        return _first_fit(values, [pa.date32(), pa.timestamp("us")])  # a few with a time too: timestamps
    if _DATE.match(first):  # Arrow's ISO parser: a zone everywhere (timestamptz) or nowhere, 6 digits at most
        return _first_fit(values, [pa.timestamp("us", tz="UTC") if _ZONE.search(first) else pa.timestamp("us")])
    if _TIME.match(first):  # Arrow casts no text to a time: read as a time of 1970-01-01
        moments = _first_fit(pc.binary_join_element_wise("1970-01-01 ", values, ""), [pa.timestamp("us")])
        return pc.cast(moments, pa.time64("us")) if pa.types.is_timestamp(moments.type) else values
    return _number(values, present) if _NUMBER.match(first) else values


def _number(values: pa.ChunkedArray, present: pa.ChunkedArray) -> pa.ChunkedArray:
    if _leading_zeros(present):
        return values
    if pc.all(pc.match_substring_regex(present, _PLAIN)).as_py():
        if not pc.any(pc.match_substring(present, ".")).as_py():
            integers = _first_fit(values, [pa.int64()])  # past int64: an exact decimal
            if pa.types.is_integer(integers.type):
                return integers
        return _decimals(values, present)
    doubles = _first_fit(values, [pa.float64()])
    if not pa.types.is_floating(doubles.type):
        return values
    return doubles if _fits_a_double(present) and not _out_of_range(doubles.drop_null(), present) else values


def _decimals(values: pa.ChunkedArray, present: pa.ChunkedArray) -> pa.ChunkedArray:
    """Plain numbers as decimal(p, s): s the most digits after a point, p - s the most before it (leading zeros
    aside), so each value is exactly the one written; text past 38 digits."""
    body = pc.replace_substring_regex(present, "^[+-]", "")
    whole = pc.utf8_length(pc.utf8_ltrim(pc.replace_substring_regex(body, r"\..*$", ""), "0"))
    scale = pc.max(pc.utf8_length(pc.replace_substring_regex(body, r"^[0-9]*\.?", ""))).as_py()
    precision = max(pc.max(whole).as_py() + scale, 1)
    if precision > DECIMAL_DIGITS:
        return values
    return _first_fit(values, [pa.decimal128(precision, scale)])


def _leading_zeros(values: pa.ChunkedArray) -> bool:
    starts = [pc.starts_with(values, prefix) for prefix in ("0", "-0", "+0")]
    zero = values.filter(pc.or_(pc.or_(starts[0], starts[1]), starts[2]))  # 0, 0.5 and 007: few, then one regex
    return len(zero) > 0 and bool(pc.any(pc.match_substring_regex(zero, _LEADING_ZERO)).as_py())


def _out_of_range(doubles: pa.ChunkedArray, texts: pa.ChunkedArray) -> bool:
    """1e400 read as inf, 1e-400 as 0, 4.9e-324 as 5e-324 (below the normal range a double has fewer digits)."""
    inf = pc.is_inf(doubles)
    tiny = pc.less(pc.abs(doubles), SMALLEST_NORMAL)
    if not pc.any(pc.or_(inf, tiny)).as_py():
        return False
    digits = pc.match_substring_regex(pc.replace_substring_regex(texts, r"[eE].*$", ""), "[1-9]")
    return bool(pc.any(pc.or_(inf, pc.and_(tiny, digits))).as_py())


def _fits_a_double(values: pa.ChunkedArray) -> bool:
    """Every value has at most 15 significant digits (zeros around them do not count)."""
    long = values.filter(pc.greater(pc.utf8_length(values), DOUBLE_DIGITS))  # shorter: 15 digits at most
    if len(long) == 0:
        return True
    mantissa = pc.replace_substring_regex(long, r"[eE].*$", "")
    significant = pc.utf8_trim(pc.replace_substring_regex(mantissa, r"[^0-9]", ""), "0")
    return bool(pc.max(pc.utf8_length(significant)).as_py() <= DOUBLE_DIGITS)


def _first_fit(values: pa.ChunkedArray, kinds: list[pa.DataType]) -> pa.ChunkedArray:
    """`values` in the first of `kinds` every one of them parses as (Arrow's strict parsers), else as they are."""
    for kind in kinds:
        try:
            return pc.cast(values, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # 2024-02-30, 25:00, 1e999: not of this kind
            continue
    return values
