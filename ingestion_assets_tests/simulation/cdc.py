"""The seeded simulation for a CDC source: the real snapshot, pgoutput reader, change application, loader
and slot acknowledgement against a real PostgreSQL; crashes at every fault point (snapshot slices, before
and after each batch's load, after its checkpoint), lost or fatal checkpoint writes, and source changes
between slices and batches (inserts, updates, deletes, primary-key changes).

At every checkpoint it checks that the target holds exactly the source as of that log position (each
change the sim makes is stamped with the WAL position right after its commit) and that the slot was never
acknowledged past the stored checkpoint; at the end, that the target equals the source.

With `history` the source copies its history as key-range partitions (`cdc.history_chunk`): runs of `live`
and of ranges (new, retried or done again) interleave in a seeded order, a transaction is held open across
each range's snapshot and committed right after it, and the target is checked at the end (a checkpoint
then stands for the log only: ranges not copied yet are missing by design).

A seed replays identically on any machine: a run's draws come from generators of their own (seeded by the
seed and the run's number), drawn only at events the data decides (a new read position, a slice, a
checkpoint), never at a read repeated because the server had not caught up yet; and reads stop on their
change count or on catching up, not on time (max_seconds is far above what a read needs)."""

from __future__ import annotations

import collections
import contextlib
import random
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import yaml

import ingestion_assets.streams.cdc.batches as batches_module
import ingestion_assets.streams.cdc.copy as copy_module
import ingestion_assets.streams.cdc.copying as copying_module
from ingestion_assets.catalog import load_catalog
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.cdc import drop_slot, format_lsn, parse_lsn, slot_health
from ingestion_assets.streams.cdc import CdcSync
from ingestion_assets.streams.cdc.state import COPY
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets_tests.simulation.harness import (
    DEFAULT_ROUNDS,
    Crash,
    SimFaults,
    SimulationFailure,
    replay_command,
    unsafe_order,
)

Rows = dict[int, int]  # id -> value


class SimCdcStore:
    """The CDC checkpoint store; each commit is checked, some writes are lost or the process dies after."""

    def __init__(self, rng: random.Random, rate: float, check: Any) -> None:
        self.rng, self.rate, self.check = rng, rate, check
        self.state: dict[str, dict[str, Any]] = {}  # stream -> its checkpoint

    def latest(self) -> dict[str, dict[str, Any] | None]:
        return dict(self.state)

    def commit(self, lsn: int, details: Mapping[str, Mapping[str, Any]]) -> None:
        if self.rng.random() < self.rate / 2:
            raise Crash("checkpoint write lost")
        self.state |= {name: {**extra, "lsn": format_lsn(lsn)} for name, extra in details.items()}
        # A stream being copied again makes no claim until its copy is done (its last range committed).
        if "items" in details and COPY not in details["items"]:
            self.check(lsn)
        if self.rng.random() < self.rate / 2:
            raise Crash("died right after the checkpoint write")


