"""JSON lines files in batches of records: a line that is not UTF-8, not JSON or not an object is a bad row
with its line number; nested values land as JSON text with every digit of their numbers. Numbers are typed as
CSV values are: integers bigint, numbers with a point exact decimals, doubles only for exponents."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingestion_assets.sources.files.infer import DECIMAL_DIGITS, DOUBLE_DIGITS, SMALLEST_NORMAL
from ingestion_assets.sources.files.pieces import ROW, BadRow, Piece, Resume


def read_jsonl(open_file: Callable[[], pa.NativeFile], batch_rows: int, resume: Resume) -> Iterator[Piece]:
    """A record's row number is its line, so a resume skips exactly the lines already given."""
    records: list[dict[str, Any]] = []
    numbers: list[int] = []
    bad: list[BadRow] = []
    number = 0
    for number, line in enumerate(_lines(open_file()), start=1):
        if number <= resume.rows or not line.strip():
            continue
        if number == 1:
            line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors write
        record, problem = _parse(line)
        if problem is not None:
            bad.append(BadRow(number, number, problem, line.decode("utf-8", "backslashreplace")[:65536]))
        else:
            records.append(record)
            numbers.append(number)
        if len(records) >= batch_rows:
            yield Piece(_table(records, numbers), bad, number)
            records, numbers, bad = [], [], []
    if records or bad:
        yield Piece(_table(records, numbers) if records else None, bad, max(number, resume.rows))


def _parse(line: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return {}, f"invalid UTF-8 (byte {exc.start} of the line)"
    try:
        value = json.loads(text, parse_float=Number, parse_int=_integer)
    except json.JSONDecodeError as exc:
        return {}, f"not JSON: {exc.msg} at column {exc.colno}"
    if not isinstance(value, dict):
        return {}, f"a JSON {type(value).__name__}, not an object"
    return value, None


class Number(Decimal):
    """A JSON number with a point or an exponent: its exact value, and its text as written."""

    written: str

    def __new__(cls, text: str) -> Number:
        number = super().__new__(cls, text)
        number.written = text
        return number


def _integer(text: str) -> int | Number:
    """Integers past int64 keep their text (Python refuses to make an int of more than 4300 digits)."""
    return int(text) if len(text) <= 20 else Number(text)


def _table(records: list[dict[str, Any]], numbers: list[int]) -> pa.Table:
    """Column by column: a field whose values Arrow cannot hold in one type (1 and "a") lands as text."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    columns = {name: _column([r.get(name) for r in records]) for name in names}
    columns[ROW] = pa.array(numbers, pa.int64())
    return pa.table(columns)


def _column(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if any(isinstance(v, dict | list) for v in present):
        return pa.array([None if v is None else json_text(v) for v in values], pa.string())
    if present and all(isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in present):
        numbers = _numbers(values, present)
        if numbers is not None:
            return numbers
    elif not any(isinstance(v, Decimal) for v in present):
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # 1 and "a"
            pass
    return pa.array([None if v is None else v if isinstance(v, str) else json_text(v) for v in values], pa.string())


def _numbers(values: list[Any], present: list[Any]) -> pa.Array | None:
    """Integers as bigint; with numbers written with a point, exact decimals (1.50 keeps its scale); with an
    exponent, NaN or an infinity, doubles if each reads back as written. None: the column is text (an integer
    past 38 digits, a decimal a double would change)."""
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


def json_text(value: Any) -> str:
    """A value as JSON text, numbers with every digit as written (json.dumps would round them through a double)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    if isinstance(value, Number):
        return value.written
    return json.dumps(value)


def _lines(stream: pa.NativeFile) -> Iterator[bytes]:
    pending = b""
    while chunk := stream.read(1 << 20):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending
