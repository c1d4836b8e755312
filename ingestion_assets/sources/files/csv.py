"""CSV files in bounded Arrow batches (pyarrow's streaming reader); rows with the wrong number of fields and
values that do not parse as their column's type become bad rows with their file, row and line."""

from __future__ import annotations

import bisect
import csv as pycsv
import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ingestion_assets.catalog.files import CsvOptions
from ingestion_assets.sources.files.csv_header import without_unnamed
from ingestion_assets.sources.files.csv_lines import data_lines, swallowed_lines
from ingestion_assets.sources.files.csv_quotes import closed_at_end
from ingestion_assets.sources.files.infer import typed
from ingestion_assets.sources.files.pieces import ROW, BadRow, CorruptFile, Piece, Resume

BLOCK_BYTES = 4 << 20
_COLUMN = re.compile(r"In CSV column #(\d+)")
_BREAK = re.compile(rb"\r\n|\r|\n")
_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def read_csv(open_file: Callable[[], pa.NativeFile], options: CsvOptions, resume: Resume) -> Iterator[Piece]:
    """Batches of the file after `resume`. A value that fails its column's type (or is not valid text) stops
    pyarrow's reader; the file is then read again from its start with that column as raw bytes, the rows
    already given are skipped, and each bad value's row is parked instead."""
    raw_columns: set[str] = set()
    done = resume
    if options.quote_char or options.escape_char:
        open_file = _line_ended(open_file)
    block = min(BLOCK_BYTES, options.max_row_bytes)
    strictly_read = False
    header = _header(open_file, options)
    if twice := sorted({name for name in header if header.count(name) > 1}):
        raise CorruptFile(  # which of the two is the column's value is unknown (pyarrow refused the stream whole)
            f"its header names the column {twice[0]!r} more than once: rename one in the file, or set "
            "csv.column_names (and csv.header: true to skip the file's own)"
        )
    texts = {name for name in header if name not in options.column_types}  # typed by infer
    while True:
        try:
            reader, invalid_rows = _open(open_file, options, raw_columns, block, texts)
        except _Empty:  # not even a header (a compressed empty file): no rows, nothing wrong
            if found := data_lines(open_file, options):  # unless a quote never closed swallowed the file
                raise CorruptFile(
                    f"read as an empty file, though it holds {found} line(s) after its first: a quote in its "
                    "header is likely never closed (check its quotes and csv options)"
                ) from None
            return
        except _BadValue as bad:  # in the first block, which the reader converts as it opens
            if _straddles(str(bad)):
                block = _larger(block, options)
                continue
            if bad.column is None or bad.column in raw_columns:
                raise CorruptFile(f"not readable as CSV: {bad}") from bad
            raw_columns.add(bad.column)
            continue
        declared = {name: _TYPES[kind] for name, kind in options.column_types.items()}
        # a column read as bytes after a bad value is cast back to its declared type, or to text (then inferred)
        wanted = {f.name: declared.get(f.name, pa.string()) for f in reader.schema}
        lines = _LineFinder(open_file, options.encoding)  # each pass meets the bad lines from the file's start
        try:
            before = 0 if options.column_names and not options.header else 1
            pieces = _pieces(reader, invalid_rows, done, wanted, raw_columns, lines, texts, before)
            quoting = (options.quote_char, options.escape_char, options.delimiter)
            for checked in closed_at_end(pieces, reader.schema.names[-1], open_file, options.encoding, quoting):
                # typed once the end is checked: an unclosed last value (`"11<EOF>`) must not make its column text
                table = None if checked.table is None else typed(checked.table, texts)
                piece = Piece(table, checked.bad, checked.rows_done, checked.bad_done)
                if not strictly_read and options.quote_char and _spans_lines(piece.table):
                    strictly_read = True  # a value over several lines: is it one, or rows swallowed by a quote?
                    if (reason := swallowed_lines(open_file, options)) is not None:
                        raise CorruptFile(reason)
                done = Resume(piece.rows_done, piece.bad_done)
                yield piece
            if done == Resume() and (found := data_lines(open_file, options)):
                raise CorruptFile(
                    f"read as no row at all, though it holds {found} record(s) after its header: check its quotes "
                    "and csv options (delimiter, quote_char, header)"
                )
            return
        except pa.ArrowInvalid as exc:
            if _straddles(str(exc)):  # a row longer than a block: read again in larger blocks, given rows skipped
                block = _larger(block, options)
                continue
            column = _failing_column(str(exc), reader.schema.names)
            if column is None or column in raw_columns:
                raise CorruptFile(f"not readable as CSV: {exc}") from exc
            raw_columns.add(column)


