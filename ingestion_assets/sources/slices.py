"""A slice: the unit a stream loads and checkpoints (rows, and the position after its last row)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class Slice:
    table: Any  # an Arrow table (database sources) or a list of records (API sources)
    position: dict[str, Any] | None  # the checkpoint once this slice and all before it are committed (None: start)
    index: int  # 0-based within the run

    @property
    def rows(self) -> int:
        return int(self.table.num_rows) if isinstance(self.table, pa.Table) else len(self.table)


def rechunk(batches: Iterable[pa.RecordBatch], rows_per_table: int) -> Iterator[pa.Table]:
    """Regroup record batches into tables of exactly `rows_per_table` rows (the last may be short)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows_per_table - held, batch.num_rows)
            pending.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if held == rows_per_table:
                yield pa.Table.from_batches(pending)
                pending, held = [], 0
    if held:
        yield pa.Table.from_batches(pending)


_DONE = object()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


def prefetched(
    items: Iterator[Any], depth: int = 1, meanwhile: Callable[[], None] | None = None
) -> Generator[Any, None, None]:
    """Advance `items` in a thread, up to `depth` items ahead, so reading overlaps loading.

    The iterator is advanced and closed only in its own thread; stopping early closes it there. `meanwhile`
    runs in the caller's thread once the reading has begun, before the first item is handed over.
    """
    handoff: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not offer(item):
                    break
            else:
                offer(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            offer(_Failure(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=pump, name="prefetch", daemon=True)
    worker.start()
    try:
        if meanwhile is not None:
            meanwhile()
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        worker.join()
