"""A keyless file read again leaves in the target exactly the rows it holds now: a row of its previous version
under a number this read did not give (a line that went bad or blank, the tail of a shorter file) goes.

A keyless stream keys a row by its file and number, so a merge replaces the numbers a read gives and nothing
else: a file rewritten shorter kept its old last rows, and a line gone bad kept its old value beside its dead
letter, as if valid (found by a README-only attacker: a keyless CSV with a malformed middle row held its last
row twice). Each slice knows which numbers of each file it covered (after the number it resumed from, up to
the last number it reached, or to the file's end); the target's rows of that file in that range that the slice
did not give are deleted (flagged, with `deletes: soft`) right after the slice's load, before its checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.metadata_columns import DELETED_AT
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.loading.target_sql import undefined_relation
from ingestion_assets.sources.files import FILE, ROW
from ingestion_assets.streams.files_deletes import _is_lake

_CHUNK = 200  # files per statement


@dataclass
class Span:
    """The numbers of one file a slice covered: after `after`, up to `upto` (None: to the file's end), and the
    runs of numbers it did not give on the way (`holes`). Numbers come in increasing order, piece by piece."""

    after: int
    upto: int | None = 0
    last: int = 0  # the last number given (or `after`)
    holes: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def starting(cls, after: int) -> Span:
        return cls(after, after, after)

    def give(self, table: pa.Table | None) -> None:
        if table is None or not table.num_rows:
            return
        numbers = table.column(ROW).combine_chunks()
        before = pa.concat_arrays([pa.array([self.last], pa.int64()), numbers.slice(0, len(numbers) - 1)])
        jumps = pc.greater(pc.subtract(numbers, before), 1)
        if pc.any(jumps).as_py():
            starts = pc.add(pc.filter(before, jumps), 1).to_pylist()
            ends = pc.subtract(pc.filter(numbers, jumps), 1).to_pylist()
            self.holes += list(zip(starts, ends, strict=True))
        self.last = max(self.last, int(numbers[-1].as_py()))

    def reach(self, upto: int) -> None:
        if self.upto is not None:
            self.upto = max(self.upto, upto)

    def gaps(self) -> list[tuple[int, int | None]]:
        """The covered numbers not given, as inclusive ranges (an open end: None)."""
        found: list[tuple[int, int | None]] = list(self.holes)
        if self.upto is None:
            found.append((self.last + 1, None))
        elif self.upto > self.last:
            found.append((self.last + 1, self.upto))
        return found


def retire_stale_rows(loader: Loader, spans: dict[str, Span], soft: bool) -> int:
    """Delete (or flag) the target's rows of the spans' files under numbers the slice covered and did not give;
    returns how many. Only rows that are there are touched: nothing is written when none is stale."""
    if not any(span.gaps() for span in spans.values()):
        return 0
    retired = 0
    file, row = loader.names.column(FILE), loader.names.column(ROW)
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        quoted = client.escape_column_name(file), client.escape_column_name(row)
        columns = ", ".join(quoted)
        compared = f"CAST({quoted[0]} AS VARCHAR)" if _is_lake(loader) else quoted[0]
        predicates = _predicates(spans, compared, quoted[1])
        if not _is_lake(loader) and not table_exists(client, table):
            return 0
        for predicate in predicates:
            where = f"{DELETED_AT} IS NULL AND ({predicate})"
            try:
                found = client.execute_sql(f"SELECT {columns} FROM {table} WHERE {where}") or []
            except undefined_relation():
                return 0
            if not found:
                continue
            if _is_lake(loader):
                keys = pa.table(
                    {
                        file: pa.array([str(r[0]) for r in found], pa.string()),
                        row: pa.array([int(r[1]) for r in found], pa.int64()),
                    }
                )
                retired += loader.retire_keys(keys, soft)
                continue
            if soft:
                client.execute_sql(f"UPDATE {table} SET {DELETED_AT} = CURRENT_TIMESTAMP WHERE {where}")
            else:
                client.execute_sql(f"DELETE FROM {table} WHERE {where}")
            retired += len(found)
    return retired


def _predicates(spans: dict[str, Span], file: str, row: str) -> list[str]:
    """One predicate per chunk of files: `(file = 'a' AND (row BETWEEN 3 AND 3 OR row >= 5)) OR ...`. A lake's SQL
    view compares the name cast to text (it reads a string view); a SQL target compares the column as it is, so
    the key's index serves."""
    parts: list[str] = []
    for name, span in sorted(spans.items()):
        ranges = [f"{row} >= {a}" if b is None else f"{row} BETWEEN {a} AND {b}" for a, b in span.gaps()]
        if ranges:
            literal = "'" + name.replace("'", "''") + "'"
            parts.append(f"({file} = {literal} AND ({' OR '.join(ranges)}))")
    return [" OR ".join(parts[i : i + _CHUNK]) for i in range(0, len(parts), _CHUNK)]
