"""A seeded, single-threaded simulation of the checkpoint protocol around the real runner.

Real: the runner, the PostgreSQL read (COPY into Arrow), the dlt load into DuckDB, the schema step, the
refresh swap. Simulated: the clock the source's rows are stamped with, the network (a read that dies
mid-stream), the fault points (a process death at any protocol step) and the checkpoint store (a write
that is lost, or that lands just before the process dies). A model of the source, kept beside the real
table, is what the target is checked against: at every checkpoint (never ahead of the target) and at
the end (every row at its newest version, no key twice, deletes applied). Half the merge seeds also hard-
delete rows at the source and detect them (reconcile `deletes: hard|soft` every run): the final run's
detection must leave the target's live rows equal to the source.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import yaml

import ingestion_assets.streams.postgres_table as postgres_table
from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams
from ingestion_assets.settings import Settings
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.streams.runner import PartitionJob
from ingestion_assets.sync import UNSAFE_ORDER_ENV

EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
DEFAULT_ROUNDS = 6
# A lost target restarts the read from zero, and a held transaction keeps the checkpoint back: at a high
# crash rate a run then needs many attempts, each of which still makes progress.
ATTEMPTS = 200


class Crash(BaseException):
    """A simulated process death: not an Exception, so nothing on the way up records or handles it."""


class SimulationFailure(AssertionError):
    """An invariant broke; the message carries the seed that replays it."""


@dataclass
class SimFaults:
    """The real fault points (sync.FAULT_POINTS), each a place the process may die."""

    rng: random.Random
    rate: float
    crashes: list[str] = field(default_factory=list)

    def hit(self, point: str, slice_index: int) -> None:
        if self.rng.random() < self.rate:
            self.crashes.append(f"{point}:{slice_index}")
            raise Crash(f"{point}:{slice_index}")


@dataclass
class SimStore:
    """The checkpoint store: every commit is checked against the target, some writes are lost or fatal."""

    rng: random.Random
    rate: float
    check: Any  # called with each stored checkpoint
    history: list[Checkpoint] = field(default_factory=list)

    def latest(self, partition: str | None) -> Checkpoint | None:
        return self.history[-1] if self.history else None

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None:
        if self.rng.random() < self.rate / 2:
            raise Crash("checkpoint write lost")
        stored = Checkpoint(position, "sim", dt.datetime.now(dt.UTC), len(self.history), dict(details))
        self.history.append(stored)
        self.check(stored)
        if self.rng.random() < self.rate / 2:
            raise Crash("died right after the checkpoint write")


@dataclass
class Model:
    """What the source table holds: id -> (updated_at seconds, value)."""

    rows: dict[int, tuple[int, int]] = field(default_factory=dict)
    next_id: int = 1

    def positions(self) -> dict[int, tuple[int, int]]:
        return dict(self.rows)


class Simulation:
    def __init__(
        self, seed: int, source_url: str, home: Path, unsafe: bool = False, detection_off: bool = False
    ) -> None:
        self.seed, self.url, self.home, self.unsafe = seed, source_url, home, unsafe
        self.detection_off = detection_off  # test-only: deletes happen but are only reported, to prove they are seen
        self.rng = random.Random(seed)
        self.clock = 0  # seconds after EPOCH; advancing by 0 makes ties
        self.model = Model()
        self.read_snapshot: dict[int, tuple[int, int]] = {}
        self.schema = f"sim_{seed}_{uuid.uuid4().hex[:6]}"
        self.mode = self.rng.choice(["merge", "merge", "replace"])
        # Drawn apart from `rng`, so seeds without delete detection replay exactly as before it existed.
        detection = random.Random(f"{seed}:deletes")
        self.detect = detection.choice(["hard", "soft"]) if self.mode == "merge" and detection.random() < 0.5 else None
        self.warehouse = home / f"{self.schema}.duckdb"
        self.events: list[str] = []
        self.rounds = DEFAULT_ROUNDS

    def run(self, rounds: int = DEFAULT_ROUNDS) -> list[str]:
        """Mutate, sync with crashes, repeat; then sync cleanly and compare. Returns the event log."""
        self.rounds = rounds
        self._setup()
        try:
            for round_index in range(rounds):
                self._mutate(self.rng.randint(1, 25), deletes=self.deletes)
                if self.rng.random() < 0.15:
                    self._add_column(round_index)
                lost = self.rng.random() < 0.15
                if lost:  # the read starts over from zero: not also at the highest crash rate
                    self._lose_target()
                rate = self.rng.choice([0.0, 0.05, 0.15] if lost else [0.0, 0.05, 0.15, 0.3])
                with self._late_transaction(self.rng.random() < 0.3) as release:
                    self._sync_until_done(fault_rate=rate, between=release)
                if self.rng.random() < 0.3:
                    self._keep_backup()
            self._sync_until_done(fault_rate=0.0, quiet=True)  # the source at rest: the target must equal it
            self._check_final()
        finally:
            self._teardown()
        return self.events

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.rounds, self.unsafe)

    # --- the source ----------------------------------------------------------------------------
    def _setup(self) -> None:
        self._sql(f'CREATE SCHEMA "{self.schema}"')
        self._sql(
            f'CREATE TABLE "{self.schema}".items (id int PRIMARY KEY, value int, updated_at timestamptz NOT NULL)'
        )
        self._mutate(self.rng.randint(20, 120), deletes=False)
        catalog = {
            "destination": {"type": "duckdb", "path": str(self.warehouse)},
            "sources": {
                "sim": {
                    "type": "postgres",
                    "connection": {"file": str(self._url_file())},
                    "streams": {
                        "items": {
                            "table": f"{self.schema}.items",
                            "primary_key": "id",
                            "cursor": "updated_at",
                            "write_disposition": self.mode,
                            "slice_rows": self.rng.randint(3, 40),
                            "lookback_seconds": 1,  # the clock's resolution: ties written late are re-read
                            "late_commits": {"wait_seconds": 0},  # a held transaction never ends during a run
                            "reconcile": {
                                "scope": "off",
                                "full_every_seconds": 0,
                                "deletes": "report" if self.detection_off else self.detect,
                            }
                            if self.detect
                            else "off",
                        }
                    },
                }
            },
        }
        (self.home / f"{self.schema}.yaml").write_text(yaml.safe_dump(catalog))

    @property
    def deletes(self) -> bool:
        """Whether the source hard-deletes rows: a refresh (replace) sees it, a merge stream only by detection."""
        return self.mode == "replace" or self.detect is not None

    def _url_file(self) -> Path:
        path = self.home / f"{self.schema}.url"
        path.write_text(self.url)
        return path

    def _mutate(self, count: int, deletes: bool) -> None:
        for _ in range(count):
            self.clock += self.rng.choice([0, 0, 1, 2])
            choice = self.rng.random()
            if self.model.rows and choice < 0.45:
                key = self.rng.choice(sorted(self.model.rows))
                value = self.rng.randint(0, 10**6)
                self._sql(
                    f'UPDATE "{self.schema}".items SET value = %s, updated_at = %s WHERE id = %s',
                    (value, self._stamp(), key),
                )
                self.model.rows[key] = (self.clock, value)
            elif deletes and self.model.rows and choice < 0.6:
                key = self.rng.choice(sorted(self.model.rows))
                self._sql(f'DELETE FROM "{self.schema}".items WHERE id = %s', (key,))
                del self.model.rows[key]
                self.events.append(f"source: deleted row {key}")
            else:
                key, value = self.model.next_id, self.rng.randint(0, 10**6)
                self.model.next_id += 1
                self._sql(
                    f'INSERT INTO "{self.schema}".items (id, value, updated_at) VALUES (%s, %s, %s)',
                    (key, value, self._stamp()),
                )
                self.model.rows[key] = (self.clock, value)

    @contextlib.contextmanager
    def _late_transaction(self, enabled: bool) -> Iterator[Any]:
        """A writer whose transaction stays open across sync attempts: it inserts a row stamped with the clock
        at its start and commits after one to three attempts, behind rows they read (a late commit)."""
        if not enabled:
            yield lambda: None
            return
        conn = psycopg2.connect(self.url, application_name="sim-writer")
        key, value, stamp = self.model.next_id, self.rng.randint(0, 10**6), self.clock
        attempts_left = self.rng.randint(1, 3)

        def release() -> None:
            nonlocal attempts_left
            attempts_left -= 1
            if attempts_left == 0 and not conn.closed:
                conn.commit()
                conn.close()
                self.model.rows[key] = (stamp, value)
                self.events.append(f"late: row {key} committed")

        try:
            self.model.next_id += 1
            with conn.cursor() as cur:
                cur.execute(
                    f'INSERT INTO "{self.schema}".items (id, value, updated_at) VALUES (%s, %s, %s)',
                    (key, value, self._stamp()),
                )
            self.events.append(f"late: row {key} at {stamp} held open")
            self.clock += 3  # beyond the lookback: only the late-commit guard keeps this row from being skipped
            self._mutate(self.rng.randint(1, 5), deletes=False)
            yield release
            attempts_left = 1
            release()  # the sync completed first: the writer commits now
        finally:
            conn.close()

    def _lose_target(self) -> None:
        """The target stops holding what the checkpoint says: a new file, a dropped table, an older copy."""
        choices = ["new file", "dropped table"] + (["older copy"] if self._backup().exists() else [])
        what = self.rng.choice(choices)
        self.events.append(f"target: {what}")
        if what == "new file":
            self.warehouse.unlink(missing_ok=True)
        elif what == "older copy":
            shutil.copy(self._backup(), self.warehouse)
        elif self.warehouse.exists():
            with duckdb.connect(str(self.warehouse)) as con:
                con.execute("DROP TABLE IF EXISTS sim.items")

    def _keep_backup(self) -> None:
        if self.warehouse.exists():
            shutil.copy(self.warehouse, self._backup())

    def _backup(self) -> Path:
        return self.home / f"{self.schema}.backup.duckdb"

    def _add_column(self, round_index: int) -> None:
        self._sql(f'ALTER TABLE "{self.schema}".items ADD COLUMN extra_{round_index} text')
        self.events.append(f"schema: added extra_{round_index}")

    def _stamp(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.clock)

    def _sql(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with contextlib.closing(psycopg2.connect(self.url)) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            conn.commit()

    # --- syncing ---------------------------------------------------------------------------------
    def _sync_until_done(self, fault_rate: float, quiet: bool = False, between: Any = None) -> None:
        """Runs until one completes; each crash is a dead process, the next run a fresh one. `between` is
        called after each crashed attempt (a writer may commit meanwhile)."""
        for _ in range(ATTEMPTS):
            faults = SimFaults(self.rng, fault_rate)
            try:
                with self._simulated_network(fault_rate, quiet), unsafe_order(self.unsafe):
                    self._job(faults).run()
                return
            except Crash as crash:
                self.events.append(f"crash: {crash}")
                if between is not None:
                    between()
        raise SimulationFailure(f"seed {self.seed}: no run completed in {ATTEMPTS} attempts")

    def _job(self, faults: SimFaults) -> PartitionJob:
        settings = Settings(home=self.home, catalog_path=self.home / f"{self.schema}.yaml")
        (stream,) = catalog_streams(settings, load_catalog(settings.catalog_path))
        return PartitionJob(stream, self.store, faults=faults, read_ahead=0)  # type: ignore[arg-type]

    @property
    def store(self) -> SimStore:
        if not hasattr(self, "_store"):
            self._store = SimStore(self.rng, 0.05, self._check_checkpoint)
        return self._store

    @contextlib.contextmanager
    def _simulated_network(self, fault_rate: float, quiet: bool) -> Iterator[None]:
        """Source reads that may die mid-stream, with writes landing in the source between slices."""
        real = postgres_table.table_slices
        simulation = self

        def table_slices(*args: Any, **kwargs: Any) -> Iterator[Any]:
            reader = real(*args, **kwargs)
            first = next(reader, None)  # the COPY has started: its snapshot is the model as of now
            simulation.read_snapshot = simulation.model.positions()
            pieces = [] if first is None else [first]
            for piece in [*pieces, *reader]:
                yield piece
                if simulation.rng.random() < fault_rate:
                    simulation.events.append("network: connection reset during the read")
                    raise Crash("connection reset")
                if not quiet and simulation.rng.random() < 0.3:
                    simulation._mutate(simulation.rng.randint(1, 4), deletes=simulation.deletes)

        postgres_table.table_slices = table_slices  # type: ignore[assignment]
        try:
            yield
        finally:
            postgres_table.table_slices = real

    # --- invariants --------------------------------------------------------------------------------
    def _target(self) -> dict[int, tuple[int, int]]:
        if not self.warehouse.exists():
            return {}
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            try:
                live = " WHERE _ingest_deleted_at IS NULL" if self.detect == "soft" else ""  # soft: flagged, kept
                rows = con.execute(f"SELECT id, updated_at, value FROM sim.items{live}").fetchall()
            except duckdb.CatalogException:
                return {}
        found: dict[int, tuple[int, int]] = {}
        for key, stamp, value in rows:
            if key in found:
                raise SimulationFailure(f"seed {self.seed}: primary key {key} twice in the target")
            found[key] = (int((stamp - EPOCH).total_seconds()), value)
        return found

    def _check_checkpoint(self, stored: Checkpoint) -> None:
        """The checkpoint never runs ahead of the target: every row read at or before it is loaded."""
        position = stored.position
        if position is None or stored.details.get("refresh") or self.mode == "replace":
            return  # a refresh writes a shadow table; its checkpoint is checked at the swap (final check)
        cut = (int((dt.datetime.fromisoformat(position["updated_at"]) - EPOCH).total_seconds()), int(position["id"]))
        target = self._target()
        for key, (stamp, _value) in self.read_snapshot.items():
            if key not in target and self.detect and key not in self.model.rows:
                continue  # deleted at the source since the read, and the detection applied it
            if (stamp, key) <= cut and (key not in target or target[key][0] < stamp):
                raise SimulationFailure(
                    f"seed {self.seed}: checkpoint {position} is ahead of the target: row {key} (version {stamp}) "
                    f"was read before it but is {'missing' if key not in target else 'older'} in the target; "
                    f"replay with `{self.replay}`"
                )

    def _check_final(self) -> None:
        target, source = self._target(), self.model.rows
        missing = sorted(set(source) - set(target))
        stale = sorted(k for k in source if k in target and target[k] != source[k])
        extra = sorted(set(target) - set(source))  # merge streams keep deleted rows unless they detect them
        if missing or stale or extra:
            kind = self.mode + (f", deletes detected {self.detect}" if self.detect else "")
            raise SimulationFailure(
                f"seed {self.seed} ({kind}): {len(missing)} rows missing {missing[:5]}, {len(stale)} stale "
                f"{stale[:5]}, {len(extra)} not deleted {extra[:5]} after {len(self.events)} events "
                f"(last: {self.events[-5:]}); replay with `{self.replay}`"
            )

    def _teardown(self) -> None:
        self._sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def replay_command(seed: int, rounds: int, unsafe: bool, kind: str | None = None) -> str:
    """The `make simulate` line that replays a run exactly."""
    command = f"make simulate SEED={seed}"
    command += "" if rounds == DEFAULT_ROUNDS else f" ROUNDS={rounds}"
    command += "" if kind is None else f" KIND={kind}"
    return command + (" UNSAFE=1" if unsafe else "")


@contextlib.contextmanager
def unsafe_order(enabled: bool) -> Iterator[None]:
    """The deliberately broken protocol (checkpoint before the load commits), to prove the harness can fail."""
    if not enabled:
        yield
        return
    os.environ[UNSAFE_ORDER_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(UNSAFE_ORDER_ENV, None)
