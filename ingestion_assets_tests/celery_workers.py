"""Celery workers for tests and benchmarks: real worker processes on the machine's Redis, each with a home of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import redis
import yaml

REDIS_URL_ENV = "INGEST_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"  # a database of our own on the machine's Redis
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Worker:
    name: str
    home: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes, as a host that dies would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@dataclass
class CeleryDeployment:
    """A broker (one Redis key prefix per deployment, so parallel tests never meet) and the workers on it."""

    folder: Path
    redis_url: str = field(default_factory=lambda: os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL))
    key_prefix: str = field(default_factory=lambda: f"ingest-test-{uuid.uuid4().hex[:10]}:")
    workers: list[Worker] = field(default_factory=list)

    def execution(self, visibility_timeout_seconds: float = 3600) -> dict[str, Any]:
        """The catalog's `execution` section; the broker URL by reference, as a user gives it."""
        url_file = self.folder / "broker_url"
        url_file.write_text(self.redis_url)
        celery = {
            "broker": {"file": str(url_file)},
            "key_prefix": self.key_prefix,
            "visibility_timeout_seconds": visibility_timeout_seconds,
        }
        return {"executor": "celery", "celery": celery}

    def start_worker(self, catalog: Path, storage_home: Path, concurrency: int = 1, **env: str) -> Worker:
        """A worker with an INGEST_HOME and DAGSTER_HOME of its own whose dagster.yaml names the same storage."""
        name = f"w{len(self.workers)}-{uuid.uuid4().hex[:6]}"
        home = self.folder / name
        dagster_home = home / "dagster"
        dagster_home.mkdir(parents=True)
        config = yaml.safe_load((storage_home / "dagster.yaml").read_text())
        config["local_artifact_storage"]["config"]["base_dir"] = str(dagster_home / "storage")
        (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
        log_path = self.folder / f"{name}.log"
        options = ["--concurrency", str(concurrency), "--hostname", f"{name}@%h", "--loglevel", "INFO"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "ingestion_assets.worker", *options, "--without-gossip", "--without-mingle"],
                env={
                    **os.environ,
                    "INGEST_HOME": str(home),
                    "DAGSTER_HOME": str(dagster_home),
                    "INGEST_CATALOG": str(catalog),
                    **env,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        worker = Worker(name=name, home=home, process=process, log_path=log_path)
        self.workers.append(worker)
        return worker

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            while " ready." not in worker.log():
                if worker.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"worker {worker.name} did not start:\n{worker.log()[-3000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        """Idle workers hold nothing: SIGKILL is as good as a warm shutdown, and seconds faster."""
        for worker in self.workers:
            worker.kill()
        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.key_prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
        for worker in self.workers:
            shutil.rmtree(worker.home, ignore_errors=True)


@contextlib.contextmanager
def celery_deployment(folder: Path) -> Iterator[CeleryDeployment]:
    folder.mkdir(parents=True, exist_ok=True)
    deployment = CeleryDeployment(folder=folder)
    try:
        yield deployment
    finally:
        deployment.stop()


def with_execution(catalog: Path, execution: dict[str, Any]) -> Path:
    """Add the `execution` section to a catalog file written by StreamHarness.write_catalog."""
    raw = yaml.safe_load(catalog.read_text())
    raw["execution"] = execution
    catalog.write_text(yaml.safe_dump(raw))
    return catalog


def step_workers(instance: dg.DagsterInstance, run_id: str) -> dict[str, list[str]]:
    """Which Celery worker (its node name) executed each step of a run, in order: a retried step lists two."""
    workers: dict[str, list[str]] = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        event = entry.dagster_event
        if event is None or not entry.step_key or "in celery worker" not in (event.message or ""):
            continue
        metadata = event.engine_event_data.metadata
        workers.setdefault(entry.step_key, []).append(str(metadata["Celery worker"].value))
    return workers


class ReadSampler:
    """Counts, from the source's side, the COPY reads of one source in flight (pg_stat_activity, by the
    application_name `ingest:<source>.<stream>` the reader sets), every `interval` seconds, in a thread."""

    def __init__(self, url: str, source_name: str, interval: float = 0.05) -> None:
        self.url, self.source_name, self.interval = url, source_name, interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="read-sampler", daemon=True)

    def __enter__(self) -> ReadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def most(self) -> int:
        return max(self.samples, default=0)

    def _sample(self) -> None:
        conn = psycopg2.connect(self.url, application_name="test-read-sampler")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while not self._stop.is_set():
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s "
                        "AND state = 'active' AND query ILIKE 'COPY%%'",
                        (f"ingest:{self.source_name}.%",),
                    )
                    self.samples.append(int(cur.fetchone()[0]))
                    time.sleep(self.interval)
        finally:
            conn.close()


def most_steps_at_once(instance: dg.DagsterInstance, run_ids: list[str]) -> int:
    """The most steps of these runs between their start and their end at one moment, from the event log.

    A step starts after it claimed its pool slot and ends before it frees it, so with the pool honoured
    this never exceeds the pool's size, whichever workers ran the steps."""
    moments: list[tuple[float, int]] = []
    for run_id in run_ids:
        for entry in instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_START}):
            moments.append((entry.timestamp, 1))
        ends = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE}
        for entry in instance.all_logs(run_id, of_type=ends):
            moments.append((entry.timestamp, -1))
    running = most = 0
    for _, change in sorted(moments):  # an end before a start at the same moment
        running += change
        most = max(most, running)
    return most
