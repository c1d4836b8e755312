"""A keyless file read again leaves in the target exactly the rows it holds now: a row of its previous version
under a number this read did not give (a line that went bad or blank, the tail of a shorter file) goes.

A keyless stream keys a row by its file and number, so a merge replaces the numbers a read gives and nothing
else: a file rewritten shorter kept its old last rows, and a line gone bad kept its old value beside its dead
letter, as if valid (found by a README-only attacker: a keyless CSV with a malformed middle row held its last
row twice). Each slice knows which numbers of each file it covered (after the number it resumed from, up to
the last number it reached, or to the file's end); the target's rows of that file in that range that the slice
did not give are deleted (flagged, with `deletes: soft`) right after the slice's load, before its checkpoint.

A partition by a column reads every file but keeps only the rows in its window: the numbers of the other windows'
rows are gaps too, and those rows are no business of this partition. Its stale rows are the target's rows of the
file whose column is in its window under a number it covered and did not give (a row moved to another window
goes here and comes back when that partition reads the file again; a row gone bad or cut off goes for good).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.metadata_columns import DELETED_AT
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.loading.target_sql import undefined_relation
from ingestion_assets.sources.files import FILE, ROW, RowWindow
from ingestion_assets.streams.files_deletes import _is_lake
from ingestion_assets.streams.files_partitions import window_sql

_CHUNK = 200  # files (or ranges of numbers) per statement


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

    def covered(self, row: str) -> str:
        """SQL: the numbers after `after`, up to `upto` (the file's end: no bound)."""
        return f"{row} > {self.after}" + ("" if self.upto is None else f" AND {row} <= {self.upto}")

    def not_given(self, numbers: list[int]) -> list[int]:
        """Those of `numbers` (in increasing order) in a gap."""
        gaps = self.gaps()
        starts = [a for a, _ in gaps]
        found = []
        for number in numbers:
            at = bisect.bisect_right(starts, number) - 1
            if at >= 0 and (gaps[at][1] is None or number <= gaps[at][1]):  # type: ignore[operator]
                found.append(number)
        return found


def retire_stale_rows(loader: Loader, spans: dict[str, Span], soft: bool, window: RowWindow | None = None) -> int:
    """Delete (or flag) the target's rows of the spans' files under numbers the slice covered and did not give
    (with a partition's `window`: only those whose column is in it); returns how many. Only rows that are there
    are touched: nothing is written when none is stale."""
    if not any(span.gaps() for span in spans.values()):
        return 0
    retired = 0
    file, row = loader.names.column(FILE), loader.names.column(ROW)
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        quoted = client.escape_column_name(file), client.escape_column_name(row)
        columns = ", ".join(quoted)
        compared = f"CAST({quoted[0]} AS VARCHAR)" if _is_lake(loader) else quoted[0]
        if not _is_lake(loader) and not table_exists(client, table):
            return 0
        inside = ""
        gaps: dict[str, list[tuple[int, int | None]]] = {name: span.gaps() for name, span in spans.items()}
        if window is not None:
            inside = " AND " + window_sql(client, loader.names.column(window.column), window)
            try:
                gaps = _stale_in_window(client, table, spans, (compared, quoted[1]), inside)
            except undefined_relation():
                return 0
        for predicate in _predicates(gaps, compared, quoted[1]):
            where = f"{DELETED_AT} IS NULL AND ({predicate}){inside}"
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


def _stale_in_window(
    client: Any, table: str, spans: dict[str, Span], names: tuple[str, str], inside: str
) -> dict[str, list[tuple[int, int | None]]]:
    """The numbers, as ranges, of each file's target rows in the window that the slice covered and did not give:
    asked of the target (the gaps hold the other windows' rows, as many as the file has)."""
    file, row = names
    parts = [
        f"({file} = {_literal(name)} AND {span.covered(row)})" for name, span in sorted(spans.items()) if span.gaps()
    ]
    held: dict[str, list[int]] = {}
    for i in range(0, len(parts), _CHUNK):
        where = f"{DELETED_AT} IS NULL AND ({' OR '.join(parts[i : i + _CHUNK])}){inside}"
        for name, number in client.execute_sql(f"SELECT {file}, {row} FROM {table} WHERE {where}") or []:
            held.setdefault(str(name), []).append(int(number))
    return {name: _ranges(spans[name].not_given(sorted(numbers))) for name, numbers in held.items()}


def _ranges(numbers: list[int]) -> list[tuple[int, int | None]]:
    """Increasing numbers as runs: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int | None]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


def _literal(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"


def _predicates(gaps: dict[str, list[tuple[int, int | None]]], file: str, row: str) -> list[str]:
    """One predicate per chunk of at most `_CHUNK` ranges: `(file = 'a' AND (row BETWEEN 3 AND 3 OR row >= 5)) OR
    ...` (a partition's stale rows may lie scattered: never one statement of thousands of ranges). A lake's SQL
    view compares the name cast to text (it reads a string view); a SQL target compares the column as it is, so
    the key's index serves."""
    chunks: list[list[str]] = [[]]
    room = _CHUNK
    for name, found in sorted(gaps.items()):
        ranges = [f"{row} >= {a}" if b is None else f"{row} BETWEEN {a} AND {b}" for a, b in found]
        while ranges:
            if room == 0:
                chunks.append([])
                room = _CHUNK
            taken, ranges = ranges[:room], ranges[room:]
            room -= len(taken)
            chunks[-1].append(f"({file} = {_literal(name)} AND ({' OR '.join(taken)}))")
    return [" OR ".join(parts) for parts in chunks if parts]