def _line_ended(open_file: Callable[[], pa.NativeFile]) -> Callable[[], Any]:
    """The file as read, with a line break added after its last byte when it has none: a quote opened in the last
    line and never closed (`2,b,"cut short<EOF>`) then holds a line break and runs to the file's end, as with one,
    and is parked (`closed_at_end`); without it pyarrow read `cut short` as a whole value (found by the fifth files
    attacker). A file ending in a line break is read as it is."""
    return lambda: io.BufferedReader(_LineEnded(open_file()), 1 << 20)


class _LineEnded(io.RawIOBase):
    def __init__(self, stream: pa.NativeFile) -> None:
        self._stream, self._last, self._ended = stream, b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        if data:
            buffer[: len(data)] = data
            self._last = data[-1:]
            return len(data)
        if self._ended or self._last in (b"", b"\n", b"\r"):
            return 0
        self._ended = True
        buffer[:1] = b"\n"
        return 1

    def close(self) -> None:
        self._stream.close()
        super().close()


def _spans_lines(table: pa.Table | None) -> bool:
    """Whether a text value of the piece may hold a line break: the bytes behind its text columns are scanned
    (~9x faster than a regex per value; bytes of rows sliced away may answer yes, which costs one check more)."""
    if table is None:
        return False
    for column in table.columns:
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        for chunk in column.chunks:
            data = chunk.buffers()[2]
            raw = data.to_pybytes() if data is not None else b""
            if b"\n" in raw or b"\r" in raw:
                return True
    return False


def _straddles(message: str) -> bool:
    return "straddling object straddles two block boundaries" in message


def _larger(block: int, options: CsvOptions) -> int:
    """The next block size for a file with a row longer than `block`, up to the stream's csv.max_row_bytes."""
    if block >= options.max_row_bytes:
        raise CorruptFile(
            f"a row (one field may be most of it) is longer than csv.max_row_bytes ({options.max_row_bytes} bytes): "
            "raise csv.max_row_bytes in the stream's catalog entry to read it (each read holds one such row in memory)"
        )
    return min(block * 4, options.max_row_bytes)


class _BadValue(ValueError):
    def __init__(self, message: str, column: str | None) -> None:
        super().__init__(message)
        self.column = column


class _Empty(ValueError):
    """The file holds no line at all."""


