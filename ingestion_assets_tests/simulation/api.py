"""The seeded simulation for an HTTP API stream: the real stream, paginator, governor, retries, loader and
runner; a simulated clock (waits cost nothing and stamp the records), a simulated network (latency,
timeouts, connection resets, 429 with Retry-After, 503) in front of a model SaaS API whose records change
between pages, and the same fault points and checkpoint store as the table simulation."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import email.utils
import json
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import httpx
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams
from ingestion_assets.settings import Settings
from ingestion_assets.sources.rest.errors import RateLimited, RetriesExhausted
from ingestion_assets.sources.rest.incremental import REREAD_FROM
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.streams.runner import NoProgress, PartitionJob
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

TOKEN = "sim-token"


@dataclass
class SimClock:
    """Time as the client and the API see it: a sleep advances it at once."""

    seconds: float = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.seconds)

    def sleep(self, seconds: float) -> None:
        self.seconds += max(0.0, seconds)


@dataclass
class ModelApi:
    """A cursor-paginated listing sorted by (updated_at, id), filtered by `updated_since` (inclusive)."""

    rng: random.Random
    clock: SimClock
    rows: dict[int, tuple[dt.datetime, int]] = field(default_factory=dict)
    fault_rate: float = 0.0
    changing: bool = True
    requests: int = 0

    def mutate(self, count: int) -> None:
        for _ in range(count):  # one stamp for the batch: ties on the cursor on purpose
            stamp = self.clock.now()
            if self.rows and self.rng.random() < 0.5:
                key = self.rng.choice(sorted(self.rows))
            else:
                key = max(self.rows, default=0) + 1
            self.rows[key] = (stamp, self.rng.randint(0, 10**6))

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        self.clock.sleep(self.rng.choice([0.0, 0.0, 0.001, 0.3]))  # latency
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"error": "invalid_token"}, request=request)
        roll = self.rng.random() / max(self.fault_rate, 1e-9)
        if roll < 0.05:
            raise Crash("the process died mid-request")
        if roll < 0.25:
            raise httpx.ConnectError("connection reset (simulated)", request=request)
        if roll < 0.45:
            raise httpx.ReadTimeout("read timed out (simulated)", request=request)
        if roll < 0.7:
            return httpx.Response(429, headers={"Retry-After": str(self.rng.randint(1, 20))}, request=request)
        if roll < 1.0:
            return httpx.Response(503, json={"error": "unavailable"}, request=request)
        response = self._listing(request)
        if self.changing and self.rng.random() < 0.3:
            self.clock.sleep(self.rng.choice([0.0, 0.0, 1.0]))
            self.mutate(self.rng.randint(1, 4))
        return response

    def _listing(self, request: httpx.Request) -> httpx.Response:
        query = dict(request.url.params)
        since = dt.datetime.fromisoformat(query["updated_since"]) if "updated_since" in query else None
        after = tuple(json.loads(base64.urlsafe_b64decode(query["cursor"]))) if query.get("cursor") else None
        ordered = sorted((stamp, key, value) for key, (stamp, value) in self.rows.items())
        rows = [
            r for r in ordered if (since is None or r[0] >= since) and (after is None or (_text(r[0]), r[1]) > after)
        ]
        size = int(query.get("limit", 50))
        token = None
        if len(rows) > size:
            last = [_text(rows[size - 1][0]), rows[size - 1][1]]
            token = base64.urlsafe_b64encode(json.dumps(last).encode()).decode()
        body = {
            "data": [{"id": key, "updated_at": _text(stamp), "value": value} for stamp, key, value in rows[:size]],
            "next_cursor": token,
        }
        date = email.utils.format_datetime(self.clock.now(), usegmt=True)  # whole seconds, as HTTP has it
        return httpx.Response(200, json=body, headers={"Date": date}, request=request)


def _text(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiSimulation:
    def __init__(self, seed: int, home: Path, unsafe: bool = False) -> None:
        self.seed, self.home, self.unsafe = seed, home, unsafe
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.api = ModelApi(self.rng, self.clock)
        self.name = f"simapi_{seed}_{uuid.uuid4().hex[:6]}"
        self.warehouse = home / f"{self.name}.duckdb"
        self.events: list[str] = []
        self.rounds = DEFAULT_ROUNDS
        self.mode = "api"
        self.store = SimStore(self.rng, 0.05, self._check_checkpoint)

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.rounds, self.unsafe, kind="api")

    def run(self, rounds: int = DEFAULT_ROUNDS) -> list[str]:
        self.rounds = rounds
        self.api.mutate(self.rng.randint(20, 120))
        self._write_catalog()
        for _ in range(rounds):
            self.clock.sleep(self.rng.choice([0.0, 1.0, 5.0]))
            self.api.mutate(self.rng.randint(1, 25))
            self._sync_until_done(self.rng.choice([0.0, 0.02, 0.05, 0.1]), self.rng.choice([0.0, 0.1, 0.3]))
        self.api.changing = False
        self._sync_until_done(0.0, 0.0)
        self._check_final()
        return self.events

    def _write_catalog(self) -> None:
        token = self.home / f"{self.name}.token"
        token.write_text(TOKEN)
        stream = {
            "path": "/v1/items",
            "primary_key": "id",
            "page_size": self.rng.randint(2, 15),
            "pages_per_slice": self.rng.randint(1, 3),
            "retries": {"max_attempts": 1},
        }
        source = {
            "type": "rest",
            "base_url": "http://sim.invalid",
            "auth": {"type": "bearer", "token": {"file": str(token)}},
            "rate_limit": {"requests_per_second": 5, "burst": 3},
            "http_retries": {"max_attempts": 8, "max_elapsed_seconds": 3600},
            "streams": {"items": stream},
        }
        catalog = {"destination": {"type": "duckdb", "path": str(self.warehouse)}, "sources": {"sim": source}}
        (self.home / f"{self.name}.yaml").write_text(yaml.safe_dump(catalog))

    def _sync_until_done(self, crash_rate: float, network_fault_rate: float) -> None:
        """Runs until one completes; a crash is a dead process (each fault point dies at `crash_rate`)."""
        self.api.fault_rate = network_fault_rate
        for _ in range(60):
            try:
                with unsafe_order(self.unsafe):
                    self._job(SimFaults(self.rng, crash_rate)).run()
                return
            except Crash as crash:
                self.events.append(f"crash: {crash}")
            except (RateLimited, RetriesExhausted, NoProgress) as error:  # a failed run: the next one resumes
                self.events.append(f"failed: {type(error).__name__}")
        raise SimulationFailure(f"seed {self.seed}: no run completed in 60 attempts ({self.events[-3:]})")

    def _job(self, faults: SimFaults) -> PartitionJob:
        settings = Settings(home=self.home, catalog_path=self.home / f"{self.name}.yaml")
        (stream,) = catalog_streams(settings, load_catalog(settings.catalog_path))
        simulated = dataclasses.replace(stream, clock=self.clock, transport=httpx.MockTransport(self.api.handle))
        return PartitionJob(simulated, self.store, faults=faults, read_ahead=0)  # type: ignore[arg-type]

    def _target(self) -> dict[int, tuple[dt.datetime, int]]:
        if not self.warehouse.exists():
            return {}
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            con.execute("SET TimeZone = 'UTC'")
            try:
                rows = con.execute("SELECT id, updated_at, value FROM sim.items").fetchall()
            except duckdb.CatalogException:
                return {}
        found: dict[int, tuple[dt.datetime, int]] = {}
        for key, stamp, value in rows:
            if key in found:
                raise SimulationFailure(f"seed {self.seed}: primary key {key} twice in the target; `{self.replay}`")
            found[key] = (stamp.astimezone(dt.UTC), value)
        return found

    def _check_checkpoint(self, stored: Checkpoint) -> None:
        """Every record older than where the next read starts is in the target at its current version or newer.

        The next read starts, inclusive, at the cursor's timestamp or at `_reread_from` (the moment the read
        began) if earlier: a record changed while a read ran may carry a timestamp the read had passed."""
        if not stored.position or not stored.position.get("updated_at"):
            return
        resume = stored.position.get(REREAD_FROM) or stored.position["updated_at"]
        cut = dt.datetime.fromisoformat(str(resume))
        target = self._target()
        for key, (stamp, _value) in self.api.rows.items():
            if stamp < cut and (key not in target or target[key][0] < stamp):
                raise SimulationFailure(
                    f"seed {self.seed}: checkpoint {stored.position} is ahead of the target: record {key} "
                    f"({_text(stamp)}) is {'missing' if key not in target else 'older'}; replay with `{self.replay}`"
                )

    def _check_final(self) -> None:
        target, source = self._target(), self.api.rows
        missing = sorted(set(source) - set(target))
        stale = sorted(k for k in source if k in target and target[k] != source[k])
        extra = sorted(set(target) - set(source))
        if missing or stale or extra:
            raise SimulationFailure(
                f"seed {self.seed} (api): {len(missing)} missing {missing[:5]}, {len(stale)} stale {stale[:5]}, "
                f"{len(extra)} unknown {extra[:5]} after {len(self.events)} events; replay with `{self.replay}`"
            )
