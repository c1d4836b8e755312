"""Column names of file streams: files spell the same column differently (`name` in one drop, `NAME` in the
next), and the destination's naming folds both into one target column. Each file's columns are spelled as the
stream first knew them (the catalog's key, then the stored schema), so they land in the same column; a file
whose own columns would land in one target column, or under a column the product writes, is parked whole
with the reason instead of loading values under the wrong name."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from ingestion_assets.loading.naming import RESERVED, TargetNames, reserved
from ingestion_assets.sources.files import FILE, ROW, TEXT, CorruptFile

OURS = RESERVED | {FILE, ROW, "_ingest_file_version"}  # what a file stream's rows carry besides the file's


class FileColumnNames:
    """How a stream's file columns are spelled before they load."""

    def __init__(self, names: TargetNames, known: Iterable[str]) -> None:
        self._names = names
        self._spelling: dict[str, str] = {}
        for name in known:
            self._spelling.setdefault(self._folded(name), name)

    def folded(self, name: str) -> str:
        """The target column `name` lands in, compared as the destination compares names."""
        return self._folded(name)

    def _folded(self, name: str) -> str:
        target = self._names.column(name)
        return target if self._names.case_sensitive else target.lower()

    def check(self, table: pa.Table) -> None:
        """Raise CorruptFile (the file is parked) when two of its columns land as one, or one as ours."""
        columns = list(table.column_names)
        if columns.count(ROW) > 1:
            raise CorruptFile(_ours(ROW, ROW))
        seen: dict[str, str] = {}
        for name in columns:
            if name == ROW or name.startswith(TEXT):
                continue  # the reader's own row number, a typed column's text
            target = self._names.column(name)
            if name in OURS or reserved(name) or reserved(target):  # the prefix too: a later version may write it
                raise CorruptFile(_ours(name, target))
            folded = self._folded(name)
            if folded in seen:
                raise CorruptFile(
                    f"its columns {seen[folded]!r} and {name!r} both land as column {target!r} in the destination "
                    f"(naming {self._names.convention!r}"
                    + ("" if self._names.case_sensitive else ", names compared without case")
                    + "): rename one in the file, or read only one of them"
                )
            seen[folded] = name

    def spelled(self, table: pa.Table) -> pa.Table:
        """The table with each column named as the stream first knew the target column it lands in."""
        renamed = [self._spelled(name) for name in table.column_names]
        return table if renamed == table.column_names else table.rename_columns(renamed)

    def _spelled(self, name: str) -> str:
        if name.startswith(TEXT):
            return TEXT + self._spelled(name[len(TEXT) :])
        return name if name.startswith("_ingest_") else self._spelling.setdefault(self._folded(name), name)


def _ours(name: str, target: str) -> str:
    return (
        f"its column {name!r} lands as {target!r}, a column the product writes itself (the file's name, row "
        "number, version or metadata): rename it in the file"
    )