def _open(
    open_file: Callable[[], pa.NativeFile],
    options: CsvOptions,
    raw: set[str],
    block: int,
    texts: set[str],
) -> tuple[pacsv.CSVStreamingReader, list[Any]]:
    """The reader of the file: declared columns in their types, the others as text (typed batch by batch)."""
    bad: list[Any] = []

    def invalid(row: Any) -> str:
        bad.append(row)
        return "skip"

    types = {name: _TYPES[kind] for name, kind in options.column_types.items()}
    types.update(dict.fromkeys(texts, pa.string()))
    types.update({name: pa.binary() for name in raw})
    try:
        reader = pacsv.open_csv(
            open_file(),
            read_options=pacsv.ReadOptions(
                block_size=block,
                encoding=options.encoding,
                column_names=options.column_names,
                skip_rows=1 if options.header and options.column_names else 0,
                use_threads=False,
            ),
            parse_options=pacsv.ParseOptions(
                delimiter=options.delimiter,
                quote_char=options.quote_char or False,
                escape_char=options.escape_char or False,
                # pyarrow's fast chunker cuts blocks at any line end: a quoted value over several lines across a
                # cut was read as rows of its own, silently when its lines looked like rows (found by the fourth
                # files attacker). The chunker that knows quotes costs ~5-10 % of the parse.
                newlines_in_values=bool(options.quote_char or options.escape_char),
                invalid_row_handler=invalid,
            ),
            convert_options=pacsv.ConvertOptions(  # a quoted value is text as written: "" and "NULL" are no NULL
                column_types=types,
                null_values=options.null_values,
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" in str(exc):
            raise _Empty from exc
        raise _BadValue(str(exc), _failing_column(str(exc), _header(open_file, options))) from exc
    return reader, bad


def _pieces(
    reader: Any,
    invalid_rows: list[Any],
    done: Resume,
    wanted: dict[str, pa.DataType],
    raw: set[str],
    lines: _LineFinder,
    texts: set[str],
    before: int = 1,
) -> Iterator[Piece]:
    """A row's number is its record's among the file's records, rows of the wrong width counted (a bad line keeps
    its number: the rows after it are not renumbered when a line goes bad). `done` says the last number an
    earlier pass or run gave (and how many rows of the wrong width it parked): those are skipped. `before`: the
    records before the first row (the header)."""
    last, invalid = 0, 0
    skipped: list[int] = []  # the numbers of rows of the wrong width not passed yet, in order
    for batch in reader:
        bad, invalid = _invalid(invalid_rows, invalid, done, lines, skipped, before)
        numbers = _numbers(last, batch.num_rows, skipped)
        last = numbers[-1] if numbers else last
        first = bisect.bisect_right(numbers, done.rows)  # the rows an earlier read gave are skipped
        if first == len(numbers):
            if bad:
                yield Piece(None, bad, max(last, done.rows), max(invalid, done.bad))
            continue
        table = pa.Table.from_batches([batch]).slice(first)
        table = table.append_column(ROW, pa.array(numbers[first:], pa.int64()))
        if raw:
            table, failed = _coerce(table, wanted, raw)
            bad += failed
        yield Piece(without_unnamed(table), bad, last, max(invalid, done.bad))
    # rows pyarrow turned down after its last batch (or in a file it gave no batch of: a quote opened in the first
    # row and never closed takes every line after it into one row of the wrong width) are parked, never dropped
    bad, invalid = _invalid(invalid_rows, invalid, done, lines, skipped, before)
    if bad or skipped:
        last = max([last, *skipped])
    if bad:
        yield Piece(None, bad, max(last, done.rows), max(invalid, done.bad))


def _numbers(last: int, count: int, skipped: list[int]) -> list[int]:
    """The numbers of `count` rows after number `last`, passing over those of the rows of the wrong width."""
    found: list[int] = []
    start = last + 1
    while count > 0:
        while skipped and skipped[0] < start:
            skipped.pop(0)
        stop = skipped[0] if skipped else start + count
        take = min(count, stop - start)
        found.extend(range(start, start + take))
        count -= take
        start += take
        if count > 0:
            start = skipped.pop(0) + 1
    return found


def _invalid(
    invalid_rows: list[Any], invalid: int, done: Resume, lines: _LineFinder, skipped: list[int], before: int
) -> tuple[list[BadRow], int]:
    """The rows of the wrong width pyarrow turned down so far, parked (those an earlier read parked are counted);
    their numbers (pyarrow's, the header counted) join `skipped`."""
    bad: list[BadRow] = []
    for row in invalid_rows:
        invalid += 1
        if row.number is not None and row.number > before:
            skipped.append(int(row.number) - before)
        line = lines.find(row.text)  # also for those given before: the finder passes their lines in order
        if invalid > done.bad:
            bad.append(BadRow(None, line, _width_problem(row), row.text, ordinal=invalid))
    invalid_rows.clear()
    return bad, invalid


def _width_problem(row: Any) -> str:
    problem = f"{row.actual_columns} fields where the header has {row.expected_columns}"
    if "\n" in row.text or "\r" in row.text:  # one row over several lines: a quote opened and never closed
        breaks = row.text.count("\n") or row.text.count("\r")
        problem += (
            f" (it runs over {breaks + 1} lines: a quote opened in it is likely never closed, so the lines after it "
            "were read as part of it: close the quote in the file)"
        )
    return problem


def _coerce(table: pa.Table, wanted: dict[str, pa.DataType], raw: set[str]) -> tuple[pa.Table, list[BadRow]]:
    """Columns read as bytes after a bad value get their type back; rows whose value does not fit are parked."""
    bad_rows: dict[int, str] = {}
    columns: dict[str, list[Any]] = {}
    read = table  # as read: a parked row keeps its values as they were in the file
    for name in raw:
        kind = wanted[name]
        values = table.column(name)
        if not pa.types.is_string(kind):  # a quoted "" in a typed column: missing, as an empty field is
            values = pc.if_else(pc.equal(pc.binary_length(values), 0), pa.scalar(None, values.type), values)
        try:
            table = table.set_column(
                table.schema.get_field_index(name), name, pc.cast(pc.cast(values, pa.string()), kind)
            )
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        fixed: list[Any] = []
        for index, value in enumerate(values.to_pylist()):
            fixed.append(_one(value, kind, name, index, bad_rows))
        columns[name] = fixed
    for name, fixed in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(fixed, wanted[name]))
    if not bad_rows:
        return table, []
    rows = table.column(ROW).to_pylist()
    records = read.to_pylist()
    failed = [
        BadRow(rows[i], None, problem, json.dumps(_printable(records[i]), default=str))
        for i, problem in bad_rows.items()
    ]
    keep = pa.array([i not in bad_rows for i in range(table.num_rows)])
    return table.filter(keep), failed


def _one(value: bytes | None, kind: pa.DataType, name: str, index: int, bad_rows: dict[int, str]) -> Any:
    if value is None:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_rows.setdefault(
            index, f"column {name!r}: invalid UTF-8 (byte {exc.start}: {value[exc.start : exc.start + 1]!r})"
        )
        return None
    try:
        return pa.scalar(text).cast(kind).as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad_rows.setdefault(index, f"column {name!r}: {text[:80]!r} is not a valid {kind}")
        return None


def _printable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v for k, v in record.items()}


