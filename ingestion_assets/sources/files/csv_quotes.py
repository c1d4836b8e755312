"""A quote a CSV file opens and never closes: pyarrow's reader takes everything to the end of the file as that
one value (the rows after it vanish into it, no error). The file's last row is checked: a value of its last
column that holds a line break and runs to the file's last byte was never closed, and the row is parked."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator

import pyarrow as pa

from ingestion_assets.sources.files.pieces import ROW, BadRow, Piece, without_texts

Quoting = tuple[str | None, str | None, str]  # the quote character, the escape character, the delimiter


def closed_at_end(
    pieces: Iterator[Piece],
    column: str,
    open_file: Callable[[], pa.NativeFile],
    encoding: str,
    quoting: Quoting,
) -> Iterator[Piece]:
    """`pieces` as they come, the last one with rows without a row whose `column` (the header's last) was never
    closed (pieces of bad rows only may follow it: rows of the wrong width pyarrow turned down last). `quoting`:
    the file's quote and escape characters and delimiter."""
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
        yield _checked(held[0], column, open_file, encoding, quoting)
        yield from held[1:]


def _checked(
    piece: Piece,
    column: str,
    open_file: Callable[[], pa.NativeFile],
    encoding: str,
    quoting: Quoting,
) -> Piece:
    table = piece.table
    if table is None or table.num_rows == 0 or column not in table.column_names:
        return piece
    value = table.column(column)[-1].as_py()
    if isinstance(value, str):
        value = value.encode(encoding, "replace")
    if not isinstance(value, bytes):
        return piece
    if not (b"\n" in value or b"\r" in value):
        return piece
    quote, escape, _ = quoting
    if escape:  # an escaped character loses its escape in the value: the file's own quotes say
        if not _ends_quoted(open_file, encoding, quoting):
            return piece
    else:
        ending = _ending(value, (quote or "").encode(encoding))
        if ending is None or not _tail(open_file, len(ending)).endswith(ending):
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


def _ending(value: bytes, quote: bytes) -> bytes | None:
    """How a file without an escape character writes the end of `value` if the value runs to the file's end: as it
    is, or, from its last quote on, that quote doubled (`x"y` is `x""y` there) and the text after it. None when the
    value ends in a quote: it was closed (an unclosed one ends with the file's line break)."""
    cut = value.rfind(quote) if quote else -1
    if cut < 0:
        return value
    written = value[cut + len(quote) :]
    if not (b"\n" in written or b"\r" in written):
        return None
    return quote + quote + written


def _ends_quoted(open_file: Callable[[], pa.NativeFile], encoding: str, quoting: Quoting) -> bool:
    """Whether the file ends inside a quoted value, read as pyarrow reads it: a quote opens a value only at a field's
    start, `""` in one is a quote, text after a closing quote goes on unquoted, the escape character takes the next
    character as it is. A scan of the whole file in Python: only for a last value over several lines in a file with
    an escape character (whose value no longer shows where the file escaped)."""
    quote, escape, delimiter = quoting
    chars = "".join(c for c in (quote, escape, delimiter) if c) + "\r\n"
    specials = re.compile("[" + re.escape(chars) + "]")
    text = io.TextIOWrapper(open_file(), encoding=encoding, errors="replace", newline="")
    quoted = closing = escaped = False  # closing: a quote just ended a quoted value (or is the first of `""`)
    at_start = True
    while chunk := text.read(1 << 20):
        i = 0
        while i < len(chunk):
            if escaped:
                escaped, i = False, i + 1
                if not quoted:
                    at_start = closing = False
                continue
            found = specials.search(chunk, i)
            if found is None or found.start() > i:  # ordinary characters first
                if not quoted:
                    at_start = closing = False
                if found is None:
                    break
            char, i = found.group(), found.end()
            if char == escape:
                escaped = True
            elif quoted:
                if char == quote:
                    quoted, closing = False, True
            elif char == quote and (closing or at_start):
                quoted, closing, at_start = True, False, False
            elif char == quote:
                closing = False
            else:  # a delimiter or a line end outside quotes: a field starts
                at_start, closing = True, False
    return quoted


def _tail(open_file: Callable[[], pa.NativeFile], size: int) -> bytes:
    """The file's last `size` bytes (read to its end: only for a last value holding a line break)."""
    stream, tail = open_file(), b""
    while chunk := stream.read(1 << 20):
        tail = (tail + chunk)[-size:]
    return tail
