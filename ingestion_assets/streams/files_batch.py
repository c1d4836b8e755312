"""A batch of files on its way to the target: each file's rows labelled with the file and a version (newer files
win, then later paths, then later rows), the bad rows and broken files as dead letters, loaded in one load."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.dead_letters import DEAD_LETTER_SCHEMA
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.parked import release_file_keys
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.files import FILE, ROW, BadRow, FileInfo, Resume, without_texts
from ingestion_assets.streams.files_schema import FilesSchemaStep
from ingestion_assets.streams.files_stale import Span

VERSION = "_ingest_file_version"
# a keyed stream's parked row changes nothing in the target: a key it held keeps the version loaded before (from
# the file's earlier content or another file), which the source no longer holds as valid; its dead letter says so
_KEEPS_ROW = "; the target keeps the previous version of this row's key, if it held one, until the row loads"
_KEEPS_FILE = "; the target keeps the previous version of each key of this file's rows until the file loads"


def load_files(
    loader: Loader,
    schema: FilesSchemaStep,
    tables: list[tuple[pa.Table, str]],
    dead: list[dict[str, Any]],
    generation: int,
    where: tuple[str, str, str],
    whole: dict[str, set[str]] | None = None,
) -> int:
    """Each file's table through the schema step, then all in the types as they are now (a later file may have
    widened a column), loaded with the dead letters in one load; returns the rows loaded. `whole`: the files
    this slice read in full, each with the keys it parked: their older dead letters (a fixed file read again)
    are released right after the load, before the slice's checkpoint (a kill between re-reads the file)."""
    now = dt.datetime.now(dt.UTC)
    settled = [schema.settle(t, loader, f) for t, f in tables]
    labelled = [with_metadata(without_texts(schema.cast(t)), [VERSION], now, generation) for t in settled]
    rows = pa.concat_tables(labelled, promote_options="default").drop_columns([VERSION]) if labelled else None
    if rows is not None:
        loader.target = replace(loader.target, type_hints=_naive_hints(rows, loader.target.type_hints))
    loaded = loader.load(rows, dead_letters=dead_letter_table(dead, where, now))
    if whole:
        release_file_keys(loader, whole)
    return loaded


def _naive_hints(
    rows: pa.Table, hints: tuple[tuple[str, dict[str, Any]], ...]
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """A timestamp written without a zone stays one (`timestamp without time zone`, as `ingest schema show` says):
    dlt makes every timestamp column zoned unless told (DuckDB and PostgreSQL took `2026-01-01 10:00:00` as UTC)."""
    naive = {
        f.name: {"data_type": "timestamp", "timezone": False, "precision": 6}
        for f in rows.schema
        if pa.types.is_timestamp(f.type) and f.type.tz is None and not f.name.startswith("_ingest_")
    }
    return tuple((name, hint) for name, hint in hints if name not in naive) + tuple(naive.items())


def dead_letter_table(dead: list[dict[str, Any]], where: tuple[str, str, str], now: dt.datetime) -> pa.Table | None:
    """The dead letters as the loader takes them; `where`: (stream, partition, run id)."""
    if not dead:
        return None
    stream, partition, run_id = where
    records = [
        {
            "stream": stream,
            "partition": partition,
            "record_key": d["key"],
            "run_id": run_id,
            "position": json.dumps(d["position"]),
            "error": d["error"],
            "raw_record": json.dumps(d["raw"]),
            "dead_lettered_at": now,
        }
        for d in dead
    ]
    return pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)


