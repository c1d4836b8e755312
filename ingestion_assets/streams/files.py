"""A file stream: the files of a glob read incrementally by file, in bounded Arrow batches, loaded and
checkpointed in slices of whole files (or of a part of one big file), bad rows and broken files parked."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.catalog import Destination, FilesSource, FilesStream
from ingestion_assets.loading.dead_letters import dead_letter_limit
from ingestion_assets.loading.destinations import target_names
from ingestion_assets.loading.parked import release_file_keys
from ingestion_assets.loading.pipeline import Loader, TargetTable, pipeline_name
from ingestion_assets.loading.targets import make_loader
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.files import (
    FILE,
    ROW,
    CorruptFile,
    FileInfo,
    MissingLocation,
    Piece,
    Resume,
    at_most,
    filesystem,
    list_files,
    read_file,
)
from ingestion_assets.sources.slices import Slice
from ingestion_assets.streams.files_batch import FileBatch, load_files
from ingestion_assets.streams.files_deletes import retire_deleted_files, target_files
from ingestion_assets.streams.files_names import FileColumnNames
from ingestion_assets.streams.files_partitions import PartitionScope
from ingestion_assets.streams.files_progress import Progress
from ingestion_assets.streams.files_schema import FilesSchemaStep, files_schema_step
from ingestion_assets.streams.files_stale import Span, retire_stale_rows
from ingestion_assets.streams.files_ties import SameMomentKeys
from ingestion_assets.streams.postgres_table import RunOptions, Target
from ingestion_assets.sync import CheckpointSink, Faults, SliceOutcome, SyncResult, run_slices

# files a run says it found: older than the window and known to neither the checkpoint nor the target (a rename or a
# copy keeping the modified time, or a checkpoint from before this bookkeeping); stamped ahead of the run's clock
# (read like any other, but their rows' versions win over later files' until the clock catches up)
_UNKNOWN_OLD = (
    "older than the lookback window that no checkpoint or target row knew were read "
    "(renamed or copied keeping their modified time?)"
)
_FUTURE = "modified in the future (a writer's clock ahead of this one?)"
_SAME_MOMENT = (
    "of the same modified time share keys: which holds the newer value is unknown (the store's times may be whole "
    "seconds), the later path's row was kept"
)


@dataclass(frozen=True)
class FileSlice(Slice):
    """A slice of files: each file's batches apart (files may differ in columns until the schema step)."""

    dead: list[dict[str, Any]] = field(default_factory=list)
    row_count: int = 0
    whole: dict[str, set[str]] = field(default_factory=dict)  # files read in full here: the keys they parked
    spans: dict[str, Span] = field(default_factory=dict)  # each file's numbers covered here (files_stale)

    @property
    def rows(self) -> int:
        return self.row_count


