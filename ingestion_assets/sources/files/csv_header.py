"""What a CSV file's header may not hold: columns without a name (a trailing comma, as spreadsheet exports
write) are dropped while they hold no value, and a file whose unnamed column holds one is parked naming it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.files.pieces import ROW, CorruptFile


def without_unnamed(table: pa.Table) -> pa.Table:
    """`table` without its unnamed columns, each empty in every row; raises CorruptFile for one holding a value."""
    for index in reversed(range(table.num_columns)):
        if table.column_names[index].strip():
            continue
        values = table.column(index)
        if values.null_count < len(values):
            first = pc.index(pc.is_valid(values), True).as_py()
            raise CorruptFile(
                f"column {index + 1} of the header has no name but row {table.column(ROW)[first].as_py()} "
                f"holds {str(values[first].as_py())[:80]!r} in it: name the column in the file's header, "
                "or give csv.column_names"
            )
        table = table.remove_column(index)
    return table
