"""The checkpoint protocol: load a slice, wait for the commit, then record the position. Nothing else.

This module knows no source, destination or Dagster: the simulation harness and the assets drive the
same loop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingestion_assets.sources.slices import Slice, prefetched

FAULT_ENV = "INGEST_FAULT"
FAULT_ONCE_ENV = "INGEST_FAULT_ONCE"  # a marker file: the fault fires only while it does not exist
FAULT_POINTS = (
    "before_load",
    "after_load",
    "after_checkpoint",
    "before_migration",
    "after_migration",
    "before_swap",
    "after_swap",
    "after_snapshot_slice",  # cdc: a slice of the first copy is loaded, the copy is not complete
    "after_partition_load",  # a polled table: a slice of a partition attached since the last run is loaded
    "before_check",  # a polled table: the run's final checkpoint is stored, its reconciliation not yet run
)
UNSAFE_ORDER_ENV = "INGEST_UNSAFE_CHECKPOINT_FIRST"  # test-only: the broken protocol the simulation must catch


def checkpoint_first() -> bool:
    """The deliberately broken order (checkpoint before the load commits), switched on by tests only."""
    return os.environ.get(UNSAFE_ORDER_ENV) == "1"


class CheckpointSink(Protocol):
    def commit(self, position: dict[str, Any] | None, slice_index: int, rows: int) -> None: ...


class InjectedFault(RuntimeError):
    """Raised at a fault point chosen by INGEST_FAULT (tests and chaos runs only); it stands for a crash."""

    transient = True


@dataclass(frozen=True)
class Faults:
    """`INGEST_FAULT=point:slice[:kill]` fails (or SIGKILLs the process) at a protocol step.

    With `INGEST_FAULT_ONCE=<file>` it fires once (and creates the file), so a retry then succeeds.
    """

    point: str | None = None
    at_slice: int = 0
    kill: bool = False
    once_marker: str | None = None

    @classmethod
    def from_env(cls) -> Faults:
        spec = os.environ.get(FAULT_ENV, "")
        if not spec:
            return cls()
        parts = spec.split(":")
        if parts[0] not in FAULT_POINTS or len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"{FAULT_ENV}={spec!r}: expected one of {FAULT_POINTS} ':' slice [':kill']")
        return cls(
            point=parts[0],
            at_slice=int(parts[1]),
            kill=parts[2:] == ["kill"],
            once_marker=os.environ.get(FAULT_ONCE_ENV) or None,
        )

    def hit(self, point: str, slice_index: int) -> None:
        if point != self.point or slice_index != self.at_slice:
            return
        if self.once_marker is not None:
            if os.path.exists(self.once_marker):
                return
            with open(self.once_marker, "w") as marker:
                marker.write(f"{point}:{slice_index}")
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {point} of slice {slice_index}")


@dataclass
class SyncResult:
    started_from: dict[str, Any] | None
    position: dict[str, Any] | None
    rows: int = 0
    slices: int = 0
    seconds: float = 0.0
    slice_seconds: list[float] = field(default_factory=list)
    stopped: bool = False  # a drain ended the read early, after a committed slice
    loaded: int = 0  # rows written (read minus dead letters minus versions the target already had newer)
    dead_letters: int = 0
    nulled: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # what the stream keeps in its final checkpoint
    note: str | None = None  # what the run should tell the user (log and metadata)
    partitions_moved: str | None = None  # a polled table's partitions attached, created, detached or dropped
    compare_whole: str | None = None  # why the run's check compares the whole table (rows may lie behind its cursor)
    figures: dict[str, Any] = field(default_factory=dict)  # the run's own counters for its metadata (HTTP), not kept

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class SliceOutcome:
    loaded: int
    dead_letters: int = 0
    nulled: int = 0


def run_slices(
    slices: Iterable[Slice],
    load: Callable[[Slice], SliceOutcome | None],
    sink: CheckpointSink,
    started_from: dict[str, Any] | None,
    faults: Faults | None = None,
    log: logging.Logger | None = None,
    stop: Callable[[], bool] | None = None,
    after_commit: Callable[[SyncResult], None] | None = None,
    read_ahead: int = 1,
    prepare: Callable[[], None] | None = None,
) -> SyncResult:
    """Load each slice, then checkpoint it. A crash anywhere costs at most the slice in flight.

    `stop` is asked after every checkpoint: a drain finishes the slice in flight, then reads no more.
    `after_commit` may stop the run by raising (a dead-letter threshold): the slice is already safe.
    `prepare` runs before the first slice loads, while it is read (the target's table made meanwhile).
    """
    faults = faults or Faults()
    unsafe = checkpoint_first()
    result = SyncResult(started_from=started_from, position=started_from)
    began = time.monotonic()
    if prepare is not None and not read_ahead:
        prepare()
    for piece in prefetched(iter(slices), meanwhile=prepare) if read_ahead else iter(slices):
        slice_began = time.monotonic()
        if unsafe:  # never in production: checkpoint first, so a crash in the load loses the slice
            sink.commit(piece.position, piece.index, piece.rows)
        faults.hit("before_load", piece.index)
        outcome = load(piece) or SliceOutcome(loaded=piece.rows)  # returns once the destination committed
        faults.hit("after_load", piece.index)
        if not unsafe:
            sink.commit(piece.position, piece.index, piece.rows)
        faults.hit("after_checkpoint", piece.index)
        result.position = piece.position
        result.rows += piece.rows
        result.slices += 1
        result.loaded += outcome.loaded
        result.dead_letters += outcome.dead_letters
        result.nulled += outcome.nulled
        result.slice_seconds.append(time.monotonic() - slice_began)
        if log is not None:
            parked = f"; {outcome.dead_letters} parked in _ingest_dead_letter" if outcome.dead_letters else ""
            log.info("slice %d: %d rows committed, checkpoint %s%s", piece.index, piece.rows, piece.position, parked)
        if after_commit is not None:
            after_commit(result)
        if stop is not None and stop():
            result.stopped = True
            break
    result.seconds = time.monotonic() - began
    return result
