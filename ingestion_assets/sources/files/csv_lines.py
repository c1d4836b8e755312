"""The line of a CSV file where a row starts: pyarrow's reader counts rows, not lines (a quoted value may span
lines, blank lines and rows with the wrong number of fields are no rows), so a row parked by its number (a value
not of its column's type, a missing key) is given its line by reading the file forward once, only for files that
park such rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from ingestion_assets.catalog.files import CsvOptions


class RowLines:
    """Row number -> the line it starts on, asked in increasing row order (one forward scan per file read)."""

    def __init__(self, open_file: Callable[[], pa.NativeFile], options: CsvOptions) -> None:
        self._open, self._options = open_file, options
        self._rows: Iterator[tuple[int, int]] | None = None
        self._last: tuple[int, int] = (0, 0)

    def line(self, row: int) -> int | None:
        if self._last[0] == row:
            return self._last[1]
        if self._rows is None or self._last[0] > row:
            self._rows = self._scan()
        for found in self._rows:
            self._last = found
            if found[0] == row:
                return found[1]
            if found[0] > row:
                return None
        return None

    def _scan(self) -> Iterator[tuple[int, int]]:
        options = self._options
        records = _records(self._open, options)
        width = len(options.column_names) if options.column_names else None
        skip = 1 if options.header else 0
        row, end = 0, 0
        for record in records:
            start, end = end + 1, records.line_num
            if skip:
                skip -= 1
                width = width if width is not None else len(record)
                continue
            if not record:
                continue  # a blank line (a row of the wrong width has its number: csv.py)
            row += 1
            yield row, start


def data_lines(open_file: Callable[[], pa.NativeFile], options: CsvOptions) -> int:
    """The number of non-blank records after the header, as Python's csv module reads the file: a check that a
    file pyarrow gave no row and no bad row of holds none (a whole file read as nothing must say why)."""
    records = _records(open_file, options)
    found = 0
    for index, record in enumerate(records):
        if index == 0 and options.header:  # a quote never closed in the header swallows the lines after it
            found += sum(name.count("\n") + name.count("\r") - name.count("\r\n") for name in record)
        elif any(record):
            found += 1
    return found


def swallowed_lines(open_file: Callable[[], pa.NativeFile], options: CsvOptions) -> str | None:
    """Why the file's rows cannot be trusted, if a quoted value runs over several lines and its quote closes in
    the middle of a field (`2,b,"20` … `5,e,"50`): pyarrow, like any lenient reader, reads the lines between
    into that one value, a row of the right width, so the rows on them vanish without a bad row. RFC 4180's
    strict reading refuses a closing quote followed by anything but a delimiter or a line end; a single-line
    value so written (`"ab"c`) swallows nothing and reads as most readers read it."""
    records = _records(open_file, options, strict=True)
    end = 0
    while True:
        start = end + 1
        try:
            next(records)
        except StopIteration:
            return None
        except csv.Error as exc:
            if records.line_num > start and "expected after" in str(exc):
                return (
                    f"the quoted value starting on line {start} runs to line {records.line_num}, where its quote "
                    f"closes in the middle of a field ({exc}): the rows on the lines between would vanish into "
                    "it; fix the quotes in the file (a quote inside a quoted value is written twice)"
                )
        end = records.line_num


def _records(open_file: Callable[[], pa.NativeFile], options: CsvOptions, strict: bool = False) -> Any:
    text = io.TextIOWrapper(open_file(), encoding=options.encoding, errors="replace", newline="")
    quote = options.quote_char
    return csv.reader(
        text,
        delimiter=options.delimiter,
        quotechar=quote,
        escapechar=options.escape_char,
        quoting=csv.QUOTE_MINIMAL if quote else csv.QUOTE_NONE,
        strict=strict,
    )
