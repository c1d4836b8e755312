"""Progress of long CLI work (demo seeding, first loads, backfills) with `rich`, only on a terminal: scripts,
CI logs and pipes get the plain lines they always got."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

_SLICE = re.compile(r"slice (\d+): (\d+) rows committed")
_TAIL_BYTES = 16384


def on_terminal() -> bool:
    return sys.stdout.isatty()


def _bar() -> Progress:
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(), transient=True
    )


@contextlib.contextmanager
def working(title: str) -> Iterator[None]:
    """A spinner with the time elapsed while a single long step runs (one SQL statement, say)."""
    if not on_terminal():
        yield
        return
    with _bar() as bar:
        bar.add_task(title)
        yield


def wait_for(process: subprocess.Popen[bytes], title: str, log_file: Path) -> int:
    """Wait for `process`; on a terminal, show the slices it committed so far, read from its log."""
    if not on_terminal():
        return process.wait()
    with _bar() as bar:
        task = bar.add_task(title)
        while process.poll() is None:
            bar.update(task, description=f"{title}{_latest_slice(log_file)}")
            time.sleep(0.5)
    return process.returncode


def _latest_slice(log_file: Path) -> str:
    """`: slice N committed (R rows)` of the newest slice line in the log, or nothing yet."""
    try:
        with log_file.open("rb") as handle:
            handle.seek(max(0, log_file.stat().st_size - _TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    found = _SLICE.findall(tail)
    if not found:
        return ""
    index, rows = found[-1]
    return f": slice {int(index) + 1} committed ({int(rows):,} rows)"