def _failing_column(message: str, names: list[str]) -> str | None:
    match = _COLUMN.search(message)
    if match is None or int(match.group(1)) >= len(names):
        return None
    return names[int(match.group(1))]


def _header(open_file: Callable[[], pa.NativeFile], options: CsvOptions) -> list[str]:
    """The column names, read apart (a bad value in the first block stops pyarrow before it names them)."""
    if options.column_names:
        return list(options.column_names)
    lines = _lines_of(open_file())
    line = next(lines, b"")
    try:
        first = line.decode(options.encoding)
    except UnicodeDecodeError as exc:
        raise CorruptFile(
            f"its header (line 1) is not valid {options.encoding} at byte {exc.start} "
            f"({line[exc.start : exc.start + 1]!r}): fix the header, or set csv.encoding or csv.column_names"
        ) from exc
    quote = options.quote_char or ""
    dialect: dict[str, Any] = {
        "delimiter": options.delimiter,
        "quotechar": quote or None,
        "quoting": pycsv.QUOTE_MINIMAL if quote else pycsv.QUOTE_NONE,
    }
    if quote and quote in first and next(lines, None) is None:
        _closed_header(first, dialect)
    return next(pycsv.reader([first], **dialect), [])


def _closed_header(first: str, dialect: dict[str, Any]) -> None:
    """A file of one line whose quote never closes (a lone `"`): pyarrow reads it as an empty file, no row and
    nothing wrong; it is parked (lines after such a header are counted by `data_lines` instead)."""
    try:
        next(pycsv.reader([first], strict=True, **dialect), None)
    except pycsv.Error as exc:
        if "end of data" not in str(exc):  # a quote closed mid-field (`"a"b`) swallows nothing: read as before
            return
        raise CorruptFile(
            f"its only line (line 1) opens a quote that is never closed ({exc}): the file is cut short or its "
            "quotes are broken; fix the file (a quote inside a quoted value is written twice)"
        ) from exc


class _LineFinder:
    """The line number of a bad row (pyarrow's streaming reader does not know it): bad rows come in file order,
    so one forward scan of the file, only for files that have any, finds them all. It must be shown every bad
    row of the pass, those a resumed read skips too: a later bad line with the same text as a skipped one
    would otherwise be found at the skipped one's line."""

    def __init__(self, open_file: Callable[[], pa.NativeFile], encoding: str) -> None:
        self._open, self._encoding = open_file, encoding
        self._lines: Iterator[tuple[int, bytes]] | None = None

    def find(self, text: str) -> int | None:
        if self._lines is None:
            self._lines = enumerate(_lines_of(self._open()), start=1)
        first, *more = _BREAK.split(text.encode(self._encoding, "replace"))  # a row may run over lines
        for number, line in self._lines:
            if line == first:
                for _ in more:  # its other lines are no other row's
                    next(self._lines, None)
                return number
        return None


def _lines_of(stream: pa.NativeFile) -> Iterator[bytes]:
    """The file's lines without their ends, as pyarrow (and Python's csv) count them: CR LF, LF and a CR alone
    (old Mac files) each end a line."""
    pending = b""
    while chunk := stream.read(1 << 20):
        pending += chunk
        held = pending.endswith(b"\r")  # perhaps the first half of a CR LF
        *complete, pending = _BREAK.split(pending[:-1] if held else pending)
        pending += b"\r" if held else b""
        yield from complete
    if pending:
        *complete, last = _BREAK.split(pending)
        yield from complete
        if last:
            yield last
