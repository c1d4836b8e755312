"""The seeded simulation for a files stream: the real listing, readers (CSV, JSON lines, Parquet, gzip), runner,
schema step, dead letters, deletes and dlt loads into DuckDB, on a folder of drops that a seeded source changes
between rounds and between the pieces a read gives: new files, late files with an older modified time (inside
the lookback), files rewritten in place (same or another size, the modified time kept, moved back or on),
files deleted and put back, files with bad lines, broken files, a column added from some round on. The process
dies at every fault point, inside a file between its pieces, and around checkpoint writes (lost, or landing
just before the death); slices are a few files or rows, so a run spans many checkpoints.

At every stored checkpoint, each file (or part of one) the position says is read must be in the target: each of
its rows at its version or a newer one (or, if the file changed since, as a later version of it says), each bad
line parked by its file and line. At the end the target equals the model of the files: keyed, the newest version
of each key (modified time, path, row) with `_ingest_position` saying so; keyless, each file's rows once; deleted
files' rows kept, deleted or flagged as the stream's `deletes` says; and the dead letters exactly the bad lines.

Modified times are set with os.utime, every draw comes from seeded generators (one per run attempt for what
happens inside it), so a seed replays the same events on any machine. What the README lists as not seen (keys a
rewrite removed, a rewrite keeping size and time, files older than the lookback) is not drawn."""

from __future__ import annotations

import collections
import contextlib
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

import ingestion_assets.sources.files.csv as csv_reader
import ingestion_assets.streams.files as files_stream
from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams
from ingestion_assets.settings import Settings
from ingestion_assets.streams.runner import PartitionJob
from ingestion_assets_tests.simulation.files_checks import FilesInvariants
from ingestion_assets_tests.simulation.files_model import (
    CSV_WRONG_COUNT,
    FORMATS,
    JSONL_BAD,
    Content,
    Drop,
    Record,
    broken,
    fingerprint,
    put,
    render,
    suffix,
    version,
)
from ingestion_assets_tests.simulation.harness import (
    DEFAULT_ROUNDS,
    EPOCH,
    Crash,
    SimFaults,
    SimStore,
    SimulationFailure,
    replay_command,
    unsafe_order,
)

ATTEMPTS = 100
START = int(EPOCH.timestamp())


