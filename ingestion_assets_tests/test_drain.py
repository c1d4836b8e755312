"""SIGTERM during a large slice: finish it, checkpoint it, exit within the deadline."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ingestion_assets_tests.helpers import StreamHarness

ROWS = 600_000
SLICE = 75_000
WIDE = f"""
CREATE TABLE wide (id bigint PRIMARY KEY, a text, b text, c numeric(20,4), updated_at timestamptz NOT NULL);
INSERT INTO wide SELECT g, md5(g::text), repeat(md5(g::text), 4), g / 7.0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 ms'
FROM generate_series(1, {ROWS}) g;
"""


def test_sigterm_commits_the_slice_in_flight_and_exits_within_the_deadline(harness: StreamHarness) -> None:
    harness.source.execute(WIDE)
    harness.write_catalog(
        {
            "wide": {
                "table": "wide",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": SLICE,
                "drain_seconds": 60,
                "retries": {"max_attempts": 1},
            }
        }
    )
    process = harness.materialize_cli("wide")
    deadline = time.monotonic() + 180
    while harness.observations("wide") < 1 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the run finished before the signal: nothing was tested"
    in_flight = harness.observations("wide")  # slices 0..in_flight-1 are committed; this one is being read
    signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)  # what a supervisor does: the whole process group
    code = process.wait(timeout=90)
    exited_after = time.monotonic() - signalled

    assert code != 0 and exited_after < 60
    checkpoint = harness.checkpoint("wide")
    assert checkpoint is not None and checkpoint.details["complete"] is False
    # the slice in flight when the signal landed is committed, and no further one is read. The count is taken
    # just after a checkpoint is stored: the signal may land before the run's next stop check (it then stops
    # after slice in_flight - 1), during slice in_flight, or after one more commit (in_flight + 1).
    story = "\n".join(
        f"{e.dagster_event_type or ''} {e.message[:200]} {_error(e)}"
        for e in harness.instance.all_logs(checkpoint.run_id)
    )
    assert checkpoint.details["slice"] in (in_flight - 1, in_flight, in_flight + 1), (
        f"in flight {in_flight}; the run:\n{story}"
    )
    committed = (checkpoint.details["slice"] + 1) * SLICE
    assert committed < ROWS, "the drain should stop the read, not finish it"
    assert checkpoint.position is not None and int(checkpoint.position["id"]) == committed
    # the slice in flight was committed and checkpointed: the target holds exactly what the checkpoint says
    assert harness.target_count("wide") == committed
    messages = [record.message for record in harness.instance.all_logs(checkpoint.run_id)]
    assert any("finishing the slice in flight" in m for m in messages)

    harness.materialize()
    assert harness.assert_target_equals_source("wide", "wide", "id") == ROWS


def _error(entry: Any) -> str:
    data = getattr(entry.dagster_event, "event_specific_data", None)
    error = getattr(data, "error", None)
    return error.to_string()[-1500:] if error is not None else ""
