"""Plain Parquet stream tables (`table_format: parquet`): a folder of dlt's files per table, appended or replaced.

Without a table format there is no commit to merge, delete or swap in one step, so the catalog refuses a stream
that needs one (catalog/destination.py: merge on a key, CDC) and this store does
what appending and replacing need: read the folder, empty it, and the refresh's swap (the shadow's files moved in,
then the old ones removed; a reader in between sees both generations, told apart by `_ingest_generation_id`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads


class NeedsTableFormat(RuntimeError):
    """A change plain Parquet files cannot make in place; the message says which table format can."""

    transient = False


@dataclass(frozen=True)
class ParquetFiles:
    pipeline: Any  # the stream's dlt pipeline: its filesystem client reaches the folder with the credentials

    def _files(self, table: str) -> tuple[Any, list[str]]:
        with self.pipeline.destination_client() as client:
            folder = posixpath.join(client.dataset_path, table)
            fs = client.fs_client
            if not fs.isdir(folder):
                return fs, []
            return fs, sorted(p for p in fs.find(folder) if p.endswith(".parquet"))

    def dataset(self, table: str) -> Any:
        fs, files = self._files(table)
        return pads.dataset(files, format="parquet", filesystem=fs) if files else None

    def lineage(self, table: str) -> str | None:
        """Plain files keep no history to compare with."""
        return None

    def went_back(self, table: str, lineage: str) -> str | None:
        return None

    def has_rows(self, table: str) -> bool | None:
        dataset = self.dataset(table)
        return None if dataset is None else dataset.count_rows() > 0

    def delete(self, table: str, predicate: str | None = None) -> None:
        if predicate is not None:
            self._refuse(table, "delete rows")
        fs, files = self._files(table)
        if files:
            fs.rm(files)

    def update(self, table: str, updates: dict[str, str], predicate: str) -> None:
        self._refuse(table, "flag rows deleted")

    def retire_keys(self, table: str, keys: pa.Table, soft: bool) -> int:
        self._refuse(table, "apply deletions by key")
        return 0

    def flag_deleted(self, table: str, key: tuple[str, ...], marks: pa.Table) -> int:
        self._refuse(table, "flag rows deleted")
        return 0

    def overwrite_with(self, table: str, shadow: str) -> bool:
        fs, new = self._files(shadow)
        if not new:
            return False
        _, old = self._files(table)
        with self.pipeline.destination_client() as client:
            folder = posixpath.join(client.dataset_path, table)
        for path in new:
            fs.mv(path, posixpath.join(folder, posixpath.basename(path)))  # dlt's names are unique per load
        if old:
            fs.rm(old)
        return True

    def replace(self, table: str, rows: pa.Table) -> None:
        self._refuse(table, "change a column's type")

    def prepare_columns(self, table: str, schema: pa.Schema) -> None:
        """Nothing before a load: plain files take new columns in the files that bring them."""

    def sync(self, table: str) -> None:
        """dlt's files are complete when its load returns; there is no commit record to make durable."""

    @staticmethod
    def _refuse(table: str, what: str) -> None:
        raise NeedsTableFormat(
            f"table {table}: plain Parquet files cannot {what} in place; use `table_format: delta` or `iceberg`"
        )