class FilesSimulation(FilesInvariants):
    def __init__(self, seed: int, home: Path, unsafe: bool = False) -> None:
        self.seed, self.home, self.unsafe = seed, home, unsafe
        self.rng = random.Random(seed)
        self.keyed = self.rng.random() < 0.65
        self.deletes = self.rng.choice(["keep", "hard", "soft"])
        self.mode = f"files, {'keyed' if self.keyed else 'keyless'}, deletes {self.deletes}"
        self.name = f"simfiles_{seed}_{uuid.uuid4().hex[:6]}"
        self.folder = home / self.name / "drops"
        self.staging = home / self.name / "staging"
        self.warehouse = home / f"{self.name}_warehouse.duckdb"  # not the source's name: see the catalog check
        self.lookback = self.rng.randint(3000, 6000)
        self.csv_block = self.rng.choice([256, 512, 1024, 4 << 20])  # small blocks: CSV files read in pieces
        self.drift_round = self.rng.randint(1, DEFAULT_ROUNDS - 1)  # from then on files carry a new column
        self.extra = False
        self.clock = START + 10 * self.lookback  # the newest modified time so far
        self.drops: dict[str, Drop] = {}
        self.next_id = self.next_file = 1
        self.tick = self.settled = 0  # changes so far; changes before the last completed run's start
        self.runs = 0
        self.source_rng = self.rng
        self.events: list[str] = []
        self.rounds = DEFAULT_ROUNDS
        self.store = SimStore(self.rng, 0.05, self._check_checkpoint)

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.rounds, self.unsafe, kind="files")

    def run(self, rounds: int = DEFAULT_ROUNDS) -> list[str]:
        self.rounds = rounds
        self.folder.mkdir(parents=True)
        self.staging.mkdir()
        try:
            for _ in range(self.rng.randint(2, 5)):
                self._new_file(self.rng, late=False)
            self._write_catalog()
            for round_ in range(rounds):
                if round_ == self.drift_round:
                    self.extra = True
                    self.events.append("schema: files carry `extra` from now on")
                if round_:
                    self._round_of_changes(self.rng)
                self._sync_until_done(self.rng.choice([0.0, 0.02, 0.05, 0.1]), changing=True)
            self._sync_until_done(0.0, changing=False)  # the folder at rest: the target must equal it
            self._check_final()
        finally:
            shutil.rmtree(self.home / self.name, ignore_errors=True)
        return self.events

    # --- the folder ------------------------------------------------------------------------------
    def _write_catalog(self) -> None:
        stream: dict[str, Any] = {
            "path": "*",
            "files_per_slice": self.rng.randint(1, 4),
            "slice_rows": self.rng.randint(5, 40),
            "batch_rows": self.rng.randint(2, 8),
            "lookback_seconds": self.lookback,
            "deletes": self.deletes,
            "csv": {"column_types": {"value": "int64"}},  # a value that is not a number is a bad row, parked
            "dead_letters": {"max_share": 1.0},
        }
        if self.keyed:
            stream["primary_key"] = "id"
        source = {"type": "files", "url": str(self.folder), "streams": {"items": stream}}
        catalog = {"destination": {"type": "duckdb", "path": str(self.warehouse)}, "sources": {self.name: source}}
        (self.home / f"{self.name}.yaml").write_text(yaml.safe_dump(catalog))

    def _round_of_changes(self, rng: random.Random) -> None:
        for _ in range(rng.randint(1, 3)):
            self._new_file(rng, late=False)
        if rng.random() < 0.5:
            self._new_file(rng, late=True)
        for _ in range(rng.randint(0, 2)):
            self._rewrite(rng)
        if rng.random() < 0.5:
            self._delete(rng)
        if rng.random() < 0.3:
            self._put_back(rng)
        if rng.random() < 0.4:
            self._bad_file(rng)
        if rng.random() < 0.2:
            self._broken_file(rng)

    def _one_change(self, rng: random.Random) -> None:
        """While a run reads: one change of any kind but a bad or broken file."""
        roll = rng.random()
        if roll < 0.3:
            self._new_file(rng, late=False)
        elif roll < 0.45:
            self._new_file(rng, late=True)
        elif roll < 0.75:
            self._rewrite(rng)
        elif roll < 0.9:
            self._delete(rng)
        else:
            self._put_back(rng)

    def _name(self, rng: random.Random, kind: str) -> str:
        self.next_file += 1
        return f"{rng.choice('afz')}{self.next_file:04d}{suffix(kind)}"

    def _moment(self, rng: random.Random, late: bool) -> int:
        if late:  # older than files already read, inside the lookback (half of it: runs move the newest on)
            return self.clock - rng.randint(1, self.lookback // 2)
        self.clock += rng.choice([0, 0, 10, 60, 300])  # 0: a tie on the modified time, broken by the path
        return self.clock

    def _records(self, rng: random.Random, count: int) -> list[Record]:
        """New rows; keyed, some update keys the folder holds (so versions compete), a few twice in one file."""
        known = sorted(self._live_keys()) if self.keyed else []
        records: list[Record] = []
        for _ in range(count):
            if known and rng.random() < 0.4:
                key = rng.choice(known)
            elif records and rng.random() < 0.05:
                key = rng.choice(records).id
            else:
                key, self.next_id = self.next_id, self.next_id + 1
            name = f"n{rng.randint(0, 999)}" + rng.choice(["", " x"])
            extra = f"e{rng.randint(0, 99)}" if self.extra else None
            records.append(Record(key, name, rng.randint(-(10**6), 10**6), extra))
        return records

    def _live_keys(self) -> set[int]:
        return {r.id for d in self.drops.values() if d.present for _row, r in d.content.rows}

    def _new_file(self, rng: random.Random, late: bool) -> None:
        kind = rng.choice(FORMATS)
        content = render(kind, list(self._records(rng, rng.randint(1, 12))), self.extra, rng)
        self._add(self._name(rng, kind), content, self._moment(rng, late), "late file" if late else "new file")

    def _bad_file(self, rng: random.Random) -> None:
        """Bad lines among good ones: parked by file and line (or row), the rest loads; never changed after."""
        kind = rng.choice(["csv", "csv.gz", "jsonl", "jsonl.gz"])
        items: list[Record | str | bytes] = list(self._records(rng, rng.randint(1, 10)))
        for _ in range(rng.randint(1, 3)):
            bad: str | bytes = (
                rng.choice([*CSV_WRONG_COUNT, "badvalue", "badutf8"])
                if kind.startswith("csv")
                else rng.choice(JSONL_BAD)
            )
            items.insert(rng.randint(0, len(items)), bad)
        self._add(self._name(rng, kind), render(kind, items, self.extra, rng), self._moment(rng, False), "bad lines")

    def _broken_file(self, rng: random.Random) -> None:
        kind = rng.choice(["csv.gz", "jsonl.gz", "parquet", "parquet-gzip"])
        records = [Record(800_000 + self.next_file * 100 + n, "b", n) for n in range(rng.randint(5, 30))]
        content = broken(kind, list(records), self.extra, rng)
        self._add(self._name(rng, kind), content, self._moment(rng, False), "broken file")

    def _add(self, path: str, content: Content, mtime: int, what: str) -> None:
        drop = Drop(path, frozen=bool(content.bad))
        self.drops[path] = drop
        self._write(drop, content, mtime)
        self.events.append(f"{what}: {path} ({len(content.rows)} rows, {len(content.bad)} bad)")

    def _write(self, drop: Drop, content: Content, mtime: int) -> None:
        while fingerprint(mtime, len(content.data)) in drop.fingerprints():
            mtime += 1  # a rewrite keeping size and time is not seen (README): not drawn
        content.mtime = mtime
        self.clock = max(self.clock, mtime)
        size = put(self.folder, self.staging, drop.path, content.data, mtime)
        drop.versions.append((fingerprint(mtime, size), content))
        drop.present = True
        self.tick += 1
        drop.changed = self.tick

    def _in_window(self, drop: Drop) -> bool:
        return drop.mtime >= self.clock - self.lookback // 2

    def _rewrite(self, rng: random.Random) -> None:
        """The same keys (keyed) or at least the same rows (keyless), new values, some reordered or added."""
        candidates = [d for d in self.drops.values() if d.present and not d.frozen and self._in_window(d)]
        if not candidates:
            return
        drop = rng.choice(sorted(candidates, key=lambda d: d.path))
        old = [r for _row, r in drop.content.rows]
        extra = f"e{rng.randint(0, 99)}" if self.extra else None
        new = [
            Record(r.id, r.name if rng.random() < 0.5 else f"r{rng.randint(0, 999)}", rng.randint(0, 99), extra)
            for r in old
        ]
        if self.keyed and rng.random() < 0.3:
            rng.shuffle(new)  # the rows move: a key's row number (part of its version) may go down
        new += self._records(rng, rng.randint(0, 3)) if not self.keyed else self._fresh(rng, rng.randint(0, 3))
        content = render(drop.content.kind, list(new), self.extra, rng)
        how = rng.choice(["kept", "back", "on"])
        mtime = drop.mtime
        if how == "back":
            mtime = max(self.clock - self.lookback // 2, drop.mtime - rng.randint(1, 600))
        elif how == "on":
            mtime = self._moment(rng, late=False)
        if self.keyed and mtime < drop.mtime and self._loses_to_another(drop, content, mtime):
            how, mtime = "kept", drop.mtime  # the README's limit: another file's older row is not read again
        self._write(drop, content, mtime)
        self.events.append(f"rewrite: {drop.path} ({len(content.rows)} rows, modified time {how})")

    def _fresh(self, rng: random.Random, count: int) -> list[Record]:
        extra = f"e{rng.randint(0, 99)}" if self.extra else None
        records = []
        for _ in range(count):
            records.append(Record(self.next_id, f"n{rng.randint(0, 999)}", rng.randint(0, 99), extra))
            self.next_id += 1
        return records

    def _loses_to_another(self, drop: Drop, content: Content, mtime: int) -> bool:
        """Whether moving the file's time back would put one of its keys below a row of another file that its
        older version beat: the target then holds this file's new row, older than that row, which is not read
        again (the README's limit). Such a rewrite keeps its time instead."""
        old = {r.id: version(drop.mtime, drop.path, n) for n, r in drop.content.rows}
        new = {r.id: version(mtime, drop.path, n) for n, r in content.rows}
        others = [d for d in self._contributing() if d is not drop]
        return any(
            new[record.id] < version(other.mtime, other.path, n) < old[record.id]
            for other in others
            for n, record in other.content.rows
            if record.id in old and record.id in new
        )

    def _deletable(self, drop: Drop) -> bool:
        if not drop.present or drop.frozen or drop.changed > self.settled:
            return False  # only files whose current version a completed run read (kept rows are then known)
        if self.deletes == "keep" or not self.keyed:
            return True
        others = {r.id for d in self.drops.values() if d.present and d is not drop for _row, r in d.content.rows}
        return not any(r.id in others for _row, r in drop.content.rows)  # its keys are its own

    def _delete(self, rng: random.Random) -> None:
        candidates = sorted((d for d in self.drops.values() if self._deletable(d)), key=lambda d: d.path)
        if not candidates:
            return
        drop = rng.choice(candidates)
        (self.folder / drop.path).unlink()
        drop.present = False
        self.tick += 1
        drop.changed = self.tick
        self.events.append(f"delete: {drop.path}")

    def _put_back(self, rng: random.Random) -> None:
        """A deleted file copied back as it was (same bytes, same modified time): read again."""
        gone = sorted((d for d in self.drops.values() if not d.present and self._in_window(d)), key=lambda d: d.path)
        if not gone:
            return
        drop = rng.choice(gone)
        put(self.folder, self.staging, drop.path, drop.content.data, drop.mtime)
        drop.present = True
        self.tick += 1
        drop.changed = self.tick
        self.events.append(f"put back: {drop.path}")

    # --- syncing ---------------------------------------------------------------------------------
    def _sync_until_done(self, fault_rate: float, changing: bool) -> None:
        """Runs until one completes; each attempt draws from generators of its own (seed, attempt, purpose)."""
        for attempt in range(ATTEMPTS):
            self.runs += 1
            own = lambda purpose: random.Random(f"{self.seed}:{self.runs}:{purpose}")  # noqa: E731
            self.store.rng, self.source_rng = own("checkpoints"), own("source")
            faults = SimFaults(own("faults"), fault_rate)
            began = self.tick
            try:
                # the folder changes under the first attempts only: a round's work must end
                with self._reads(changing and attempt < 3, faults), unsafe_order(self.unsafe):
                    self._job(faults).run()
                self.settled = began
                return
            except Crash as crash:
                self.events.append(f"crash: {crash}")
            finally:
                self.source_rng = self.rng
        points = collections.Counter(
            e.removeprefix("crash: ") for e in self.events[-ATTEMPTS:] if e.startswith("crash")
        )
        raise SimulationFailure(
            f"seed {self.seed}: no run completed in {ATTEMPTS} attempts; where they crashed: "
            f"{dict(points.most_common(8))}; replay with `{self.replay}`"
        )

    def _job(self, faults: SimFaults) -> PartitionJob:
        settings = Settings(home=self.home, catalog_path=self.home / f"{self.name}.yaml")
        (stream,) = catalog_streams(settings, load_catalog(settings.catalog_path))
        return PartitionJob(stream, self.store, faults=faults, read_ahead=0)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _reads(self, changing: bool, faults: SimFaults) -> Iterator[None]:
        """Between the pieces of a file: the process may die (mid-file), the folder may change."""
        real, block = files_stream.read_file, csv_reader.BLOCK_BYTES
        simulation = self

        def read_file(fs: Any, info: Any, spec: Any, resume: Any, *rest: Any) -> Iterator[Any]:
            for piece in real(fs, info, spec, resume, *rest):
                yield piece
                if faults.rng.random() < faults.rate:
                    where = f"mid_file:{info.path.rsplit('/', 1)[-1]}@{piece.rows_done}"
                    faults.crashes.append(where)
                    raise Crash(where)
                if changing and simulation.source_rng.random() < 0.1:
                    simulation._one_change(simulation.source_rng)

        files_stream.read_file = read_file  # type: ignore[assignment]
        csv_reader.BLOCK_BYTES = self.csv_block
        try:
            yield
        finally:
            files_stream.read_file, csv_reader.BLOCK_BYTES = real, block
