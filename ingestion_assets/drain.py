"""Graceful drain: on SIGTERM or SIGINT finish the slice in flight, checkpoint it, read no more.

A watchdog SIGKILLs the process if the slice has not finished by the deadline; that is still safe
(the checkpoint only ever trails committed data), just slower to resume.
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


class Drain:
    def __init__(self, deadline_seconds: float, log: logging.Logger | Any | None = None) -> None:
        self.deadline_seconds = deadline_seconds
        self._log = log
        self._signal: int | None = None
        self._since: float | None = None
        self._previous: dict[int, Any] = {}
        self._watchdog: threading.Timer | None = None
        self._announced = False

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
                    signal.Signals(self._signal).name,
                    self.deadline_seconds,
                )
        return self.requested

    def describe(self) -> str:
        name = signal.Signals(self._signal).name if self._signal is not None else "no signal"
        waited = time.monotonic() - self._since if self._since is not None else 0.0
        return f"{name} received {waited:.1f}s ago"

    def __enter__(self) -> Drain:
        if threading.current_thread() is threading.main_thread():  # handlers can only live there
            for number in DRAIN_SIGNALS:
                self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        if self._watchdog is not None:
            self._watchdog.cancel()

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
