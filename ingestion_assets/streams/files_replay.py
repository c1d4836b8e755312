"""`ingest dlq replay` for a file stream: after the user fixed a file (or the catalog: column types, the schema
policy), read each file that has parked rows again, in full, and load what now fits.

A parked row is named by its file and line (or row), which a fix may shift (a bad line deleted renumbers the
rest), so a file is replayed whole: the merge on the key (or on file and row) makes its good rows harmless
again (without a key, the rows under numbers the new read did not give go, files_stale.py). Its old dead letters
leave only after the new read loaded; rows still bad are parked again with today's error. A file no longer at the
source keeps its dead letters for a person to decide."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from ingestion_assets.loading.destinations import target_names
from ingestion_assets.loading.parked import parked_rows, release_parked
from ingestion_assets.sources.files import FILE, CorruptFile, FileInfo, Resume, read_file
from ingestion_assets.streams.files import FileSourceStream, relative_path
from ingestion_assets.streams.files_batch import FileBatch, load_files
from ingestion_assets.streams.files_names import FileColumnNames
from ingestion_assets.streams.files_partitions import PartitionScope
from ingestion_assets.streams.files_schema import files_schema_step
from ingestion_assets.streams.postgres_table import Target
from ingestion_assets.streams.replay import Replay


def replay_file_dead_letters(
    stream: FileSourceStream, generation: int, details: dict[str, Any], run_id: str = "replay"
) -> Replay:
    """`details`: the stream's last checkpoint details (its stored schema, so replayed rows meet the same policy)."""
    loader = stream.loader(Target(stream.name, generation), None)
    schema = files_schema_step(stream, details)
    parked = parked_rows(loader)
    if not parked:
        return Replay(0, 0, 0, 0, [])  # nothing to read: the source is not even listed
    by_file: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in parked:
        by_file[(_file_of(row["raw_record"], loader.names.column(FILE)), row["partition"] or "")].append(
            row["record_key"]
        )
    fs, root, files = stream.listing()
    listed = {relative_path(f.path, root): f for f in files}
    loaded = still_bad = released_count = 0
    gone: list[str] = []
    for (file, partition), keys in sorted(by_file.items()):
        info = listed.get(file)
        if info is None:
            gone += keys
            continue
        batch = _read_again(stream, fs, info, file, partition)
        loaded += load_files(loader, schema, batch.tables, batch.dead, generation, (stream.name, partition, run_id))
        stream.retire_stale(loader, batch.spans, PartitionScope.of(stream.spec, partition or None))
        still_bad += len(batch.dead)
        released = sorted(set(keys) - {d["key"] for d in batch.dead})
        if released:
            release_parked(loader, released)
            released_count += len(released)
    return Replay(len(parked), released_count, loaded, still_bad, sorted(gone))


def _file_of(raw_record: Any, column: str) -> str:
    """The file a dead letter came from: the reader names it `file`; a row the target could not hold (parked by
    the loader) carries it in its `_ingest_file` column. Anything else is no file at the source ("gone")."""
    raw = json.loads(raw_record) if isinstance(raw_record, str) else raw_record
    return str(raw.get("file") or raw.get(column) or "") if isinstance(raw, dict) else ""


def _read_again(stream: FileSourceStream, fs: Any, info: FileInfo, file: str, partition: str) -> FileBatch:
    """The file read whole: its good rows, its bad ones, and the numbers it covered (a keyless file fixed by
    deleting a bad line renumbers the rows after it: their old numbers' rows go, as after a normal run's read)."""
    batch = FileBatch(keyed=bool(stream.spec.primary_key))
    window = PartitionScope.of(stream.spec, partition or None).rows()
    batch.begin(file, Resume())
    try:
        folded = FileColumnNames(target_names(stream.destination), ()).folded
        for piece in read_file(fs, info, stream.spec, Resume(), window, folded, stream.nul_refused_by):
            batch.add(piece.table, file, info, piece.bad)
    except CorruptFile as exc:
        batch.park(file, info, str(exc))
    batch.finish(file)
    return batch
