"""Which process holds a process id: its start, so that an id reused by another process is told apart."""

from __future__ import annotations

import os
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (Linux /proc; None elsewhere or when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> float | None:
    """When the process started, in seconds since the epoch (Linux /proc; None elsewhere)."""
    ticks = start_ticks(pid)
    try:
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration):
        return None
    return None if ticks is None else int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
