"""JSON lines files in batches of records: a line that is not UTF-8, not JSON or not an object is a bad row
with its line number; nested values land as JSON text."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from ingestion_assets.sources.files.infer import DOUBLE_DIGITS, SMALLEST_NORMAL
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
        value = json.loads(text, parse_float=_decimal)
    except json.JSONDecodeError as exc:
        return {}, f"not JSON: {exc.msg} at column {exc.colno}"
    if not isinstance(value, dict):
        return {}, f"a JSON {type(value).__name__}, not an object"
    return value, None


def _decimal(text: str) -> float | str:
    """A JSON number with a point or an exponent: a double when it holds it as written, else its text (the
    column then lands as text: a double would change its digits)."""
    digits = text.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    if len(digits) > DOUBLE_DIGITS:
        return text
    value = float(text)
    in_range = math.isfinite(value) and (abs(value) >= SMALLEST_NORMAL or not digits)  # 1e400, 1e-400: text
    return value if in_range else text


def _table(records: list[dict[str, Any]], numbers: list[int]) -> pa.Table:
    """Column by column: a field whose values Arrow cannot hold in one type (1 and "a") lands as text."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    columns = {name: _column([r.get(name) for r in records]) for name in names}
    columns[ROW] = pa.array(numbers, pa.int64())
    return pa.table(columns)


def _column(values: list[Any]) -> pa.Array:
    if any(isinstance(v, dict | list) for v in values):
        return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # 1 and "a"; an integer past int64
        return pa.array(
            [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string()
        )


def _lines(stream: pa.NativeFile) -> Iterator[bytes]:
    pending = b""
    while chunk := stream.read(1 << 20):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending
