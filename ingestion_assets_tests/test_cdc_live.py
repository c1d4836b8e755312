"""Live CDC runs (`cdc.live_seconds`): one replication session held for the run, every batch loaded,
checkpointed and then acknowledged on it; SIGTERM drains, SIGKILL resumes exactly from the last checkpoint."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingestion_assets.sources.postgres.cdc import parse_lsn, slot_health
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_streams import TABLE, _assert_exact, cdc  # noqa: F401 - the fixture


def _live_catalog(harness: StreamHarness, seconds: float | None) -> None:
    """seconds None: an ordinary run, which reads until it has caught up."""
    live = {"live_seconds": seconds, "batch_seconds": 0.3} if seconds is not None else {}
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id"}},
        mode="cdc",
        cdc={"max_changes": 500, "max_batches_per_run": 500, "retries": {"max_attempts": 1}, **live},
    )


def _writer(harness: StreamHarness, stop: threading.Event) -> None:
    rng = random.Random(7)
    with harness.source.connect() as conn, conn.cursor() as cur:
        conn.autocommit = True
        next_id = 10_000
        while not stop.is_set():
            key = rng.randint(1, 3000)
            if rng.random() < 0.7:
                cur.execute("UPDATE orders SET status = %s, amount = amount + 1 WHERE id = %s", (f"s{key}", key))
            elif rng.random() < 0.5:
                cur.execute("DELETE FROM orders WHERE id = %s", (key,))
            else:
                next_id += 1
                cur.execute("INSERT INTO orders (id, status, amount) VALUES (%s, 'live', 1)", (next_id,))
            time.sleep(0.002)


@pytest.fixture
def writing(cdc: StreamHarness) -> Iterator[tuple[StreamHarness, threading.Event]]:  # noqa: F811
    cdc.source.execute(TABLE)
    stop = threading.Event()
    try:
        yield cdc, stop
    finally:
        stop.set()


def _wait_for_checkpoints(harness: StreamHarness, more_than: int, process: Any, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = harness.observations("orders")
        if count > more_than:
            return count
        assert process.poll() is None, harness.log_text(process)[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"no checkpoint beyond {more_than} within {timeout} s")


def _start_writer(stop: threading.Event, harness: StreamHarness) -> threading.Thread:
    thread = threading.Thread(target=_writer, args=(harness, stop), daemon=True)
    thread.start()
    return thread


def test_a_live_run_checkpoints_each_batch_and_drains_on_sigterm(writing: Any) -> None:
    harness, stop = writing
    _live_catalog(harness, seconds=600)
    process = harness.materialize_cli("orders")
    writer = _start_writer(stop, harness)
    seen = _wait_for_checkpoints(harness, 0, process)  # the snapshot's
    _wait_for_checkpoints(harness, seen + 2, process)  # batches applied while the run stays up
    stop.set()
    writer.join()
    time.sleep(1.5)  # the last changes reach the run; the drain must still apply whatever it holds
    signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)  # what a supervisor does: the whole process group
    process.wait(timeout=120)  # Dagster reports an interrupted run (rc 1) after the step drained
    assert time.monotonic() - signalled < 60  # drain_seconds: the watchdog did not have to kill it
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.position is not None
    messages = [record.message for record in harness.instance.all_logs(checkpoint.run_id)]
    assert any("finishing the slice in flight" in m for m in messages)
    health = slot_health(harness.source.url, f"ingest_{harness.source_name}")
    assert health.confirmed_flush_lsn is not None
    assert health.confirmed_flush_lsn <= parse_lsn(checkpoint.position["lsn"])  # acknowledged behind it only
    _live_catalog(harness, seconds=None)
    harness.materialize()  # whatever came after the drained batch
    _assert_exact(harness)


def test_a_sigkill_mid_live_run_resumes_and_the_target_equals_the_source(writing: Any) -> None:
    harness, stop = writing
    _live_catalog(harness, seconds=600)
    process = harness.materialize_cli("orders")
    writer = _start_writer(stop, harness)
    seen = _wait_for_checkpoints(harness, 0, process)
    _wait_for_checkpoints(harness, seen + 3, process)
    os.killpg(process.pid, signal.SIGKILL)  # mid-run: batches in flight, a load perhaps half done
    assert process.wait(timeout=60) != 0
    time.sleep(1)
    stop.set()
    writer.join()
    _live_catalog(harness, seconds=None)
    harness.materialize()  # resumes from the last stored checkpoint; the merge absorbs the replay
    _assert_exact(harness)


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_live_step_whose_run_process_was_killed_drains_and_ends(writing: Any) -> None:
    """Dagster's multiprocess executor leaves a step process running when its run process is SIGKILLed (found by
    a README-only attacker: the live step streamed on for its whole lifetime, holding the slot, then hung)."""
    harness, stop = writing
    _live_catalog(harness, seconds=600)
    process = harness.materialize_cli("orders")
    writer = _start_writer(stop, harness)
    seen = _wait_for_checkpoints(harness, 0, process)
    _wait_for_checkpoints(harness, seen + 2, process)
    steps = _descendants(process.pid)
    assert steps, "no step process under the run process"
    os.kill(process.pid, signal.SIGKILL)  # the run process alone, as an OOM killer or a lost container would
    process.wait(timeout=60)
    deadline = time.monotonic() + 90
    while any(_running(pid) for pid in steps) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_running(pid) for pid in steps), "the orphaned step process is still running"
    health = slot_health(harness.source.url, f"ingest_{harness.source_name}")
    assert not health.active  # the slot is free for the next run
    stop.set()
    writer.join()
    _live_catalog(harness, seconds=None)
    harness.materialize()
    _assert_exact(harness)


def test_the_sensor_keeps_one_live_run_up(cdc: StreamHarness) -> None:  # noqa: F811
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.cdc import build_cdc_assets

    harness = cdc
    harness.source.execute(TABLE)
    _live_catalog(harness, seconds=60)
    sensor = build_cdc_assets(harness.settings, load_catalog(harness.catalog_path))[1][0]
    request = sensor(dg.build_sensor_context(instance=harness.instance))
    assert isinstance(request, dg.RunRequest)  # no run yet, no slot yet: the first live run is asked for
    job = sensor.job_name
    run = harness.instance.create_run_for_job(
        dg.JobDefinition(name=job, graph_def=dg.GraphDefinition(name=job)), status=dg.DagsterRunStatus.STARTED
    )
    skip = sensor(dg.build_sensor_context(instance=harness.instance))
    assert isinstance(skip, dg.SkipReason) and run.run_id in str(skip.skip_message)


def test_a_second_live_run_fails_at_once_naming_the_run_that_holds_the_slot(writing: Any) -> None:
    """It waited silently for up to cdc.lock_wait_seconds (900 s) while the first run held the slot for its
    live_seconds, then was retried to wait again. Then (found by a README-only attack) the refused run left the
    stream `failed` in `ingest status` while the first run went on, until a later materialization."""
    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.observe.status import stream_statuses

    harness, _stop = writing
    _live_catalog(harness, seconds=600)
    process = harness.materialize_cli("orders")
    try:
        _wait_for_checkpoints(harness, 0, process)
        checkpoint = harness.checkpoint("orders")
        assert checkpoint is not None
        harness.write_catalog(
            {"orders": {"table": "orders", "primary_key": "id"}},
            mode="cdc",
            cdc={"live_seconds": 600, "lock_wait_seconds": 20, "retries": {"max_attempts": 3, "delay_seconds": 1}},
        )
        result = harness.materialize(raise_on_error=False)
        assert not result.success
        failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert len(failures) == 1 and not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
        message = str(failures[0].step_failure_data.error)
        assert f"is held by Dagster run {checkpoint.run_id} (a live run)" in message
        assert "is not retried" in message and "Stopping a run" in message
        (line,) = stream_statuses(harness.settings, load_catalog(harness.catalog_path), harness.instance)
        assert line.status == "running" and line.refused_run and "(a live run)" in line.refused_run, line
        assert process.poll() is None  # the first run goes on
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=120)
