"""A run's process that is dead but not yet gone (a zombie, or one SIGKILL was sent to) holds no pool slot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from ingestion_assets.state.runs import _alive, release_dead_runs


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
