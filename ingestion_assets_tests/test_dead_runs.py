"""A run's process that is dead but not yet gone (a zombie, or one SIGKILL was sent to) holds no pool slot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.state.runs import _alive, release_dead_runs
from ingestion_assets_tests.helpers import StreamHarness


def test_a_zombie_and_a_killed_process_are_not_alive() -> None:
    """Found by CI: a run SIGKILLed with its group left a step process that the next run's check still saw
    alive, so the check kept the slot held and the next run waited for it for ever."""
    since = time.time()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.05)
    assert state == "Z"  # exited, not reaped: the pid still answers kill(0)
    assert not _alive(child.pid, since)
    child.wait()

    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _alive(stopped.pid, since)
        stopped.send_signal(signal.SIGSTOP)
        stopped.send_signal(signal.SIGKILL)  # pending until the process is scheduled again
        assert not _alive(stopped.pid, since)
    finally:
        stopped.kill()
        stopped.wait()


KILLS_ITSELF = """
import os
import signal

import dagster as dg


@dg.asset
def kills_its_run() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


defs = dg.Definitions(assets=[kills_its_run], executor=dg.in_process_executor)
"""


def test_a_run_killed_without_a_pool_slot_is_failed_not_left_started(tmp_path: Path) -> None:
    """Found by a user: a run SIGKILLed after its step had freed its slot (or of an asset without a pool) stayed
    STARTED for ever, so `ingest status` showed its stream running; only runs holding a slot were looked at."""
    (tmp_path / "kills_itself.py").write_text(KILLS_ITSELF)
    home = tmp_path / "dagster"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(tmp_path)}
    dagster = str(Path(sys.executable).with_name("dagster"))
    killed = subprocess.run(
        [dagster, "asset", "materialize", "-m", "kills_itself", "--select", "kills_its_run"],
        env=env, cwd=tmp_path, capture_output=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.STARTED  # what Dagster leaves behind
        release_dead_runs(instance)
        after = instance.get_run_by_id(run.run_id)
        assert after is not None and after.status == dg.DagsterRunStatus.FAILURE


def test_a_first_run_killed_midway_shows_as_failed_in_status_not_never_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a README-only attack: a first run SIGKILLed (its whole process group) after some slices showed
    `last run: never` in `ingest status`; it says now when that run started, that it failed and why."""
    harness.source.execute(
        "CREATE TABLE big (id int PRIMARY KEY, updated_at timestamptz NOT NULL);"
        "INSERT INTO big SELECT g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(1, 300000) g"
    )
    spec = {"table": "big", "primary_key": "id", "cursor": "updated_at", "slice_rows": 500}
    harness.write_catalog({"big": spec})
    process = harness.materialize_cli("big")
    deadline = time.monotonic() + 240
    while harness.checkpoint("big") is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before a slice was checkpointed: make the table larger"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["status"]) == 1
    said = capsys.readouterr()
    line = next(line for line in said.out.splitlines() if line.startswith(f"{harness.source_name}.big"))
    assert " failed " in line and "never" not in line and " ago " in line, line
    assert "are gone (killed or crashed)" in said.err, said.err
