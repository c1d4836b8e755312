"""What a file reader yields: bounded Arrow batches of a file's rows with their row numbers, the bad rows met on
the way, and where the file's read stands (so a run that stops inside a big file resumes inside it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

ROW = "_ingest_file_row"  # the row's number in its file (1-based; JSON lines: its line)
FILE = "_ingest_file"  # the file it came from
# a typed CSV column's text as the file wrote it rides beside it (`_ingest_text:amount`) until the schema step: a
# column that is (or becomes) text in the target takes the file's text, never the typed value written back
TEXT = "_ingest_text:"


def without_texts(table: pa.Table) -> pa.Table:
    """`table` without the file texts that ride beside its typed columns."""
    hidden = [name for name in table.column_names if name.startswith(TEXT)]
    return table.drop_columns(hidden) if hidden else table


class CorruptFile(ValueError):
    """The file cannot be read as its format (truncated, not that format, broken compression): it is parked as
    a whole with this reason, and the stream goes on with the next file."""

    transient = False


@dataclass(frozen=True)
class Resume:
    """How far into a file an earlier read got: rows given, and bad rows already parked."""

    rows: int = 0
    bad: int = 0


@dataclass(frozen=True)
class BadRow:
    row: int | None  # the row's number among the file's rows (None when the row could not be counted)
    line: int | None  # its line in the file, where known
    error: str
    raw: str  # the row as read (text, or its values as JSON)
    file_line: int | None = None  # where a row keyed by its number starts in the file, when known
    ordinal: int | None = None  # its number among the file's rows of the wrong width (when its line is unknown)


@dataclass(frozen=True)
class Piece:
    table: pa.Table | None  # rows that read, with ROW
    bad: list[BadRow]
    rows_done: int  # rows of the file given so far (this piece's last row number)
    bad_done: int = 0


def at_most(piece: Piece, rows: int) -> tuple[Piece, Piece | None]:
    """`piece` cut after its first `rows` rows (None: it has no more): a slice takes at most `slice_rows` rows
    whatever the reader's batches (a CSV batch is a 4 MB block, 300k short rows). The first part ends at its last
    row's number, with the bad rows before it and those counted apart (rows of the wrong width, `bad_done`), so a
    read resumed from its checkpoint gives the rest of the piece again and parks none twice."""
    table = piece.table
    if table is None or table.num_rows <= rows:
        return piece, None
    last = table.column(ROW)[rows - 1].as_py()
    before = [b for b in piece.bad if b.row is None or b.row <= last]
    after = [b for b in piece.bad if b.row is not None and b.row > last]
    return Piece(table.slice(0, rows), before, last, piece.bad_done), Piece(
        table.slice(rows), after, piece.rows_done, piece.bad_done
    )


@dataclass(frozen=True)
class RowWindow:
    """Rows whose `column` is in [low, high): the others belong elsewhere (another partition) and are left out;
    a Parquet row group whose statistics say it holds none of them is not read at all."""

    column: str
    low: Any
    high: Any
    first: bool = False  # the first window: rows before it belong to no partition, and are parked by this one