@dataclass
class FileBatch:
    """What a slice (or a replay) gathers: each file's tables apart, and its dead letters."""

    tables: list[tuple[pa.Table, str]] = field(default_factory=list)
    dead: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    files: int = 0
    whole: dict[str, set[str]] = field(default_factory=dict)  # files read from their start to their end here
    _fresh: dict[str, set[str]] = field(default_factory=dict)  # files being read from their start: keys parked
    spans: dict[str, Span] = field(default_factory=dict)  # each file's numbers this batch covered (files_stale)
    keyed: bool = False  # the stream has a primary key: a parked row leaves the key's previous version in place

    def begin(self, relative: str, resume: Resume) -> None:
        """The file's read (or its rest, in a batch after a slice cut inside it) starts after `resume`."""
        if resume.rows == 0 and resume.bad == 0:
            self._fresh[relative] = set()
        self.spans[relative] = Span.starting(resume.rows)

    def reach(self, relative: str, rows_done: int) -> None:
        """The file's read got to its number `rows_done` (the bad rows up to it included)."""
        self.spans.setdefault(relative, Span.starting(0)).reach(rows_done)

    def finish(self, relative: str) -> None:
        self.files += 1
        self.spans.setdefault(relative, Span.starting(0)).upto = None  # read to its end: nothing after it stays
        if relative in self._fresh:
            self.whole[relative] = self._fresh.pop(relative)

    def _parked(self, relative: str, key: str) -> None:
        if relative in self._fresh:
            self._fresh[relative].add(key)

    def add(
        self,
        table: pa.Table | None,
        relative: str,
        info: FileInfo,
        bad: list[BadRow],
        version: tuple[dt.datetime, str] | None = None,
    ) -> None:
        """`version`: the (modified time, path) the rows' versions carry; default the file's own (a copy's differ)."""
        for row in bad:
            where, key = _where(relative, row)
            line = row.line if row.line is not None else row.file_line
            if line is not None and row.line is None:
                where = f"{where} (line {line})"
            self._parked(relative, key)
            self.dead.append(
                {
                    "key": key,
                    "position": {"file": relative, "row": row.row, "line": line, **_when(info)},
                    "error": f"file {relative} {where}: {_kept(row.error, _KEEPS_ROW, self.keyed)}",
                    "raw": {"file": relative, "row": row.row, "line": line, "text": row.raw},
                }
            )
        self.spans.setdefault(relative, Span.starting(0)).give(table)
        if table is not None and table.num_rows:
            self.tables.append(
                (_labelled(table, relative, version or (info.modified_at, relative)), f"file {relative}")
            )
            self.rows += table.num_rows

    def park(self, relative: str, info: FileInfo, reason: str) -> None:
        self._parked(relative, f"{relative}:file")
        self.dead.append(
            {
                "key": f"{relative}:file",
                "position": {"file": relative, **_when(info)},
                "error": f"file {relative} parked as a whole: {_kept(reason, _KEEPS_FILE, self.keyed)}",
                "raw": {"file": relative, "size": info.size, "etag": info.etag, **_when(info)},
            }
        )


def _kept(error: str, keeps: str, keyed: bool) -> str:
    return error.rstrip(". ") + keeps if keyed else error


def _where(relative: str, row: BadRow) -> tuple[str, str]:
    """Where the bad row is, for its message, and its dead letter's key: by line or row number, else by its number
    among the file's rows of the wrong width, never by its text (two fragments of one text were one dead letter,
    and a fragment of another file's name could collide)."""
    if row.line is not None:
        where = f"line {row.line}"
    elif row.row:
        where = f"row {row.row}"
    elif row.ordinal is not None:
        return f"bad row {row.ordinal} (line unknown)", f"{relative}:bad{row.ordinal}"
    else:
        return "line unknown", f"{relative}:{row.raw}"
    return where, f"{relative}:{where.replace(' ', '')}"


def _labelled(table: pa.Table, relative: str, version: tuple[dt.datetime, str]) -> pa.Table:
    """The file's name, and each row's version: newer files win, then later paths, then later rows."""
    rows = table.num_rows
    moment, path = version
    prefix = f"{moment.strftime('%Y-%m-%dT%H:%M:%S.%f')}|{path}|"
    numbers = pc.utf8_lpad(pc.cast(table.column(ROW), pa.string()), width=12, padding="0")
    version = pc.binary_join_element_wise(pa.repeat(pa.scalar(prefix), rows), numbers, "")
    return table.append_column(FILE, pa.repeat(pa.scalar(relative), rows)).append_column(VERSION, version)


def _when(info: FileInfo) -> dict[str, Any]:
    return {"modified_at": info.modified_at.isoformat()}
