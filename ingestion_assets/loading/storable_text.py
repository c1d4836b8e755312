"""Dead letters every target can store. Half a UTF-16 surrogate pair (`\\ud800`) is no character: DuckDB's JSON
("no low surrogate in string") and PostgreSQL's jsonb refuse its escape. PostgreSQL's text also holds no NUL
(U+0000) and its jsonb no `\\u0000`. A row parked for holding one (an API record, a file's row) failed to be
parked and blocked the stream; in its dead letter such a character now reads as its JSON escape written out as
text (`\\ud800`, `\\u0000`)."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

NUL = "\x00"
SHOWN = "\\u0000"  # what a NUL reads as in a dead letter on PostgreSQL
# scanned left to right: a backslash written twice and a whole surrogate pair are kept; NUL's escape, half a pair not
_PAIR = r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_ESCAPES = re.compile(rf"\\\\|{_PAIR}|\\u0000|\\u[dD][89a-fA-F][0-9a-fA-F]{{2}}")


def storable_dead_letters(records: pa.Table, json_columns: tuple[str, ...], postgres: bool) -> pa.Table:
    """`records` (dead letters) with half a surrogate pair in the JSON columns written as its escape's text
    (`\\\\ud800`), and for PostgreSQL (`postgres`) each NUL too: `\\u0000` in text, `\\\\u0000` in JSON. Values
    without any are left as they are (only rows holding one are rewritten, in Python)."""
    wanted = r"\\u(0000|[dD][89a-fA-F])" if postgres else r"\\u[dD][89a-fA-F]"
    for index, field in enumerate(records.schema):
        if not pa.types.is_string(field.type) and not pa.types.is_large_string(field.type):
            continue
        escape, column = field.name in json_columns, records.column(index)
        marked = pc.match_substring_regex(column, wanted) if escape else pa.repeat(pa.scalar(False), len(column))
        if postgres:
            marked = pc.or_(marked, pc.match_substring(column, NUL))
        if not pc.any(pc.fill_null(marked, False)).as_py():
            continue
        values = [_storable(v, escape, postgres) for v in column.to_pylist()]
        records = records.set_column(index, field, pa.array(values, field.type))
    return records


def _kept(escape: str, postgres: bool) -> bool:
    """An escaped backslash, a surrogate pair (12 characters), and NUL's escape where the target holds it."""
    return escape == "\\\\" or len(escape) == 12 or (escape == SHOWN and not postgres)


def _storable(value: str | None, json: bool, postgres: bool) -> str | None:
    if value is None:
        return None
    if json:
        value = _ESCAPES.sub(lambda m: m.group(0) if _kept(m.group(0), postgres) else "\\" + m.group(0), value)
        return value.replace(NUL, "\\" + SHOWN) if postgres else value  # a raw NUL (not JSON): its escape's text
    return value.replace(NUL, SHOWN) if postgres else value
