"""File sources: list a glob of CSV / JSON lines / Parquet files on any fsspec filesystem and read each one in
bounded Arrow batches. No Dagster here; streams/files.py turns the batches into checkpointed slices."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import fsspec

from ingestion_assets.catalog.files import CsvOptions, FilesStream
from ingestion_assets.sources.files.csv import read_csv
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
) -> Iterator[Piece]:
    """The file's rows after `resume` (within `window`, if given), piece by piece. Raises CorruptFile for bytes
    that are not the format (the caller parks the file), StorageError / FileNotFoundError for the storage. Rows
    without their primary key come as bad rows. `folded`: the column a name lands in (the destination's naming),
    by which a JSON line's keys spelled apart (`ID`, `id`) are one column."""
    by_line = file_format(info.path, spec.format)[0] == "jsonl"  # a JSON line's row number is its line
    for piece in _read(fs, info, spec, resume, window):
        if piece.table is None:
            yield piece
            continue
        kept, clashing = one_spelling(piece.table, folded) if by_line and folded else (piece.table, [])
        kept, outside = within(kept, window) if window is not None else (kept, [])
        kept, keyless = keyed(kept, spec.primary_key, by_line)
        yield Piece(kept, piece.bad + clashing + outside + keyless, piece.rows_done, piece.bad_done)


def _read(
    fs: fsspec.AbstractFileSystem, info: FileInfo, spec: FilesStream, resume: Resume, window: RowWindow | None
) -> Iterator[Piece]:
    kind, suffix_compression = file_format(info.path, spec.format)
    compression = suffix_compression if spec.compression == "auto" else None
    compression = spec.compression if spec.compression in ("gzip", "zstd") else compression
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
    """The stream's CSV options for this file: a `.tsv` file is tab-separated unless `csv.delimiter` says."""
    tabs = file_suffix(info.path) == ".tsv" and "delimiter" not in spec.csv.model_fields_set
    return spec.csv.model_copy(update={"delimiter": "\t"}) if tabs else spec.csv
