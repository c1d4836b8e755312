"""Kill and fail a run at every step of the checkpoint protocol; the next run makes the target exact."""

from __future__ import annotations

import os
import shutil
import signal
import time

import dagster as dg
import pytest

from ingestion_assets.sync import FAULT_ENV, FAULT_ONCE_ENV
from ingestion_assets_tests.helpers import StreamHarness

ROWS = 12_000
SLICE = 1_000
EVENTS = f"""
CREATE TABLE events (
    id bigint PRIMARY KEY, kind text NOT NULL, body text, updated_at timestamptz NOT NULL
);
INSERT INTO events
SELECT g, 'k' || g % 5, repeat('x', g % 50), timestamptz '2024-03-01 00:00:00+00' + (g / 3) * interval '1 ms'
FROM generate_series(1, {ROWS}) g;
"""


def _prepare(harness: StreamHarness, slice_rows: int = SLICE, attempts: int = 1) -> None:
    """`attempts` 1: no step retries, so what a test sees is one run's doing."""
    harness.source.execute(EVENTS)
    harness.write_catalog(
        {
            "events": {
                "table": "events",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": slice_rows,
                "retries": {"max_attempts": attempts, "delay_seconds": 0.2},
            }
        }
    )


def _rows_read(harness: StreamHarness, result: object) -> int:
    node = f"{harness.source_name}__events"
    return int(result.asset_materializations_for_node(node)[0].metadata["rows read"].value)  # type: ignore[attr-defined]


def test_sigkill_after_some_slices_resumes_from_the_last_checkpoint(harness: StreamHarness) -> None:
    _prepare(harness)
    process = harness.materialize_cli("events", **{FAULT_ENV: "after_checkpoint:2:kill"})
    assert process.wait(timeout=180) != 0
    checkpoint = harness.checkpoint("events")
    assert checkpoint is not None and checkpoint.details["slice"] == 2
    assert checkpoint.position == {"updated_at": "2024-03-01T00:00:01+00:00", "id": "3000"}

    # a write between the crash and the resume must arrive too
    harness.source.execute("UPDATE events SET body = 'changed', updated_at = now() WHERE id IN (10, 2500, 11000)")
    result = harness.materialize()
    assert _rows_read(harness, result) == ROWS - 3 * SLICE + 2  # resumed, not from zero (ids 10, 2500 re-read)
    harness.assert_target_equals_source("events", "events", "id")


def test_a_killed_step_is_retried_from_its_checkpoint_within_the_run(harness: StreamHarness) -> None:
    _prepare(harness, attempts=3)
    marker = harness.tmp_path / "fault-fired"
    process = harness.materialize_cli("events", **{FAULT_ENV: "after_checkpoint:4:kill", FAULT_ONCE_ENV: str(marker)})
    assert process.wait(timeout=240) == 0, "the retry should have finished the run"
    assert marker.exists()
    events = harness.instance.fetch_observations(harness.key("events"), limit=100).records
    slices = [e.asset_observation.metadata["ingest/checkpoint"].value.get("slice") for e in reversed(events)]
    # first attempt: slices 0..4 then killed; the retry resumes after slice 4: 7 more slices, then complete, then
    # the same once its check has run (no longer `unchecked_from`)
    assert slices == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, None, None]
    harness.assert_target_equals_source("events", "events", "id")


def test_sigkill_at_a_random_moment_loses_and_duplicates_nothing(harness: StreamHarness) -> None:
    _prepare(harness, slice_rows=400)
    process = harness.materialize_cli("events")
    deadline = time.monotonic() + 120
    while harness.observations("events") < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.137)  # somewhere inside a later slice: reading, loading or checkpointing
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    before = harness.checkpoint("events")
    assert before is not None and before.position is not None
    assert before.details["complete"] is False, "the kill came after the run finished: nothing was tested"

    harness.materialize()
    harness.assert_target_equals_source("events", "events", "id")


def test_a_killed_run_does_not_hold_its_pool_slot_for_ever(harness: StreamHarness) -> None:
    """Found by the chaos runs: SIGKILLed runs kept their slots of the source's pool, so once the pool was
    full every later run of the source waited for ever."""
    harness.source.execute(EVENTS)
    spec = {"table": "events", "primary_key": "id", "cursor": "updated_at", "slice_rows": 400}
    harness.write_catalog({"events": spec}, max_concurrency=1)
    process = harness.materialize_cli("events")
    deadline = time.monotonic() + 120
    while harness.observations("events") < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed = harness.instance.get_runs(limit=1)[0]
    assert killed.status == dg.DagsterRunStatus.STARTED, harness.log_text(process)[-3000:]
    assert killed.run_id in harness.instance.event_log_storage.get_concurrency_run_ids()

    harness.wait_ok(harness.materialize_cli("events"), timeout=240)  # before the fix: blocked for ever
    assert harness.instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
    harness.assert_target_equals_source("events", "events", "id")


