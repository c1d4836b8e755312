"""JSON lines spell keys record by record: `{"ID": 3}` among lines that write `id` names the same column once the
destination folds names. Such spellings are one column, each row keeping the value it has; a record holding a
value under two of them is parked, and the rest of the file loads."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import ROW, TEXT, BadRow, CorruptFile


def one_spelling(table: pa.Table, folded: Callable[[str], str]) -> tuple[pa.Table, list[BadRow]]:
    """`table` with the columns that `folded` gives one name merged into the first of them; the rows that hold a
    value in two of them as bad rows (ROW is the line). Columns of types that do not merge park the file."""
    groups: dict[str, list[str]] = {}
    for name in table.column_names:
        if name != ROW and not name.startswith(TEXT):
            groups.setdefault(folded(name), []).append(name)
    keep = pa.repeat(pa.scalar(True), table.num_rows)
    bad: list[BadRow] = []
    for names in (n for n in groups.values() if len(n) > 1):
        columns = [table.column(n) for n in names]
        given = pc.cast(pc.is_valid(columns[0]), pa.int8())
        for column in columns[1:]:
            given = pc.add(given, pc.cast(pc.is_valid(column), pa.int8()))
        both = pc.greater(given, 1)
        for index in pc.indices_nonzero(both).to_pylist():
            row = table.column(ROW)[index].as_py()
            values = {n: table.column(n)[index].as_py() for n in names}
            problem = f"keys {names!r} are one column spelled apart, and this record gives more than one a value"
            bad.append(BadRow(row, row, problem, json.dumps(values, default=str)))
        keep = pc.and_(keep, pc.invert(both))
        table = table.set_column(table.schema.get_field_index(names[0]), names[0], _merged(columns, names))
        table = table.drop_columns(names[1:])
        texts = [TEXT + n for n in names if TEXT + n in table.column_names]  # a typed value's JSON text: merged too
        if texts:
            merged = pc.coalesce(*[table.column(t) for t in texts])
            table = table.drop_columns(texts).append_column(TEXT + names[0], merged)
    return (table.filter(keep), bad) if bad else (table, [])


def _merged(columns: list[pa.ChunkedArray], names: list[str]) -> pa.ChunkedArray:
    kinds = {c.type for c in columns if not pa.types.is_null(c.type)}
    if len(kinds) > 1:
        raise CorruptFile(
            f"its keys {names!r} land as one column but hold values of different types ({', '.join(map(str, kinds))})"
            ": spell the key one way in the file"
        )
    kind = next(iter(kinds), pa.null())
    return pc.coalesce(*[c.cast(kind) for c in columns])