@dataclass(frozen=True)
class FileSourceStream:
    settings: Settings
    destination: Destination
    source_name: str
    source: FilesSource
    name: str
    spec: FilesStream

    @property
    def qualified_name(self) -> str:
        return f"{self.source_name}.{self.name}"

    @property
    def primary_key(self) -> tuple[str, ...]:
        """Without a key in the catalog a row is keyed by its file and row number."""
        return tuple(self.spec.primary_key) or (FILE, ROW)

    @property
    def nul_refused_by(self) -> str | None:
        """The target, if its text cannot hold the NUL character (PostgreSQL): rows holding one are parked."""
        return "PostgreSQL" if self.destination.type == "postgres" else None

    def resume_position(self, position: dict[str, Any] | None, complete: bool) -> dict[str, Any] | None:
        return position  # always incremental: the position says which files were read

    def loader(self, target: Target, partition: str | None, plan: Any = None) -> Loader:
        return make_loader(
            settings=self.settings,
            destination=self.destination,
            target=TargetTable(
                dataset=self.source_name,
                table=target.table,
                primary_key=self.primary_key,
                write_disposition="merge" if target.stream_table else self.spec.write_disposition,
            ),
            pipeline_name=pipeline_name(self.source_name, target.table, partition),
            # a late file's older rows must not overwrite newer versions of their keys from newer files
            guard_versions=bool(self.spec.primary_key),
            # ... but a file read again (rewritten with an older time, its rows reordered) replaces its own rows
            version_source=FILE if self.spec.primary_key else None,
            stream_table=target.stream_table,
        )

    def retire_stale(self, loader: Loader, spans: dict[str, Span], scope: PartitionScope) -> None:
        """Keyless: the rows of a file read again under numbers this read did not give go (files_stale.py). A
        partition by a column reads only its window's rows of each file: only the rows of its window can be its
        stale ones. Appending keeps every version by design: nothing goes."""
        merged = loader.target.write_disposition == "merge"
        if not self.spec.primary_key and merged and spans:
            retire_stale_rows(loader, spans, soft=self.spec.deletes == "soft", window=scope.rows())

    def filesystem(self) -> tuple[Any, str]:
        options = {
            key: resolve(value, self.settings, f"sources.{self.source_name}.storage_options.{key}")
            if not isinstance(value, str | int | bool)
            else value
            for key, value in self.source.storage_options.items()
        }
        return filesystem(self.source.url, options)

    def files(self) -> list[FileInfo]:
        """The stream's files as they are now (`ingest check` lists them)."""
        return self.listing()[2]

    def listing(self) -> tuple[Any, str, list[FileInfo]]:
        """The filesystem, its root and the stream's files as they are now: the one way every part lists them. A
        url whose folder or bucket does not exist fails here, naming the stream and the url (never 0 rows)."""
        fs, root = self.filesystem()
        try:
            return fs, root, list_files(fs, root, self.spec.path)
        except MissingLocation as exc:
            raise MissingLocation(f"stream {self.qualified_name}: {exc} (url {self.source.url})") from exc

    def run(self, after: dict[str, Any] | None, sink: CheckpointSink, options: RunOptions) -> SyncResult:
        loader = options.loader or self.loader(options.target, options.partition)
        loader.run_id = options.run_id
        schema = options.schema if isinstance(options.schema, FilesSchemaStep) else files_schema_step(self, {})

        def load(piece: Slice) -> SliceOutcome:
            assert isinstance(piece, FileSlice)
            where = (self.name, options.partition or "", options.run_id)
            loaded = load_files(loader, schema, piece.table, piece.dead, options.target.generation, where, piece.whole)
            self.retire_stale(loader, piece.spans, scope)
            return SliceOutcome(loaded=loaded, dead_letters=len(piece.dead) + loader.take_parked())

        fs, root, files = self.listing()
        name = {f.path: relative_path(f.path, root) for f in files}
        scope = PartitionScope.of(self.spec, options.partition)
        known = self._known_files(loader, set(name.values()), scope)
        progress = Progress.of(after)
        ties = SameMomentKeys(tuple(self.spec.primary_key))
        result = run_slices(
            self._slices(progress, fs, files, name, scope, options, known, ties),
            load,
            sink,
            started_from=after,
            faults=options.faults or Faults.from_env(),
            log=options.log,
            stop=options.stop,
            after_commit=lambda result: dead_letter_limit(self.qualified_name, self.spec.dead_letters, result),
            read_ahead=options.read_ahead,
        )
        self._tell("files_read_unknown_old", progress.unknown, _UNKNOWN_OLD, result, options)
        self._tell("files_modified_in_future", progress.future, _FUTURE, result, options)
        self._tell("files_same_modified_time_keys", ties.found, _SAME_MOMENT, result, options)
        if not result.stopped:
            if moved := progress.moved():  # renamed: its bad rows were parked again under the new name
                release_file_keys(loader, {file: set() for file in moved})
            self._finish(loader, result, options, scope, set(name.values()), known, progress)
        return result

    def _known_files(self, loader: Loader, listed: set[str], scope: PartitionScope) -> Callable[[], set[str]]:
        """The files the target holds live rows of, asked at most once (only when needed): proof that a file older
        than the lookback window was read. A partition by a column shares every file with the others, so for it
        the target proves nothing (its checkpoint keeps every listed file's fingerprint instead). With `deletes`,
        the rows of files gone from the listing (about to be retired) never win over the rows this run reads: a
        file renamed keeping its modified time gives versions equal but for the path, and takes its rows over."""
        held = functools.cache(lambda: target_files(loader))
        if self.spec.deletes != "keep" and listed:
            loader.released_sources = frozenset(f for f in held() if f not in listed and scope.holds(f))
        return held if scope.rows() is None else set

    def _finish(
        self,
        loader: Loader,
        result: SyncResult,
        options: RunOptions,
        scope: PartitionScope,
        listed: set[str],
        known: Callable[[], set[str]],
        progress: Progress,
    ) -> None:
        """Retire the rows of files gone from the source (after every due file was read), then settle the position:
        files no longer listed leave it (also those an earlier run retired, dying before its checkpoint: kept, the
        file put back as it was would be taken as read), and older fingerprints the target now proves too."""
        if self.spec.deletes != "keep":
            listed, live = self._retire_deleted(loader, result, options, scope, progress)
            known = known if scope.rows() is not None else functools.cache(lambda: live)
        if result.position is not None:
            result.position = Progress.of(result.position).settle(listed, known, self.spec.lookback_seconds)

    def _tell(self, figure: str, files: list[str], what: str, result: SyncResult, options: RunOptions) -> None:
        """Say which files a run found odd: the figure `figure` (count) and `<figure>_examples`, and a warning."""
        result.figures[figure] = len(files)
        if files:
            result.figures[f"{figure}_examples"] = ", ".join(files[:5])
        if files and options.log is not None:
            options.log.warning("%s: %d file(s) %s, e.g. %s", self.qualified_name, len(files), what, files[:5])

    def _retire_deleted(
        self, loader: Loader, result: SyncResult, options: RunOptions, scope: PartitionScope, progress: Progress
    ) -> tuple[set[str], set[str]]:
        """After the read: rows of files gone from the source go (or are flagged); a file that comes back
        under the same name is then read again (its fingerprint leaves the position). Returns the files listed
        now and the files the target holds live rows of."""
        _, root, files = self.listing()
        listed = {relative_path(f.path, root) for f in files}
        copies = _copies(progress, files, root) if self.spec.primary_key else {}
        retired = retire_deleted_files(
            loader, listed, scope.holds, self.spec.deletes, self.qualified_name, options.log, copies, scope.rows()
        )
        result.figures["files_deleted"] = len(retired.files)
        result.figures["rows_retired"] = retired.rows
        result.figures["files_deleted_content_still_listed"] = len(retired.moved)
        if retired.refused:
            result.note = retired.refused
        return listed, retired.live

    def _slices(
        self,
        progress: Progress,
        fs: Any,
        listed: list[FileInfo],
        name: dict[str, str],
        scope: PartitionScope,
        options: RunOptions,
        held: Callable[[], set[str]],
        ties: SameMomentKeys,
    ) -> Iterator[FileSlice]:
        """Whole files up to `files_per_slice` (or `slice_rows` rows) per slice; a file longer than a slice
        ends a slice inside it, the checkpoint then saying how many of its rows were given."""
        files, window = scope.select(listed, name), scope.rows()
        lookback = self.spec.lookback_seconds
        batch = FileBatch(keyed=bool(self.spec.primary_key))
        index = 0
        columns = FileColumnNames(target_names(self.destination), ())
        for info in progress.due(files, name, lookback, held):
            relative = name[info.path]
            resume = progress.resume(relative, info)
            batch.begin(relative, resume)
            try:
                for read in read_file(fs, info, self.spec, resume, window, columns.folded, self.nul_refused_by):
                    rest: Piece | None = read
                    while rest is not None:  # a piece longer than the slice's room is cut: slice_rows holds
                        piece, rest = at_most(rest, self.spec.slice_rows - batch.rows)
                        if piece.table is not None:
                            columns.check(piece.table)  # two columns landing as one: parked, never mixed up
                        version = progress.version(relative, info)
                        batch.add(piece.table, relative, info, piece.bad, version)
                        ties.add(piece.table, relative, version[0])
                        progress.inside(relative, info, piece.rows_done, piece.bad_done)
                        batch.reach(relative, piece.rows_done)
                        if batch.rows >= self.spec.slice_rows:
                            yield _slice(batch, progress.position(), index)
                            batch, index = FileBatch(keyed=batch.keyed), index + 1
                            batch.begin(relative, Resume(piece.rows_done, piece.bad_done))
            except CorruptFile as exc:
                batch.park(relative, info, str(exc))
                if options.log is not None:
                    options.log.warning("%s: file %s parked: %s", self.qualified_name, relative, exc)
            except FileNotFoundError:
                if options.log is not None:
                    options.log.warning("%s: file %s vanished before it was read", self.qualified_name, relative)
                continue
            progress.done(relative, info)
            batch.finish(relative)
            if batch.files >= self.spec.files_per_slice or batch.rows >= self.spec.slice_rows:
                yield _slice(batch, progress.position(), index)
                batch, index = FileBatch(keyed=batch.keyed), index + 1
        if batch.files or batch.tables or batch.dead:
            yield _slice(batch, progress.position(), index)


def _copies(progress: Progress, files: list[FileInfo], root: str) -> dict[str, str]:
    """Files read before and no longer listed -> a listed file of the same content (size and etag, as the store
    says: a local disk has no etag), the first by path: the keys the gone file holds, that file holds too."""
    listed: dict[tuple[int, str], str] = {}
    for info in sorted(files, key=lambda f: relative_path(f.path, root)):
        if info.etag:
            listed.setdefault((info.size, info.etag), relative_path(info.path, root))
    known = {**progress.gone, **progress.seen}  # fingerprints: gone when the run began, and read in the run
    return {
        path: listed[(int(size), str(etag))]
        for path, (_, size, etag) in known.items()
        if etag and (int(size), str(etag)) in listed
    }


def _slice(batch: FileBatch, position: dict[str, Any], index: int) -> FileSlice:
    return FileSlice(
        batch.tables, position, index, dead=batch.dead, row_count=batch.rows, whole=batch.whole, spans=batch.spans
    )


def relative_path(path: str, root: str) -> str:
    return path[len(root) + 1 :] if root and path.startswith(root + "/") else path
