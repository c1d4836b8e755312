"""Scale-out on Celery, the long cases: a multi-stream, multi-partition backfill on two workers under the
source's pool, and a worker SIGKILLed mid-step whose step the other worker finishes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import dagster as dg
import pytest

from ingestion_assets_tests.celery_workers import (
    ReadSampler,
    celery_deployment,
    most_steps_at_once,
    step_workers,
    with_execution,
)
from ingestion_assets_tests.helpers import StreamHarness

pytestmark = pytest.mark.slow

DAYS = ("2024-03-01", "2024-03-02", "2024-03-03")
PER_DAY = 6_000
TABLES = f"""
CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text, updated_at timestamptz NOT NULL);
INSERT INTO orders SELECT g, g * 0.5, CASE WHEN g % 9 = 0 THEN NULL ELSE md5(g::text) END,
    timestamptz '2024-03-01 00:00:00+00' + (g - 1) * (interval '1 day' / {PER_DAY})
FROM generate_series(1, {PER_DAY * len(DAYS)}) g;
CREATE TABLE payments (id bigint PRIMARY KEY, order_id bigint, paid boolean, updated_at timestamptz NOT NULL);
INSERT INTO payments SELECT g, g / 2, g % 3 = 0,
    timestamptz '2024-03-01 00:00:00+00' + (g - 1) * (interval '1 day' / {PER_DAY})
FROM generate_series(1, {PER_DAY * len(DAYS)}) g;
"""


def _daily(table: str) -> dict[str, object]:
    return {
        "table": table,
        "primary_key": "id",
        "cursor": "updated_at",
        "slice_rows": 1_500,
        "partitions": {"by": "time", "column": "updated_at", "start": DAYS[0], "granularity": "daily"},
    }


def test_a_backfill_of_two_streams_by_day_runs_on_two_workers_under_the_pool(
    harness: StreamHarness, tmp_path: Path
) -> None:
    harness.source.execute(TABLES)
    harness.write_catalog(
        {"orders": _daily("orders"), "payments": _daily("payments")}, destination="postgres", max_concurrency=2
    )
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.settings.catalog_path, deployment.execution())
        for _ in range(2):  # four worker slots: only the pool (2) keeps reads down
            deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home, concurrency=2)
        with ReadSampler(harness.source.url, harness.source_name) as reads:
            runs = [  # a run per day, both streams in it: every step of every run goes to the workers
                harness.materialize_cli(f"orders,{harness.source_name}/payments", "--partition", day) for day in DAYS
            ]
            harness.wait_ok(*runs, timeout=900)

        done = harness.instance.get_runs(limit=len(DAYS))
        # the pool, from both sides: steps holding a slot (event log), COPY reads in flight (the source's
        # pg_stat_activity; a read ends ahead of its step's loads, so this one undercounts)
        steps = most_steps_at_once(harness.instance, [run.run_id for run in done])
        assert steps == 2, f"steps of the source at once: {steps} (pool of 2, four worker slots)"
        assert 1 <= reads.most <= 2, f"reads of the source at once: {reads.most} (pool of 2)"
        assert {run.tags["dagster/partition"] for run in done} == set(DAYS)
        workers = {name for run in done for ran in step_workers(harness.instance, run.run_id).values() for name in ran}
        assert {name.split("@")[0] for name in workers} == {w.name for w in deployment.workers}

    harness.assert_target_equals_source("orders", "orders", "id")
    harness.assert_target_equals_source("payments", "payments", "id")


ROWS = 16_000


def _events_stream(harness: StreamHarness) -> None:
    """A 16,000-row table read in 1,000-row slices into the PostgreSQL destination: a step long enough to kill."""
    harness.source.execute(
        f"""CREATE TABLE events (id bigint PRIMARY KEY, body text, updated_at timestamptz NOT NULL);
        INSERT INTO events SELECT g, repeat('e', g % 40), timestamptz '2024-03-01 00:00:00+00' + g * interval '1 ms'
        FROM generate_series(1, {ROWS}) g;"""
    )
    spec = {"table": "events", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1_000}
    harness.write_catalog({"events": spec}, destination="postgres")


def test_a_worker_killed_mid_step_hands_the_step_to_the_other_worker(harness: StreamHarness, tmp_path: Path) -> None:
    _events_stream(harness)
    with celery_deployment(tmp_path / "celery") as deployment:
        # Redis hands a dead worker's unacknowledged step out again after the visibility timeout
        with_execution(harness.settings.catalog_path, deployment.execution(visibility_timeout_seconds=60))
        for _ in range(2):
            deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deployment.wait_ready()
        process = harness.materialize_cli("events")
        step = f"{harness.source_name}__events"
        deadline = time.monotonic() + 240
        while harness.observations("events") < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        run = harness.instance.get_runs(limit=1)[0]
        first = step_workers(harness.instance, run.run_id)[step][0].split("@")[0]
        victim = next(w for w in deployment.workers if w.name == first)
        victim.kill()
        before = harness.checkpoint("events")
        assert before is not None and before.details["complete"] is False, "the step ended before the kill"

        harness.wait_ok(process, timeout=600)
        ran = [name.split("@")[0] for name in step_workers(harness.instance, run.run_id)[step]]
        survivor = next(w.name for w in deployment.workers if w is not victim)
        assert ran == [victim.name, survivor], ran
        assert harness.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS  # type: ignore[union-attr]

    materialization = harness.instance.get_latest_materialization_event(harness.key("events"))
    assert materialization is not None and materialization.asset_materialization is not None
    read = int(materialization.asset_materialization.metadata["rows read"].value)  # type: ignore[arg-type]
    assert read < ROWS, f"the retry read {read} rows: it should resume from the killed attempt's checkpoint"
    harness.assert_target_equals_source("events", "events", "id")


def test_a_run_terminated_after_its_worker_was_killed_ends_and_frees_the_slot(
    harness: StreamHarness, tmp_path: Path
) -> None:
    """The worker running the step SIGKILLed, then the run terminated: the run waited for the step until the
    broker would hand it out again (the visibility timeout, an hour by default) and kept its pool slot. The
    run now asks the step's worker, which does not answer, gives the step up and ends; the worker that takes
    the step later refuses it."""
    _events_stream(harness)
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.settings.catalog_path, deployment.execution(visibility_timeout_seconds=20))
        victim = deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deployment.wait_ready()
        process = harness.materialize_cli("events")
        try:
            deadline = time.monotonic() + 240
            while harness.observations("events") < 2 and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            victim.kill()
            run = harness.instance.get_runs(limit=1)[0]
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)  # a guard only: before the fix it waited for the step for ever
        finally:
            if process.poll() is None:
                process.kill()
        ended = harness.instance.get_run_by_id(run.run_id)
        assert ended is not None and ended.status == dg.DagsterRunStatus.CANCELED, ended
        assert run.run_id not in harness.instance.event_log_storage.get_concurrency_run_ids()

        later = deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deadline = time.monotonic() + 120  # the broker hands the step out again after the visibility timeout
        while "not executed by Celery worker" not in later.log():
            assert time.monotonic() < deadline, later.log()[-3000:]
            time.sleep(0.2)
    ran = step_workers(harness.instance, run.run_id)[f"{harness.source_name}__events"]
    assert [name.split("@")[0] for name in ran] == [victim.name]  # the later worker never ran it
