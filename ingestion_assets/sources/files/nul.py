"""Text holding the NUL character (U+0000), for a target whose text cannot hold it (PostgreSQL refuses it in
text and json alike, and its COPY failed the whole slice naming neither file nor row): such a row is parked
naming the column, and the rest of the file loads. DuckDB holds NUL in VARCHAR and reads it back as written."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import ROW, TEXT, BadRow, without_texts

NUL = "\x00"


def without_nul(table: pa.Table, by_line: bool, target: str) -> tuple[pa.Table, list[BadRow]]:
    """The rows of `table` without a NUL in any text value; the others as bad rows naming the first such column
    (`by_line`: ROW is the file's line; `target`: what cannot hold it, for the message)."""
    found: dict[int, str] = {}
    for name in table.column_names:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        hits = pc.fill_null(pc.match_substring(column, NUL), False)
        for index in pc.indices_nonzero(hits).to_pylist():
            found.setdefault(index, name.removeprefix(TEXT))
    if not found:
        return table, []
    rows, records = table.column(ROW).to_pylist(), without_texts(table.drop_columns([ROW])).to_pylist()
    bad = [
        BadRow(
            rows[index],
            rows[index] if by_line else None,
            f"column {column!r} holds the NUL character (U+0000), which {target} cannot store in text: the row is "
            "parked (its value shows NUL as \\u0000); remove the NUL from the file, or load into a target that "
            "holds it (DuckDB)",
            json.dumps(records[index], default=_text),
        )
        for index, column in sorted(found.items())
    ]
    keep = pa.array([index not in found for index in range(table.num_rows)])
    return table.filter(keep), bad


def _text(value: Any) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
