"""Graceful drain: on SIGTERM or SIGINT finish the slice in flight, checkpoint it, read no more.

A watchdog SIGKILLs the process if the slice has not finished by the deadline; that is still safe
(the checkpoint only ever trails committed data), just slower to resume.

A step process whose run process died (SIGKILLed: Dagster's multiprocess executor leaves its step processes
running) drains the same way: nobody waits for it any more, and a live CDC run would otherwise go on streaming
for its whole lifetime, holding the slot a new run needs, then hang writing to its dead parent. The watchdog
then stays armed past the step's end, so the process is gone by the deadline whatever it waits on.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PARENT_POLL_SECONDS = 1.0


class Drain:
    def __init__(self, deadline_seconds: float, log: logging.Logger | Any | None = None) -> None:
        self.deadline_seconds = deadline_seconds
        self._log = log
        self._signal: int | None = None
        self._since: float | None = None
        self._previous: dict[int, Any] = {}
        self._watchdog: threading.Timer | None = None
        self._announced = False
        self._orphaned = False  # the process that started this one is gone
        self._left = threading.Event()  # set when the drained block ends

    @property
    def requested(self) -> bool:
        return self._signal is not None

    def __call__(self) -> bool:
        """Asked between slices (main thread): says so once, outside the signal handler."""
        if self._signal is not None and not self._announced:
            self._announced = True
            if self._log is not None:
                self._log.warning(
                    "%s: finishing the slice in flight (committed and checkpointed), then stopping (deadline %.0fs)",
                    self._cause(),
                    self.deadline_seconds,
                )
        return self.requested

    def describe(self) -> str:
        waited = time.monotonic() - self._since if self._since is not None else 0.0
        said = self._cause() if self._orphaned else f"{self._cause()} received"
        return f"{said} {waited:.1f}s ago"

    def _cause(self) -> str:
        if self._orphaned:
            return "the run process that started this step died"
        return signal.Signals(self._signal).name if self._signal is not None else "no signal"

    def __enter__(self) -> Drain:
        if threading.current_thread() is threading.main_thread():  # handlers can only live there
            for number in DRAIN_SIGNALS:
                self._previous[number] = signal.signal(number, self._on_signal)
        threading.Thread(target=self._watch_parent, args=(os.getppid(),), name="drain-parent", daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._left.set()
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        if self._watchdog is not None and not self._orphaned:  # an orphan is gone by the deadline, done or not
            self._watchdog.cancel()

    def _watch_parent(self, parent: int) -> None:
        while not self._left.wait(PARENT_POLL_SECONDS):
            if os.getppid() != parent:  # re-parented: the process that started this one is gone
                self._orphaned = True
                self._on_signal(signal.SIGTERM, None)
                return

    def _on_signal(self, number: int, _frame: FrameType | None) -> None:
        """Only flags and arms the watchdog: the main thread may be inside a database call that logging from
        here would re-enter (seen in CI: the drain then lost its message and raced the slice's commit)."""
        if self._signal is not None:
            return  # a second signal changes nothing: the deadline is already running
        self._signal, self._since = number, time.monotonic()
        self._watchdog = threading.Timer(self.deadline_seconds, _kill_self)
        self._watchdog.daemon = True
        self._watchdog.start()


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
