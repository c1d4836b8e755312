"""Files deleted at the source (`deletes: hard | soft`): the target rows that came from a file the listing no
longer shows are deleted, or kept with `_ingest_deleted_at`; `keep` (the default) leaves them.

Which rows a file "holds" is the same for a keyless and a keyed stream: the rows whose `_ingest_file` names it.
Keyless, those are exactly the file's rows. Keyed, they are the keys whose newest version came from that file;
an older version of such a key in a file still present is not brought back (it was superseded, and is read
again only if that file changes, or after `ingest state reset`). A rewritten file needs nothing here: its
rows are merged again by key (or by file and row).

No row is retired while a file that may hold it is unread: a run reads every listed file before it retires (an
old file no checkpoint or target row knows is read too: files_progress.py), and the rows of the files gone from
the listing never win over rows read in that run (`Loader.released_sources`), so a file renamed keeping its
modified time moves its rows to the new name (equal versions) before the old name's rows are retired.

Nor while a listed file holds the same content: a keyed stream's rows of a gone file whose fingerprint (size and
etag: object stores; a local disk has none) a listed file has now move to that file (`_ingest_file` becomes its
name) instead of being retired. An S3 copy read after its original takes the keys over (equal versions, a later
read), and deleting the copy must not retire the keys the original, still listed, holds (issue 17).

A partition by a column reads every file for its window's rows: its run retires only the gone files' rows of its
window. A file renamed keeping its modified time holds the other windows' rows under its new name, which only their
partitions read: retired by this run, they were missing until each of those partitions ran again.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import pyarrow as pa

from ingestion_assets.loading.metadata_columns import DELETED_AT
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.loading.target_sql import undefined_relation
from ingestion_assets.sources.files import FILE, ROW, RowWindow
from ingestion_assets.streams.files_partitions import window_sql

if TYPE_CHECKING:
    from ingestion_assets.loading.lake import LakeLoader

_CHUNK = 500  # files per statement


@dataclass(frozen=True)
class Retired:
    files: list[str]  # files gone from the source whose rows were retired
    rows: int
    refused: str | None = None
    live: set[str] = field(default_factory=set)  # the files the target holds live rows of now
    moved: dict[str, str] = field(default_factory=dict)  # gone file -> the listed file of its content: rows moved


def retire_deleted_files(
    loader: Loader,
    listed: set[str],
    held: Any,
    mode: str,
    stream: str,
    log: logging.Logger | Any | None,
    copies: dict[str, str] | None = None,
    window: RowWindow | None = None,
) -> Retired:
    """Retire the rows of the files the target holds (those `held(file)` says are the partition's) that are
    not `listed` now. An empty listing retires nothing: a wrong url or prefix must not empty the target.
    `copies`: gone file -> a listed file of the same content (keyed streams): its rows move there, not retired.
    `window`: a partition by a column retires only those files' rows in its window."""
    target = target_files(loader)
    gone = sorted(f for f in target if f not in listed and held(f))
    if not gone:
        return Retired([], 0, live=target)
    moved = {f: copies[f] for f in gone if copies and copies.get(f) in listed}
    if moved:
        rows = _move(loader, moved)
        if log is not None:
            log.info(
                "%s: %d file(s) deleted at the source whose content a listed file holds: %d row(s) moved to it, "
                "none retired (e.g. %s)",
                stream,
                len(moved),
                rows,
                ", ".join(f"{f} -> {to}" for f, to in list(moved.items())[:5]),
            )
        target = (target - set(moved)) | set(moved.values())
        gone = [f for f in gone if f not in moved]
        if not gone:
            return Retired([], 0, live=target, moved=moved)
    if not listed:
        refused = (
            f"stream {stream}: the listing found no file at all while the target holds rows of {len(target)} "
            "file(s): nothing retired (check the source's url and the stream's path; delete the rows by hand "
            "if every file really was removed)"
        )
        if log is not None:
            log.warning("%s", refused)
        return Retired([], 0, refused, target)
    rows = _retire(loader, gone, soft=mode == "soft", window=window)
    if log is not None:
        log.info("%s: %d file(s) deleted at the source, %d row(s) %s", stream, len(gone), rows, mode + " deleted")
    return Retired(gone, rows, live=target - set(gone), moved=moved)


def target_files(loader: Loader) -> set[str]:
    """The files the target holds live rows of (its `_ingest_file` values): which files were read, exactly."""
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        column = client.escape_column_name(loader.names.column(FILE))
        try:
            rows = client.execute_sql(f"SELECT DISTINCT {column} FROM {table} WHERE {DELETED_AT} IS NULL")
        except undefined_relation():
            return set()
    return {str(row[0]) for row in rows or [] if row[0] is not None}


def _is_lake(loader: Loader) -> TypeGuard[LakeLoader]:
    """A lake's loader can only exist once its module (and dlt) is imported: a SQL target's run imports neither."""
    lake = sys.modules.get("ingestion_assets.loading.lake")
    return lake is not None and isinstance(loader, lake.LakeLoader)


def _retire(loader: Loader, files: list[str], soft: bool, window: RowWindow | None = None) -> int:
    if _is_lake(loader):
        return _retire_in_lake(loader, files, soft, window)
    retired = 0
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        if not table_exists(client, table):
            return 0
        column = client.escape_column_name(loader.names.column(FILE))
        inside = "" if window is None else " AND " + window_sql(client, loader.names.column(window.column), window)
        for start in range(0, len(files), _CHUNK):
            names = ", ".join("'" + f.replace("'", "''") + "'" for f in files[start : start + _CHUNK])
            where = f"{column} IN ({names}) AND {DELETED_AT} IS NULL{inside}"
            counted = client.execute_sql(f"SELECT count(*) FROM {table} WHERE {where}")
            retired += int(counted[0][0]) if counted else 0
            if soft:
                client.execute_sql(f"UPDATE {table} SET {DELETED_AT} = CURRENT_TIMESTAMP WHERE {where}")
            else:
                client.execute_sql(f"DELETE FROM {table} WHERE {where}")
    return retired


def _move(loader: Loader, moved: dict[str, str]) -> int:
    """The live rows of each gone file become the rows of the listed file of its content (a keyed stream: one row
    per key, so no key is doubled); returns how many rows moved. Counted by file: a lake's SQL view compares no
    text pushed down to a Delta table (string against string_view)."""
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        column = client.escape_column_name(loader.names.column(FILE))
        counts = client.execute_sql(f"SELECT {column}, count(*) FROM {table} WHERE {DELETED_AT} IS NULL GROUP BY 1")
        if not _is_lake(loader):
            for gone, to in sorted(moved.items()):
                where = f"{column} = {_literal(gone)} AND {DELETED_AT} IS NULL"
                client.execute_sql(f"UPDATE {table} SET {column} = {_literal(to)} WHERE {where}")
    if _is_lake(loader):  # a lake's rows change through its table format, outside the SQL view
        loader.move_rows(loader.names.column(FILE), moved)
    return sum(int(n) for file, n in counts or [] if file in moved)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _retire_in_lake(loader: LakeLoader, files: list[str], soft: bool, window: RowWindow | None = None) -> int:
    """A lake's table changes through its table format: the gone files' rows are matched on `_ingest_file` as
    reconciliation matches keys (one Delta MERGE, one Iceberg snapshot), deleted or flagged if not yet. With a
    window, its rows are found in the SQL view and matched on their file and row (one target row each)."""
    file = loader.names.column(FILE)
    if window is None:
        with loader.client():
            return loader.retire_keys(pa.table({file: pa.array(files, pa.string())}), soft)
    row = loader.names.column(ROW)
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        names = ", ".join(_literal(f) for f in files)
        inside = window_sql(client, loader.names.column(window.column), window)
        compared = f"CAST({client.escape_column_name(file)} AS VARCHAR)"
        where = f"{compared} IN ({names}) AND {DELETED_AT} IS NULL AND {inside}"
        try:
            found = client.execute_sql(
                f"SELECT {compared}, {client.escape_column_name(row)} FROM {table} WHERE {where}"
            )
        except undefined_relation():
            return 0
        if not found:
            return 0
        keys = pa.table(
            {
                file: pa.array([str(r[0]) for r in found], pa.string()),
                row: pa.array([int(r[1]) for r in found], pa.int64()),
            }
        )
        return loader.retire_keys(keys, soft)