def test_failure_after_the_first_load_of_an_initial_read_takes_the_merge_path(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The initial read appends into an empty target; a crash before its first checkpoint must not
    leave the next run appending over rows that are already there."""
    _prepare(harness)
    monkeypatch.setenv(FAULT_ENV, "after_load:0")
    assert not harness.materialize(raise_on_error=False).success
    failed = harness.checkpoint("events")
    assert failed is not None and failed.position is None  # the failure is noted; no position was reached
    assert failed.details["no_progress"]["attempts"] == 1 and "after_load of slice 0" in failed.details["last_error"]
    assert harness.target_count("events") == SLICE
    monkeypatch.delenv(FAULT_ENV)
    result = harness.materialize()
    assert _rows_read(harness, result) == ROWS
    harness.assert_target_equals_source("events", "events", "id")


@pytest.mark.parametrize("point", ["after_load", "before_load"])
def test_failure_between_load_and_checkpoint(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    _prepare(harness)
    monkeypatch.setenv(FAULT_ENV, f"{point}:1")
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    checkpoint = harness.checkpoint("events")
    assert checkpoint is not None  # slice 1 never checkpointed: the position is the end of slice 0
    assert checkpoint.position == {"updated_at": "2024-03-01T00:00:00.333000+00:00", "id": "1000"}
    assert checkpoint.details["no_progress"]["attempts"] == 0  # slice 0 did commit: the attempt made progress
    # after_load: slice 1 is in the target although not checkpointed; before_load: it is not
    assert harness.target_count("events") == (2 * SLICE if point == "after_load" else SLICE)

    monkeypatch.delenv(FAULT_ENV)
    result = harness.materialize()
    assert _rows_read(harness, result) == ROWS - SLICE  # slice 1 is read again
    harness.assert_target_equals_source("events", "events", "id")


def test_a_damaged_dlt_working_folder_never_blocks_the_stream(harness: StreamHarness) -> None:
    """A SIGKILL during dlt's set-up once left a folder without load/new and load/normalized: every later run
    failed. dlt's folder is disposable: the next process starts it afresh."""
    _prepare(harness, slice_rows=4000)
    harness.wait_ok(harness.materialize_cli("events"))
    folder = harness.settings.dlt_dir / f"ingest__{harness.source_name}__events"
    for part in ("load/new", "load/normalized", "load/loaded"):
        shutil.rmtree(folder / part, ignore_errors=True)
    (folder / "state.json").write_text("{ half written")
    harness.source.execute("UPDATE events SET body = 'after damage', updated_at = now() WHERE id % 1000 = 0")
    harness.wait_ok(harness.materialize_cli("events"))
    harness.assert_target_equals_source("events", "events", "id")


def test_rows_removed_by_hand_after_a_failed_run_that_loaded_slices_are_found_and_read_again(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that commits slices and then fails writes the target without materializing it: the next run compared
    the target with the last materialization's count, lower than what the failed run left, so rows then deleted
    from the target by hand (behind the checkpoint) went unnoticed and stayed missing (found with attack24's CDC
    finding: the same stale count)."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, 'v' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(1, 20) g"
    )
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 10}
    harness.write_catalog({"items": {**spec, "retries": {"max_attempts": 1}}})
    harness.materialize()  # 20 rows, the materialization says so
    harness.source.execute(
        "INSERT INTO items SELECT g, 'v' || g, timestamptz '2024-01-02 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(21, 60) g"
    )
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:2")  # slices committed, then the run fails
    assert not harness.materialize(raise_on_error=False).success
    monkeypatch.delenv(FAULT_ENV)
    loaded = harness.target_count("items")
    assert 20 < loaded < 60
    harness.execute_target(f'DELETE FROM "{harness.source_name}".items WHERE id <= 10')  # by hand, behind it
    assert harness.target_count("items") >= 20  # not below the last materialization's count
    harness.materialize()
    harness.assert_target_equals_source("items", "items", "id")
