"""File sources: list a glob of CSV / JSON lines / Parquet files on any fsspec filesystem and read each one in
bounded Arrow batches. No Dagster here; streams/files.py turns the batches into checkpointed slices."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import fsspec

from ingestion_assets.catalog.files import CsvOptions, FilesStream
from ingestion_assets.sources.files.csv import read_csv
from ingestion_assets.sources.files.csv_lines import RowLines
from ingestion_assets.sources.files.jsonl import read_jsonl
from ingestion_assets.sources.files.keys import keyed
from ingestion_assets.sources.files.listing import (
    FileInfo,
    MissingLocation,
    StorageError,
    file_format,
    file_suffix,
    filesystem,
    list_files,
    open_bytes,
    open_seekable,
)
from ingestion_assets.sources.files.nul import without_nul
from ingestion_assets.sources.files.parquet import read_parquet
from ingestion_assets.sources.files.pieces import (
    FILE,
    ROW,
    TEXT,
    BadRow,
    CorruptFile,
    Piece,
    Resume,
    RowWindow,
    at_most,
    without_texts,
)
from ingestion_assets.sources.files.spellings import one_spelling
from ingestion_assets.sources.files.window import within

__all__ = [
    "FILE",
    "ROW",
    "TEXT",
    "BadRow",
    "CorruptFile",
    "FileInfo",
    "MissingLocation",
    "Piece",
    "Resume",
    "RowWindow",
    "StorageError",
    "at_most",
    "filesystem",
    "list_files",
    "read_file",
    "without_texts",
]


def read_file(
    fs: fsspec.AbstractFileSystem,
    info: FileInfo,
    spec: FilesStream,
    resume: Resume,
    window: RowWindow | None = None,
    folded: Callable[[str], str] | None = None,
    nul_refused_by: str | None = None,
) -> Iterator[Piece]:
    """The file's rows after `resume` (within `window`, if given), piece by piece. Raises CorruptFile for bytes
    that are not the format (the caller parks the file), StorageError / FileNotFoundError for the storage. Rows
    without their primary key come as bad rows. `folded`: the column a name lands in (the destination's naming),
    by which a JSON line's keys spelled apart (`ID`, `id`) are one column. `nul_refused_by`: the target whose text
    cannot hold the NUL character (PostgreSQL), if it cannot: rows holding one are bad rows."""
    kind = file_format(info.path, spec.format)[0]
    by_line = kind == "jsonl"  # a JSON line's row number is its line
    compression = _compression(info, spec)
    lines = (
        RowLines(lambda: open_bytes(fs, info.path, compression), _csv_options(info, spec)) if kind == "csv" else None
    )
    for piece in _read(fs, info, spec, resume, window):
        if piece.table is None:
            yield piece
            continue
        kept, clashing = one_spelling(piece.table, folded) if by_line and folded else (piece.table, [])
        kept, outside = within(kept, window) if window is not None else (kept, [])
        kept, keyless = keyed(kept, spec.primary_key, by_line)
        kept, nul = without_nul(kept, by_line, nul_refused_by) if nul_refused_by else (kept, [])
        bad = piece.bad + clashing + outside + keyless + nul
        yield Piece(kept, _with_lines(bad, lines) if lines else bad, piece.rows_done, piece.bad_done)


def _with_lines(bad: list[BadRow], lines: RowLines) -> list[BadRow]:
    """A CSV row parked by its number, with the line it starts on (rows come in order: one forward scan)."""
    numbered = sorted((b.row, i) for i, b in enumerate(bad) if b.line is None and b.row is not None)
    found = {i: lines.line(row) for row, i in numbered}
    return [replace(b, file_line=found[i]) if i in found else b for i, b in enumerate(bad)]


def _compression(info: FileInfo, spec: FilesStream) -> str | None:
    suffix_compression = file_format(info.path, spec.format)[1]
    compression = suffix_compression if spec.compression == "auto" else None
    return spec.compression if spec.compression in ("gzip", "zstd") else compression


def _read(
    fs: fsspec.AbstractFileSystem, info: FileInfo, spec: FilesStream, resume: Resume, window: RowWindow | None
) -> Iterator[Piece]:
    kind, compression = file_format(info.path, spec.format)[0], _compression(info, spec)
    if kind is None:
        raise CorruptFile("the format is not known from the file's name: set the stream's `format`")
    try:
        if kind == "parquet":
            yield from read_parquet(lambda: open_seekable(fs, info.path), spec.batch_rows, resume, window)
        elif kind == "jsonl":
            yield from read_jsonl(lambda: open_bytes(fs, info.path, compression), spec.batch_rows, resume)
        else:
            yield from read_csv(lambda: open_bytes(fs, info.path, compression), _csv_options(info, spec), resume)
    except (StorageError, FileNotFoundError):
        raise
    except OSError as exc:  # raised by the decoder (truncated gzip, bad zstd frame), not by the storage
        raise CorruptFile(f"cannot be decompressed or read ({compression or 'uncompressed'}): {exc}") from exc


def _csv_options(info: FileInfo, spec: FilesStream) -> CsvOptions:
    """The stream's CSV options for this file: a `.tsv` file is tab-separated unless `csv.delimiter` says, and a
    tab-separated `.tsv` file has no quote character unless `csv.quote_char` says (TSV writers do not quote: a
    `"` in it is data, `"Hello" she said` as written)."""
    given = spec.csv.model_fields_set
    if file_suffix(info.path) != ".tsv":
        return spec.csv
    update: dict[str, Any] = {} if "delimiter" in given else {"delimiter": "\t"}
    if "quote_char" not in given and update.get("delimiter", spec.csv.delimiter) == "\t":
        update["quote_char"] = None
    return spec.csv.model_copy(update=update) if update else spec.csv
