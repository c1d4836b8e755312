"""A run's process that is dead but not yet gone (a zombie, or one SIGKILL was sent to) holds no pool slot."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from ingestion_assets.state.runs import _alive


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
