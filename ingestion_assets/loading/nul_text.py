"""Dead letters a PostgreSQL target can store: its text holds no NUL character (U+0000) and its jsonb no `\\u0000`
escape, so a row parked for holding one (an API record, a file's row) failed to be parked and blocked the stream.
In a dead letter the NUL reads as the six characters `\\u0000` (the JSON escape written out as text)."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

NUL = "\x00"
SHOWN = "\\u0000"  # what a NUL reads as in a dead letter on PostgreSQL
_ESCAPES = re.compile(r"\\\\|\\u0000")  # a backslash written twice, or the escape of NUL (scanned left to right)


def storable_in_postgres(records: pa.Table, json_columns: tuple[str, ...]) -> pa.Table:
    """`records` (dead letters) with each NUL in text written `\\u0000`, and each `\\u0000` escape in the JSON
    columns written as that text (`\\\\u0000`); values without either are left as they are."""
    for index, field in enumerate(records.schema):
        if not pa.types.is_string(field.type) and not pa.types.is_large_string(field.type):
            continue
        column = records.column(index)
        marked = pc.or_(pc.match_substring(column, NUL), pc.match_substring(column, SHOWN))
        if not pc.any(pc.fill_null(marked, False)).as_py():
            continue
        escape = field.name in json_columns
        values = [_storable(v, escape) for v in column.to_pylist()]
        records = records.set_column(index, field, pa.array(values, field.type))
    return records


def _storable(value: str | None, json: bool) -> str | None:
    if value is None:
        return None
    if json:
        value = _ESCAPES.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else "\\" + SHOWN, value)
        return value.replace(NUL, "\\" + SHOWN)  # a raw NUL (not JSON): as its escape, written out
    return value.replace(NUL, SHOWN)
