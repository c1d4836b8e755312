"""Rows whose primary key is null or missing cannot be merged on it: they are parked naming the key column, and
the rest of the file loads."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import ROW, BadRow, without_texts


def keyed(table: pa.Table, key: Sequence[str], by_line: bool) -> tuple[pa.Table, list[BadRow]]:
    """The rows of `table` with every key column set; the others as bad rows (`by_line`: ROW is the file's line).
    A key column is found by its name, else by its name without case (a file spelling `ID` for `id`)."""
    folded = {name.casefold(): name for name in reversed(table.column_names)}
    nulls: dict[str, pa.Array] = {}
    for column in key:
        name = column if column in table.column_names else folded.get(column.casefold())
        if name is None:
            nulls[column] = pa.repeat(pa.scalar(True), table.num_rows)
        elif table.column(name).null_count:
            nulls[column] = pc.is_null(table.column(name)).combine_chunks()
    if not nulls:
        return table, []
    flags = {column: mask.to_pylist() for column, mask in nulls.items()}
    lost = [next((c for c, f in flags.items() if f[i]), None) for i in range(table.num_rows)]
    rows, records = table.column(ROW).to_pylist(), without_texts(table.drop_columns([ROW])).to_pylist()
    bad = [
        BadRow(
            rows[i],
            rows[i] if by_line else None,
            f"key column {column!r} is null or missing: the row cannot be merged on the stream's primary key",
            json.dumps(records[i], default=str),
        )
        for i, column in enumerate(lost)
        if column is not None
    ]
    return table.filter(pa.array([column is None for column in lost])), bad
