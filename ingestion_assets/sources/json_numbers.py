"""JSON numbers kept exact, for every source that reads JSON (JSON lines files, API answers): parsed with the text
they were written in, typed as a column that holds each as written, and written back with every digit."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa

DOUBLE_DIGITS = 15  # a decimal of up to 15 significant digits reads back from a double as written
DECIMAL_DIGITS = 38  # the widest exact decimal DuckDB (and Arrow's decimal128) holds
SMALLEST_NORMAL = 2.2250738585072014e-308


class Number(Decimal):
    """A JSON number with a point or an exponent (or an integer past int64): its exact value, and its text as
    written."""

    written: str

    def __new__(cls, text: str) -> Number:
        number = super().__new__(cls, text)
        number.written = text
        return number


class NegativeZero(int):
    """The JSON integer `-0`: zero, whose text is `-0` (a column of it that becomes text keeps it so)."""

    written = "-0"


def exact_integer(text: str) -> int | Number:
    """Integers past int64 keep their text (Python refuses to make an int of more than 4300 digits)."""
    if text == "-0":
        return NegativeZero(0)
    return int(text) if len(text) <= 20 else Number(text)


def loads(text: str | bytes, **options: Any) -> Any:
    """A JSON document with its numbers exact: integers as int (past 20 digits a Number), the rest as Number.
    `options`: json.loads's others (an `object_pairs_hook`)."""
    return json.loads(text, parse_float=Number, parse_int=exact_integer, **options)


def json_text(value: Any) -> str:
    """A value as JSON text, numbers with every digit as written (json.dumps would round them through a double)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    if isinstance(value, Number | NegativeZero):
        return value.written
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value)


def value_text(value: int | float | Decimal) -> str:
    """A JSON number as the text of its value, however it was written: `901.0`, `9.01e2` and `901` as `901`,
    `1.50` as `1.5`; no exponent. For a key landing in a text column, where the written text would make one id
    two keys. NaN and the infinities keep their JSON text."""
    number = Decimal(value.written) if isinstance(value, Number | NegativeZero) else Decimal(value)
    if not number.is_finite() or number.adjusted() > 4000:  # past 4000 digits: as written (Python's int limit)
        return json_text(value)
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def number_array(values: list[Any]) -> pa.Array | None:
    """JSON numbers (and nulls) as the column that holds each as written: integers bigint; with numbers written
    with a point (or integers past int64), exact decimals (1.50 keeps its scale); with an exponent, NaN or an
    infinity, doubles if each reads back as written. None: only text holds them (an integer past 38 digits, a
    decimal a double would change)."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in present):
        return pa.array(values, pa.int64())
    if any(isinstance(v, float) or (isinstance(v, Number) and "e" in v.written.lower()) for v in present):
        fits = all(_double_holds(v) for v in present)
        return pa.array([None if v is None else float(v) for v in values], pa.float64()) if fits else None
    shapes = [_shape(Decimal(v)) for v in present]
    scale = max(s for _, s in shapes)
    precision = max(max(w for w, _ in shapes) + scale, 1)
    if precision > DECIMAL_DIGITS:
        return None
    return pa.array([None if v is None else Decimal(v) for v in values], pa.decimal128(precision, scale))


def _shape(value: Decimal) -> tuple[int, int]:
    """(digits before the point, digits after it) of a finite decimal."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if exponent >= 0:
        return (len(digits) + exponent if any(digits) else 0), 0
    return max(len(digits) + exponent, 0), -exponent


def _double_holds(value: int | float | Decimal) -> bool:
    """A double holds the value as written: an integer up to 2**53, a number of up to 15 significant digits in
    the normal range, NaN and the infinities."""
    if isinstance(value, float):
        return True  # NaN, Infinity: JSON's constants
    if isinstance(value, int):
        return abs(value) <= 2**53
    text = value.written if isinstance(value, Number) else str(value)
    digits = text.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    number = float(text)
    return len(digits) <= DOUBLE_DIGITS and math.isfinite(number) and (abs(number) >= SMALLEST_NORMAL or not digits)