class CdcSimulation:
    def __init__(
        self, seed: int, source_url: str, home: Path, unsafe: bool = False, history: bool = False, ddl: bool = True
    ) -> None:
        self.seed, self.url, self.home, self.unsafe, self.history_mode = seed, source_url, home, unsafe, history
        self.rng = random.Random(seed)
        self.name = f"simcdc_{seed}_{uuid.uuid4().hex[:6]}"
        self.deletes = self.rng.choice(["hard", "soft"])
        self.mode = f"cdc{' history' if history else ''}, {self.deletes} deletes"
        self.partitions: list[str] = []  # history mode: the planned ranges
        self.copied: set[str] = set()
        self.warehouse = home / f"{self.name}_warehouse.duckdb"  # not the source's name: see the catalog check
        self.rows: Rows = {}
        self.history: list[tuple[int, Rows]] = []  # (WAL position after the change's commit, rows after it)
        self.next_id = 1
        self.events: list[str] = []
        self.rounds = DEFAULT_ROUNDS
        self.store = SimCdcStore(self.rng, 0.05, self._check_checkpoint)
        self.runs = 0  # attempts so far: each has its own generators (see _sync_until_done)
        self.source_rng = self.rng  # the draws of source changes: the run's own generator while a run goes
        self._conn: Any = None
        # DDL draws come from their own generator, so the other draws of a seed stay what they were.
        self.ddl = random.Random(seed * 7919 + 13)
        never = DEFAULT_ROUNDS * 1000  # without `ddl`: the schema and the catalog stay as they are
        self.add_column_round = self.ddl.randint(1, DEFAULT_ROUNDS - 1) if ddl else never
        self.add_stream_round = self.ddl.randint(1, DEFAULT_ROUNDS - 1) if ddl else never
        self.extra_default: int | None = None  # the default of the column added to items, once added
        self.streams = ["items"]
        self._cdc_options: dict[str, Any] | None = None

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.rounds, self.unsafe, kind="cdch" if self.history_mode else "cdc")

    def run(self, rounds: int = DEFAULT_ROUNDS) -> list[str]:
        self.rounds = rounds
        self._conn = psycopg2.connect(self.url)
        self._conn.autocommit = True
        try:
            self._sql(f'CREATE SCHEMA "{self.name}"')
            self._sql(f'CREATE TABLE "{self.name}".items (id int PRIMARY KEY, value int NOT NULL)')
            self._sql(f'CREATE TABLE "{self.name}".more (id int PRIMARY KEY, value int NOT NULL)')
            self._sql(
                f'INSERT INTO "{self.name}".more SELECT g, g FROM generate_series(1, %s) g', (self.ddl.randint(1, 80),)
            )
            self._mutate(self.rng.randint(20, 150))
            self._write_catalog()
            for round_ in range(rounds):
                self._source_ddl(round_)
                self._mutate(self.rng.randint(1, 30))
                self._sync_until_done(self.rng.choice([0.0, 0.03, 0.08, 0.15]), changing=True, partition=self._pick())
            for key in [k for k in self.partitions if k not in self.copied]:  # the backfill's last ranges
                self._sync_until_done(self.rng.choice([0.0, 0.08]), changing=True, partition=key)
            for _ in range(500):  # at rest: runs (each at most max_batches_per_run batches) until one finds nothing
                if self._sync_until_done(0.0, changing=False) == 0:
                    break
            self._check_final()
        finally:
            with contextlib.suppress(psycopg2.Error):
                drop_slot(self.url, f"ingest_{self.name}")
                self._sql(f'DROP PUBLICATION IF EXISTS "ingest_{self.name}"')
                self._sql(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
            self._conn.close()
        return self.events

    # --- the source ----------------------------------------------------------------------------
    def _sql(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with self._conn.cursor() as cur:
            cur.execute(statement, params)

    def _mutate(self, count: int) -> None:
        """Each change its own transaction, stamped with the WAL position right after its commit."""
        table = f'"{self.name}".items'
        rng = self.source_rng
        for _ in range(count):
            roll = rng.random()
            if self.rows and roll < 0.4:
                key, value = rng.choice(sorted(self.rows)), rng.randint(0, 10**6)
                self._change(f"UPDATE {table} SET value = %s WHERE id = %s", (value, key))
                self.rows[key] = value
            elif self.rows and roll < 0.55:
                key = rng.choice(sorted(self.rows))
                self._change(f"DELETE FROM {table} WHERE id = %s", (key,))
                del self.rows[key]
            elif self.rows and roll < 0.6:  # a primary-key change: a delete of the old key, an insert of the new
                key, new = rng.choice(sorted(self.rows)), self.next_id
                self.next_id += 1
                self._change(f"UPDATE {table} SET id = %s WHERE id = %s", (new, key))
                self.rows[new] = self.rows.pop(key)
            else:
                key, value = self.next_id, rng.randint(0, 10**6)
                self.next_id += 1
                self._change(f"INSERT INTO {table} (id, value) VALUES (%s, %s)", (key, value))
                self.rows[key] = value
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                self.history.append((parse_lsn(cur.fetchone()[0]), dict(self.rows)))

    def _change(self, statement: str, params: tuple[Any, ...]) -> None:
        """One change of items in a transaction of its own (the live simulation also notes its xid)."""
        self._sql(statement, params)

    def _source_ddl(self, round_: int) -> None:
        """A column added with a default (its existing rows get it without a row change in the log), and a
        table with rows added to the catalog as a new stream while the source runs."""
        if round_ == self.add_column_round:
            self.extra_default = self.ddl.randint(1, 10**6)
            self._sql(f'ALTER TABLE "{self.name}".items ADD COLUMN extra int NOT NULL DEFAULT {self.extra_default}')
            self.events.append("ddl: column added")
        if round_ == self.add_stream_round:
            self.streams.append("more")
            self._write_catalog()
            self.events.append("ddl: stream added")
        if "more" in self.streams or round_ < self.add_stream_round:
            key = self.ddl.randint(1, 120)
            self._sql(
                f'INSERT INTO "{self.name}".more VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET value = excluded.value',
                (key, self.ddl.randint(0, 10**6)),
            )

    def _write_catalog(self) -> None:
        (self.home / f"{self.name}.url").write_text(self.url)
        if self._cdc_options is None:  # drawn once: a stream added later keeps the seed's other draws
            self._cdc_options = {
                "max_changes": self.rng.randint(3, 40),
                "max_seconds": 60,  # a read ends on max_changes or on catching up, never on the machine's speed
                "max_batches_per_run": self.rng.randint(3, 10),
                "snapshot_slice_rows": self.rng.randint(5, 60),
            }
            if self.history_mode:
                self._cdc_options["history_chunk"] = self.rng.randint(8, 60)
        source = {
            "type": "postgres",
            "mode": "cdc",
            "connection": {"file": str(self.home / f"{self.name}.url")},
            "cdc": self._cdc_options,
            "streams": {
                name: {"table": f"{self.name}.{name}", "primary_key": "id", "deletes": self.deletes}
                for name in self.streams
            },
        }
        catalog = {"destination": {"type": "duckdb", "path": str(self.warehouse)}, "sources": {self.name: source}}
        (self.home / f"{self.name}.yaml").write_text(yaml.safe_dump(catalog))

    # --- syncing ---------------------------------------------------------------------------------
    def _pick(self) -> str | None:
        """History mode: `live`, a range not copied yet, or one copied before (a user's re-run)."""
        if not self.history_mode:
            return None
        if not self.partitions or self.rng.random() < 0.4:
            return LIVE
        return self.rng.choice(self.partitions)

    def _sync_until_done(self, fault_rate: float, changing: bool, partition: str | None = None) -> int:
        """Runs until one completes; returns the changes (or snapshot rows) it applied."""
        for _ in range(60):
            self.runs += 1
            own = lambda purpose: random.Random(f"{self.seed}:{self.runs}:{purpose}")  # noqa: E731
            self.store.rng, self.source_rng = own("checkpoints"), own("source")
            try:
                with self._changes_between_reads(changing), unsafe_order(self.unsafe):
                    outcome = self._sync(SimFaults(own("faults"), fault_rate)).run(partition)
                if partition is not None and partition != LIVE:
                    self.copied.add(partition)
                return sum(outcome.rows.values())
            except Crash as crash:
                self.events.append(f"crash: {crash}")
            finally:
                self.source_rng = self.rng
        points = collections.Counter(e.removeprefix("crash: ") for e in self.events[-60:] if e.startswith("crash: "))
        raise SimulationFailure(
            f"seed {self.seed}: no run completed in 60 attempts; where they crashed: {dict(points.most_common(8))}"
        )

    def _sync(self, faults: SimFaults) -> CdcSync:
        settings = Settings(home=self.home, catalog_path=self.home / f"{self.name}.yaml")
        catalog = load_catalog(settings.catalog_path)
        source = catalog.sources[self.name]
        streams = [
            PostgresTableStream(settings, catalog.destination, self.name, source, name, spec)  # type: ignore[arg-type]
            for name, spec in source.streams.items()
        ]
        sync = CdcSync(settings, catalog.destination, self.name, source, streams, self.store, faults=faults)  # type: ignore[arg-type]
        sync.add_partitions = self._plan
        return sync

    def _plan(self, keys: list[str]) -> None:
        self.partitions = [k for k in keys if k != LIVE]

    @contextlib.contextmanager
    def _changes_between_reads(self, changing: bool) -> Iterator[None]:
        """The source keeps changing between snapshot slices and between batches of changes."""
        real_slices, real_changes, real_snapshot = (
            copy_module.table_slices,
            batches_module.read_changes,
            copying_module.chunk_snapshot,
        )
        simulation = self
        starts: set[int] = set()  # read positions seen in this run: a repeated read draws nothing

        def table_slices(*args: Any, **kwargs: Any) -> Iterator[Any]:
            for piece in real_slices(*args, **kwargs):
                yield piece
                if changing and simulation.source_rng.random() < 0.4:
                    simulation._mutate(simulation.source_rng.randint(1, 5))

        def read_changes(url: str, slot: str, publication: str, start: int, **kwargs: Any) -> Any:
            # Waiting for the server to reach a copy's snapshot re-reads from one position as often as the
            # machine's speed makes it: only the first read from a position may change the source.
            if changing and start not in starts and simulation.source_rng.random() < 0.5:
                simulation._mutate(simulation.source_rng.randint(1, 8))
            starts.add(start)
            return real_changes(url, slot, publication, start, **kwargs)

        @contextlib.contextmanager
        def chunk_snapshot(url: str) -> Iterator[Any]:
            with simulation._held_across() as commit, real_snapshot(url) as snap:
                commit()  # running while the snapshot was taken, committed right after: the snapshot does not see it
                yield snap

        copy_module.table_slices, batches_module.read_changes = table_slices, read_changes  # type: ignore[assignment]
        copying_module.chunk_snapshot = chunk_snapshot  # type: ignore[assignment]
        try:
            yield
        finally:
            copy_module.table_slices, batches_module.read_changes = real_slices, real_changes
            copying_module.chunk_snapshot = real_snapshot

    @contextlib.contextmanager
    def _held_across(self) -> Iterator[Any]:
        """An update and a delete in a transaction open until `commit` is called (or the block ends)."""
        conn = psycopg2.connect(self.url)
        table = f'"{self.name}".items'
        keys = self.source_rng.sample(sorted(self.rows), min(2, len(self.rows)))
        value = self.source_rng.randint(0, 10**6)
        with conn.cursor() as cur:
            if keys:
                cur.execute(f"UPDATE {table} SET value = %s WHERE id = %s", (value, keys[0]))
            if len(keys) > 1:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (keys[1],))
        done = False

        def commit() -> None:
            nonlocal done
            if done:
                return
            conn.commit()
            done = True
            if keys:
                self.rows[keys[0]] = value
            if len(keys) > 1:
                del self.rows[keys[1]]
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                self.history.append((parse_lsn(cur.fetchone()[0]), dict(self.rows)))

        try:
            yield commit
            commit()
        finally:
            conn.close()

    # --- invariants --------------------------------------------------------------------------------
    def _target(self) -> Rows:
        if not self.warehouse.exists():
            return {}
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            try:
                rows = con.execute(
                    f'SELECT id, value FROM "{self.name}".items WHERE _ingest_deleted_at IS NULL'
                ).fetchall()
            except duckdb.CatalogException:
                return {}
        found: Rows = {}
        for key, value in rows:
            if key in found:
                raise SimulationFailure(f"seed {self.seed}: primary key {key} twice in the target; `{self.replay}`")
            found[key] = value
        return found

    def _check_checkpoint(self, lsn: int) -> None:
        """The target is the source as of the checkpoint's log position; the slot is not acknowledged past it."""
        health = slot_health(self.url, f"ingest_{self.name}")
        if health.confirmed_flush_lsn is not None and health.confirmed_flush_lsn > lsn:
            raise SimulationFailure(
                f"seed {self.seed}: the slot was acknowledged at {format_lsn(health.confirmed_flush_lsn)}, past the "
                f"checkpoint {format_lsn(lsn)}; replay with `{self.replay}`"
            )
        if self.history_mode:
            return  # ranges not copied yet are missing by design: the end compares
        before = [rows for stamp, rows in self.history if stamp < lsn]
        candidates = [before[-1] if before else {}]  # every change committed before the position
        later = [rows for stamp, rows in self.history if stamp >= lsn]
        if later:
            candidates.append(later[0])  # the change whose commit ends exactly at the position
        target = self._target()
        if target not in candidates:
            expected = candidates[-1]
            missing = sorted(set(expected) - set(target))[:5]
            extra = sorted(set(target) - set(expected))[:5]
            raise SimulationFailure(
                f"seed {self.seed}: at checkpoint {format_lsn(lsn)} the target is not the source as of then "
                f"(missing {missing}, extra {extra}); replay with `{self.replay}`"
            )

    def _check_final(self) -> None:
        self._check_ddl()
        target = self._target()
        missing = sorted(set(self.rows) - set(target))
        stale = sorted(k for k in self.rows if k in target and target[k] != self.rows[k])
        extra = sorted(set(target) - set(self.rows))
        if missing or stale or extra:
            raise SimulationFailure(
                f"seed {self.seed} ({self.mode}): {len(missing)} missing {missing[:5]}, {len(stale)} stale "
                f"{stale[:5]}, {len(extra)} not deleted {extra[:5]} after {len(self.events)} events; "
                f"replay with `{self.replay}`"
            )

    def _check_ddl(self) -> None:
        """The added column holds its default on every live row (those that existed before it too), and the
        stream added later holds exactly its table's rows."""
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            live = "WHERE _ingest_deleted_at IS NULL"
            if self.extra_default is not None:
                wrong = con.execute(
                    f'SELECT count(*) FROM "{self.name}".items {live} AND extra IS DISTINCT FROM {self.extra_default}'
                ).fetchone()
                if wrong and wrong[0]:
                    raise SimulationFailure(
                        f"seed {self.seed} ({self.mode}): {wrong[0]} rows lack the added column's default; "
                        f"replay with `{self.replay}`"
                    )
            if "more" in self.streams:
                target = con.execute(f'SELECT id, value FROM "{self.name}".more {live} ORDER BY id').fetchall()
                with self._conn.cursor() as cur:
                    cur.execute(f'SELECT id, value FROM "{self.name}".more ORDER BY id')
                    source = [tuple(r) for r in cur.fetchall()]
                if target != source:
                    missing = sorted(set(source) - set(target))[:5]
                    raise SimulationFailure(
                        f"seed {self.seed} ({self.mode}): the stream added later differs from its table "
                        f"(missing or stale {missing}); replay with `{self.replay}`"
                    )
