"""Pages fetched in a thread of their own into a bounded queue, so the request budget is spent while the
previous slice loads, and the loader can take every page that is waiting when it is free; the loads run
at a lower CPU priority meanwhile, so that their work does not delay the next request."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _Failure:
    error: BaseException


_DONE = object()


class ReadAhead(Generic[T]):
    """Advance `items` in a thread, up to `depth` items ahead of the consumer.

    `take(at_least, at_most)` blocks for `at_least` items (fewer only at the end), then adds whatever
    else is already waiting, up to `at_most`. The iterator is advanced and closed only in its own thread;
    `close()` stops it there. An error in the thread is raised by the `take` that reaches it, after the
    items read before it.
    """

    def __init__(self, items: Iterator[T], depth: int) -> None:
        self._queue: queue.Queue[tuple[float, object]] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._ended = False
        self._pending: object | None = None  # an end or a failure met after the items taken so far
        self._worker = threading.Thread(target=self._pump, args=(items,), name="read-ahead", daemon=True)
        self._worker.start()

    def take(self, at_least: int, at_most: int, gather: float = 0.0) -> list[T]:
        """With `gather` > 0, first wait until the queue is full, the read has ended or the oldest waiting item
        is `gather` seconds old: a consumer that holds off while the reader is ahead leaves it the cores."""
        if gather > 0:
            self._gather(gather)
        taken: list[T] = []
        while len(taken) < at_most and not self._ended:
            try:
                _, item = self._queue.get(block=len(taken) < at_least, timeout=None)
            except queue.Empty:
                break
            if item is _DONE or isinstance(item, _Failure):
                self._ended, self._pending = True, item
                break
            taken.append(item)  # type: ignore[arg-type]
        if not taken and isinstance(self._pending, _Failure):
            raise self._pending.error
        return taken

    def waiting(self) -> int:
        return self._queue.qsize()

    def _gather(self, seconds: float) -> None:
        while not self._ended and not self._queue.full() and self._worker.is_alive():
            with self._queue.mutex:
                oldest = self._queue.queue[0][0] if self._queue.queue else None
            if oldest is not None and time.monotonic() - oldest >= seconds:
                return
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        while self._worker.is_alive():  # unblock a pump waiting on a full queue
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
        self._worker.join()

    def _pump(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if not self._offer(item):
                    break
            else:
                self._offer(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._offer(_Failure(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _offer(self, item: object) -> bool:
        arrived = time.monotonic()
        while not self._stop.is_set():
            try:
                self._queue.put((arrived, item), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


class _ReaderFavour:
    """Process-wide settings held while at least one read runs (reads may overlap in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads = 0
        self._interval = 0.005

    def enter(self, switch_interval: float) -> None:
        with self._lock:
            if self._reads == 0:
                self._interval = sys.getswitchinterval()
                gc.freeze()
                sys.setswitchinterval(min(self._interval, switch_interval))
            self._reads += 1

    def leave(self) -> None:
        with self._lock:
            self._reads -= 1
            if self._reads == 0:
                sys.setswitchinterval(self._interval)
                gc.unfreeze()


_FAVOUR = _ReaderFavour()


@contextlib.contextmanager
def favour_the_reader(switch_interval: float = 0.001) -> Iterator[None]:
    """While a read runs, keep the loader's Python work from stalling the page reader thread.

    - The heap alive before the read (modules, dlt's pipeline and schema: ~150k objects) is exempt from
      garbage collection: the loader collects fully after each slice to free the slice's cycles, and a
      full collection over all of that holds the GIL for 0.1-0.2 s; over what the read created, well
      under a millisecond.
    - The interpreter's switch interval drops from 5 ms to 1 ms: a response that arrives while the loader
      normalizes waits that long for the GIL before the next request can go out.

    Both are process-wide, held while any read runs and restored when the last one ends."""
    _FAVOUR.enter(switch_interval)
    try:
        yield
    finally:
        _FAVOUR.leave()


class BackgroundLoads:
    """Runs each load, one at a time, in a thread of its own with a higher nice value than the page reader.

    On a busy machine the loader's CPU work (dlt's normalize, about a core while slices queue up) and the
    page reader wait for the same cores: each answer then waits to be read, and each next request to be
    sent, behind it. Measured at 50 ms latency on 2 shared cores, that was 9-10 ms a request; with the
    loads at nice 10, 5-7 ms. Linux keeps a nice value per thread, so only the loads are lowered, and
    only while the thread lives: it ends with the read (`close`). `run` blocks until the load is done, so
    the caller's order (load, then checkpoint) is unchanged. Elsewhere the loads run at the same priority.
    """

    def __init__(self, niceness: int = 10) -> None:
        self._niceness = niceness
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load", initializer=self._lower)

    def run(self, load: Callable[[], R]) -> R:
        return self._worker.submit(load).result()

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BackgroundLoads:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _lower(self) -> None:
        if not sys.platform.startswith("linux"):  # elsewhere the nice value is the whole process's
            return
        try:
            os.setpriority(
                os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + self._niceness
            )
        except OSError as exc:  # a sandbox that forbids it: the loads keep the reader's priority
            logger.debug("could not lower the loads' CPU priority: %s", exc)
