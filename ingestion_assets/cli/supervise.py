"""Run a long-lived command (`dagster dev`) so that stopping `ingest` stops every process it started.

The command runs in a session of its own; SIGTERM, SIGINT (Ctrl-C) or SIGHUP to `ingest` is passed on
to it as SIGTERM, and whatever of its process tree is still alive after `grace` seconds is killed. The
tree is found by session id and by parent links (Linux /proc), so children re-parented to pid 1 after
their parent died are found too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL = 0.2


def run_supervised(
    command: Sequence[str], env: Mapping[str, str], grace: float = 15.0, cwd: Path | None = None
) -> int:
    """Run `command` until it exits or `ingest` is told to stop; returns its exit status (128 + signal
    when stopped). No process of its tree outlives this call."""
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    process = subprocess.Popen(list(command), env=dict(env), start_new_session=True, cwd=cwd)
    try:
        while process.poll() is None and not received:
            time.sleep(_POLL)
        if not received:
            return process.returncode
        name = signal.Signals(received[0]).name
        print(f"\n{name}: stopping {Path(command[0]).name} and its processes (up to {grace:.0f}s)", file=sys.stderr)
        stop_tree(process.pid, grace, hurry=lambda: len(received) > 1)
        process.wait()
        return 128 + received[0]
    finally:
        if process.poll() is not None:  # it exited (by itself, or stopped): what it left in its session goes too
            for member in session_members(process.pid):
                _send(member, signal.SIGKILL)
        for each, handler in previous.items():
            signal.signal(each, handler)


def stop_tree(root: int, grace: float, hurry: Callable[[], bool] | None = None) -> None:
    """SIGTERM `root`, wait up to `grace` seconds for its whole tree to end, then SIGKILL what is left.
    `hurry()` true (a second Ctrl-C) skips the rest of the wait."""
    members = tree(root)
    _send(root, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not (hurry is not None and hurry()):
        members |= tree(root)
        if not any(_alive(m) for m in members):
            return
        time.sleep(_POLL)
    for member in members | tree(root):
        _send(member, signal.SIGKILL)


def tree(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of `root` and every process in its session or below it, now."""
    table = _processes()
    found = {pid for pid, (_, session, _) in table.items() if session == root}
    found.add(root)
    grew = True
    while grew:
        children = {pid for pid, (parent, _, _) in table.items() if parent in found and pid not in found}
        found |= children
        grew = bool(children)
    return {(pid, table[pid][2]) for pid in found if pid in table}


def session_members(session: int) -> set[tuple[int, int]]:
    """(pid, start time) of the processes still in `session` (its leader may be long gone)."""
    return {(pid, started) for pid, (_, sid, started) in _processes().items() if sid == session and pid != session}


def _processes() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, session id, start time in clock ticks) of every process."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        table[int(entry.name)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    return table


def _alive(member: tuple[int, int]) -> bool:
    pid, started = member
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return int(fields[19]) == started and fields[0] != "Z"  # the same process, not a zombie


def _send(member: int | tuple[int, int], signum: signal.Signals) -> None:
    """Signal a process if it is still the one we found (pids are reused)."""
    if isinstance(member, tuple):
        if not _alive(member):
            return
        member = member[0]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(member, signum)
