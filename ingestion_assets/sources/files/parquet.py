"""Parquet files row group by row group, in bounded batches; a resume skips whole row groups by their counts, and
a row window skips the row groups whose statistics exclude it (their bytes are never read)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ingestion_assets.sources.files.listing import StorageError
from ingestion_assets.sources.files.parquet_types import fitted
from ingestion_assets.sources.files.pieces import ROW, CorruptFile, Piece, Resume, RowWindow
from ingestion_assets.sources.files.window import excluded


def read_parquet(
    open_file: Callable[[], pa.NativeFile], batch_rows: int, resume: Resume, window: RowWindow | None = None
) -> Iterator[Piece]:
    try:
        opened = open_file()
        if opened.size() == 0:
            return  # an empty drop (a writer's placeholder): no rows, nothing wrong
        parquet = pq.ParquetFile(opened)
    except (pa.ArrowInvalid, OSError) as exc:
        if _from_storage(exc):
            raise
        raise CorruptFile(f"not readable as Parquet: {exc}") from exc
    offset = 0
    for group in range(parquet.num_row_groups):
        count = parquet.metadata.row_group(group).num_rows
        if offset + count <= resume.rows:
            offset += count  # read before: its metadata is enough to skip it
            continue
        if window is not None and excluded(parquet, group, window):
            offset += count  # none of its rows is in the window: counted as given, not read
            yield Piece(None, [], offset)
            continue
        try:
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group], use_threads=False):
                first, offset = offset + 1, offset + batch.num_rows
                table = pa.Table.from_batches([batch])
                if offset <= resume.rows:
                    continue
                if first <= resume.rows:
                    table, first = table.slice(resume.rows - first + 1), resume.rows + 1
                table, bad = fitted(table.append_column(ROW, pa.array(range(first, offset + 1), pa.int64())))
                yield Piece(table, bad, offset)
        except (pa.ArrowInvalid, OSError) as exc:
            if _from_storage(exc):
                raise
            raise CorruptFile(f"row group {group} of {parquet.num_row_groups} is not readable: {exc}") from exc


def _from_storage(exc: BaseException) -> bool:
    return isinstance(exc, StorageError | FileNotFoundError)
