"""JSON lines files in batches of records: lines end at CR LF, LF or a lone CR; a line that is not UTF-8, not JSON
or not an object is a bad row with its line number; nested values land as JSON text with every digit of their
numbers, strings beside them as their text. Numbers are typed as CSV values are: integers bigint, numbers with a
point exact decimals, doubles only for exponents."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingestion_assets.sources.files.pieces import ROW, TEXT, BadRow, Piece, Resume
from ingestion_assets.sources.json_numbers import is_number, json_text, loads, number_array
from ingestion_assets.sources.json_strings import SURROGATE_ESCAPE, lone_surrogate, surrogate_problem


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
        value = loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        return {}, f"not JSON: {exc.msg} at column {exc.colno}"
    except _DuplicateKey as exc:
        return {}, (
            f"the key {exc.key!r} appears twice in one object: which value is meant is unknown (JSON readers differ: "
            "most keep the last, some the first), so the row is parked; write each key once"
        )
    if not isinstance(value, dict):
        return {}, f"a JSON {type(value).__name__}, not an object"
    if blank := [key for key in value if not key.strip()]:
        if problem := _unnamed(value, blank):
            return {}, problem
        value = {key: v for key, v in value.items() if key not in blank}
    if SURROGATE_ESCAPE.search(text) and (lone := lone_surrogate(value)) is not None:
        return {}, surrogate_problem(lone)
    return value, None


def _unnamed(value: dict[str, Any], blank: list[str]) -> str | None:
    """Why a field without a name (`""`, `" "`) parks its line: no column can be named after it (the whole stream
    failed with a bare ValueError). Such a field holding null is dropped, as a CSV header's unnamed column is."""
    held = next((key for key in blank if value[key] is not None), None)
    if held is None:
        return None
    shown = json.dumps(value[held])[:80]
    return (
        f"the field {held!r} has no name (empty or blank) but holds {shown}: no column can be named after it, so "
        "the row is parked; give the field a name in the file"
    )


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key written twice (`{"v": 1, "v": 2}`): json.loads keeps the last silently."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def _table(records: list[dict[str, Any]], numbers: list[int]) -> pa.Table:
    """Column by column: a field whose values Arrow cannot hold in one type (1 and "a") lands as text. A typed
    column (numbers, booleans) keeps each value's JSON text beside it (TEXT + name), for a target column that is
    or becomes text: `10` stays `10`, `1.50` and `-0` as written."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    columns: dict[str, pa.Array] = {}
    texts: dict[str, pa.Array] = {}
    for name in names:
        values = [r.get(name) for r in records]
        columns[name] = _column(values)
        if not pa.types.is_string(columns[name].type) and not pa.types.is_null(columns[name].type):
            texts[TEXT + name] = pa.array([None if v is None else json_text(v) for v in values], pa.string())
    columns[ROW] = pa.array(numbers, pa.int64())
    return pa.table({**columns, **texts})


def _column(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if any(isinstance(v, dict | list) for v in present):
        return _texts(values)
    if present and all(is_number(v) for v in present):
        numbers = number_array(values)
        if numbers is not None:
            return numbers
    elif not any(isinstance(v, Decimal) for v in present):
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # 1 and "a"
            pass
    return _texts(values)


def _texts(values: list[Any]) -> pa.Array:
    """A text column: a string is its text (`ok`), any other value its JSON text (`{"x": 1}`, `1.50`, `true`). A
    string among objects was its JSON text (`"ok"`), so one value landed in two forms by what its batch held."""
    return pa.array([None if v is None else v if isinstance(v, str) else json_text(v) for v in values], pa.string())


def _lines(stream: pa.NativeFile) -> Iterator[bytes]:
    """Lines end at CR LF, LF or a CR alone (old Mac files; CSV files read so too): JSON escapes a CR inside a
    value, so a raw CR can only end a line. A CR ending one read waits for the next: CR LF across two reads is
    one line end, not two (an empty line between would shift every later line number)."""
    pending = b""
    while chunk := stream.read(1 << 20):
        pending += chunk
        held = pending.endswith(b"\r")
        *complete, pending = _split(pending[:-1] if held else pending)
        yield from complete
        if held:
            pending += b"\r"
    *complete, pending = _split(pending)
    yield from complete
    if pending:
        yield pending


def _split(data: bytes) -> list[bytes]:
    if b"\r" in data:  # CR LF, then each CR left (a lone one), as LF: a fifth of a regex split's time
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return data.split(b"\n")
