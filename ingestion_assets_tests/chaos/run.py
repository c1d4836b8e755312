"""Real chaos runs: `dagster asset materialize` of a table stream, a CDC source and an API stream,
SIGKILLed at random moments or cut off by a crash of the PostgreSQL that holds Dagster's storage (and the
sources), while a writer keeps changing every source; then clean runs, and each target is compared with
its source row by row: rows lost, stale, duplicated, or still there after the source deleted them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.cdc import drop_slot
from ingestion_assets.stack.instance import bring_up, instance_env
from ingestion_assets.state.summary import size_pools
from ingestion_assets_tests.chaos.sources import Writer, create_sources, source_rows, target_rows

SELECTION = "tbl/items,cdc/events,api/orders"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ChaosConfig:
    trials: int = 20
    seed: int = 1
    restart_share: float = 0.2  # trials whose fault is a crash of the storage server instead of a SIGKILL
    kinds: tuple[str, ...] = ()  # "kill" / "restart" per trial, in turn, instead of drawing by restart_share
    horizon: float = 14.0  # a fault lands uniformly within this many seconds of the run's start
    items: int = 20_000
    events: int = 4_000
    api_orders: int = 600


@dataclass
class Report:
    trials: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    compared: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    stale: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    not_deleted: Counter[str] = field(default_factory=Counter)
    changes: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(sum(c.values()) for c in (self.lost, self.stale, self.duplicates, self.not_deleted))

    def lines(self) -> list[str]:
        out = [
            f"trials {self.trials}; faults injected: "
            + ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
            + f"; source changes during runs: {self.changes}"
        ]
        for stream in sorted(self.compared):
            out.append(
                f"  {stream:<11} rows compared {self.compared[stream]:>7}  lost {self.lost[stream]}  "
                f"stale {self.stale[stream]}  duplicates {self.duplicates[stream]}  "
                f"not deleted {self.not_deleted[stream]}"
            )
        totals = (sum(c.values()) for c in (self.compared, self.lost, self.stale, self.duplicates, self.not_deleted))
        compared, lost, stale, duplicates, not_deleted = totals
        out.append(
            f"total: rows compared {compared}, lost {lost}, stale {stale}, duplicates {duplicates}, "
            f"not deleted {not_deleted}"
        )
        return out + [f"  e.g. {example}" for example in self.examples[:10]]


class Chaos:
    def __init__(self, home: Path, config: ChaosConfig) -> None:
        self.home, self.config = home, config
        self.rng = random.Random(config.seed)
        self.settings = Settings(home=home, catalog_path=home / "chaos.yaml")
        self.report = Report()
        self.logs = home / "runs"
        self.api: DemoApi | None = None

    def run(self, say: Any = print) -> Report:
        bring_up(self.settings)
        url = self.settings.embedded.ensure_database("chaos")
        self.api = start_demo_api(
            orders=self.config.api_orders, token_ttl=4.0, error_rate=0.03, reset_rate=0.01, seed=self.config.seed
        )
        writer = Writer(url, self.api, self.config.seed)
        try:
            create_sources(url, self.config.items, self.config.events)
            self._write_catalog(url)
            for trial in range(self.config.trials):
                writer.start()
                outcome = self._trial(trial)
                writer.stop()
                say(f"trial {trial + 1}/{self.config.trials}: {outcome}")
            self.report.changes = writer.changes
            self._settle(say)
            self._compare(url)
        finally:
            writer.stop()
            self.api.stop()
            if self.settings.embedded.is_running():
                drop_slot(url, "ingest_cdc")
        return self.report

    def _write_catalog(self, url: str) -> None:
        assert self.api is not None
        secrets = self.home / "secrets"
        secrets.mkdir(exist_ok=True)
        (secrets / "url").write_text(url)
        (secrets / "client_id").write_text(self.api.config.client_id)
        (secrets / "client_secret").write_text(self.api.config.client_secret)
        connection = {"file": str(secrets / "url")}
        catalog = {
            "destination": {"type": "duckdb", "path": str(self.home / "warehouse.duckdb")},
            "sources": {
                "tbl": {
                    "type": "postgres",
                    "connection": connection,
                    "streams": {
                        "items": {
                            "table": "public.items",
                            "primary_key": "id",
                            "cursor": "updated_at",
                            "slice_rows": 3000,
                            "lookback_seconds": 1,
                        }
                    },
                },
                "cdc": {
                    "type": "postgres",
                    "mode": "cdc",
                    "connection": connection,
                    "cdc": {"max_changes": 300, "max_seconds": 1, "snapshot_slice_rows": 1000},
                    "streams": {"events": {"table": "public.events", "primary_key": "id", "deletes": "hard"}},
                },
                "api": {
                    "type": "rest",
                    "base_url": self.api.url,
                    "auth": {
                        "type": "oauth2_client_credentials",
                        "token_url": "/oauth/token",
                        "client_id": {"file": str(secrets / "client_id")},
                        "client_secret": {"file": str(secrets / "client_secret")},
                        "scope": "orders:read",
                    },
                    "rate_limit": {"requests_per_second": 100, "burst": 20},
                    "streams": {
                        "orders": {"path": "/v1/orders", "primary_key": "id", "cursor": "updated_at", "page_size": 40}
                    },
                },
            },
        }
        self.settings.catalog_path.write_text(yaml.safe_dump(catalog))
        size_pools(self.settings, load_catalog(self.settings.catalog_path))

    def _trial(self, trial: int) -> str:
        self.report.trials += 1
        process = self._materialize(f"trial-{trial}")
        drawn = self.rng.random() < self.config.restart_share
        restart = self.config.kinds[trial % len(self.config.kinds)] == "restart" if self.config.kinds else drawn
        # A crash of the server lands after the run is connected; a SIGKILL may land anywhere, start-up too.
        delay = self.rng.uniform(3.0 if restart else 0.5, self.config.horizon)
        try:
            code = process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            if restart:
                self.settings.embedded.stop(mode="immediate")
                self.settings.embedded.ensure_running()
                self.report.faults["storage server crashed and restarted"] += 1
                code = self._wait(process, 600)
                return f"server crashed at {delay:.1f}s; the run exited {code}"
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.report.faults["SIGKILL"] += 1
            return f"SIGKILL at {delay:.1f}s"
        self.report.faults["none (finished first)"] += 1
        return f"finished in under {delay:.1f}s (exit {code})"

    def _settle(self, say: Any) -> None:
        """The sources at rest: clean runs until two in a row succeed (the second finds the rest)."""
        successes = 0
        for attempt in range(8):
            code = self._wait(self._materialize(f"settle-{attempt}"), 900)
            successes = successes + 1 if code == 0 else 0
            say(f"settle run {attempt + 1}: exit {code}")
            if successes == 2:
                return
        raise RuntimeError(f"no two clean runs in a row succeeded; see the logs under {self.logs}")

    def _materialize(self, name: str) -> subprocess.Popen[bytes]:
        self.logs.mkdir(exist_ok=True)
        command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize"]
        command += ["-m", "ingestion_assets.definitions", "--select", SELECTION]
        with (self.logs / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                command,
                env={**os.environ, **instance_env(self.settings)},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )

    @staticmethod
    def _wait(process: subprocess.Popen[bytes], timeout: float) -> int:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait()

    def _compare(self, url: str) -> None:
        assert self.api is not None
        sources, targets = source_rows(url, self.api), target_rows(self.home / "warehouse.duckdb")
        for stream, expected in sources.items():
            found: dict[Any, tuple[Any, ...]] = {}
            for key, *values in targets[stream]:
                if key in found:
                    self.report.duplicates[stream] += 1
                    self.report.examples.append(f"{stream}: key {key} twice")
                found[key] = tuple(values)
            self.report.compared[stream] = len(expected)
            for key, values in expected.items():
                if key not in found:
                    self.report.lost[stream] += 1
                    self.report.examples.append(f"{stream}: key {key} missing (source {values})")
                elif found[key] != values:
                    self.report.stale[stream] += 1
                    self.report.examples.append(f"{stream}: key {key} is {found[key]}, source {values}")
            for key in found.keys() - expected.keys():
                self.report.not_deleted[stream] += 1
                self.report.examples.append(f"{stream}: key {key} deleted in the source, still in the target")
