"""A quote a CSV file opens and never closes: pyarrow's reader takes everything to the end of the file as that
one value (the rows after it vanish into it, no error). The file's last row is checked: a value of its last
column that holds a line break and runs to the file's last byte was never closed, and the row is parked."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pyarrow as pa

from ingestion_assets.sources.files.pieces import ROW, BadRow, Piece, without_texts


def closed_at_end(
    pieces: Iterator[Piece], column: str, open_file: Callable[[], pa.NativeFile], encoding: str
) -> Iterator[Piece]:
    """`pieces` as they come, the last one with rows without a row whose `column` (the header's last) was never
    closed (pieces of bad rows only may follow it: rows of the wrong width pyarrow turned down last)."""
    held: list[Piece] = []  # the last piece with rows, and those without rows after it
    try:
        for piece in pieces:
            if piece.table is not None and held:
                yield from held
                held = []
            held.append(piece)
    except (ValueError, OSError):  # a break later in the file (or a value to read again): what came before stays
        yield from held
        raise
    if held:
        yield _checked(held[0], column, open_file, encoding)
        yield from held[1:]


def _checked(piece: Piece, column: str, open_file: Callable[[], pa.NativeFile], encoding: str) -> Piece:
    table = piece.table
    if table is None or table.num_rows == 0 or column not in table.column_names:
        return piece
    value = table.column(column)[-1].as_py()
    if isinstance(value, str):
        value = value.encode(encoding, "replace")
    if not isinstance(value, bytes) or not (b"\n" in value or b"\r" in value) or not _ends(open_file, value):
        return piece
    row = table.column(ROW)[-1].as_py()
    breaks = value.count(b"\n")
    problem = (
        f"column {column!r}: the quote opened in this row is never closed (the file ends inside it, {breaks} line "
        "break(s) later), so every line after it was read as this one value: close the quote in the file"
    )
    record = without_texts(table.slice(table.num_rows - 1).drop_columns([ROW])).to_pylist()[0]
    raw = json.dumps(
        record, default=lambda v: v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
    )
    bad = BadRow(row, None, problem, raw)
    return Piece(table.slice(0, table.num_rows - 1), [*piece.bad, bad], piece.rows_done, piece.bad_done)


def _ends(open_file: Callable[[], pa.NativeFile], value: bytes) -> bool:
    """Whether the file's last bytes are `value` (read to its end: only for a last value holding a line break)."""
    stream, tail = open_file(), b""
    while chunk := stream.read(1 << 20):
        tail = (tail + chunk)[-(len(value) + 1) :]
    return tail.endswith(value)
