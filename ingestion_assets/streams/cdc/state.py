"""One checkpoint per stream of a CDC source: its log position and details, whatever the catalog's order.

All streams of a source read one slot, but each keeps its own position: a stream that is new, reset or whose
target no longer holds what its checkpoint says has none and gets a copy; the others keep theirs. The slot is
read from the lowest position any stream holds, and a stream skips the transactions its own position is past.

A copy goes in key ranges, each checkpointed: while it is under way the stream holds a log position too
(it takes every change of the log after it, copied part of the key space or not) and its `copy` detail
says where the next range starts (copying.py, `copy_streams`, says why that is exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingestion_assets.sources.postgres.cdc import parse_lsn
from ingestion_assets.state.model import Checkpoint

StreamCheckpoint = dict[str, Any]  # {"lsn": "0/16B3748", **details} as stored for one stream
COPY = "copy"  # the checkpoint detail of a stream whose copy is under way (CopyProgress)


@dataclass
class CopyProgress:
    """A copy under way: the last key copied (keyset order of the primary key; None: no range yet), the
    floor (just below every version the copy or the log gives a row from the copy's start on: rows left below
    it once every range is copied were deleted in the source), and what it copied so far."""

    after: dict[str, str | None] | None = None
    floor: str | None = None
    ranges: int = 0
    rows: int = 0

    def stored(self) -> dict[str, Any]:
        return {"after": self.after, "floor": self.floor, "ranges": self.ranges, "rows": self.rows}


def stream_checkpoint(checkpoint: Checkpoint | None) -> StreamCheckpoint | None:
    """A stream's checkpoint as the instance stores it, read as a CDC stream's (None: never ran, or reset)."""
    if checkpoint is None or checkpoint.position is None:
        return None
    return {**checkpoint.details, "lsn": checkpoint.position["lsn"]}


class CdcStore(Protocol):
    def latest(self) -> dict[str, StreamCheckpoint | None]:
        """Each stream's newest checkpoint (None: never ran, or reset)."""
        ...

    def commit(self, lsn: int, details: Mapping[str, Mapping[str, Any]]) -> None:
        """Store `lsn` and its details as the checkpoint of each stream named in `details`."""
        ...


@dataclass
class SourceState:
    """The streams' checkpoints as a run starts, and the positions it moves them to."""

    checkpoints: dict[str, StreamCheckpoint | None]
    positions: dict[str, int | None] = field(default_factory=dict)  # stream -> log position (None: needs a copy)
    reasons: dict[str, str] = field(default_factory=dict)  # stream -> why it is copied again
    copies: dict[str, CopyProgress] = field(default_factory=dict)  # stream -> its copy under way
    begun: set[str] = field(default_factory=set)  # streams whose copy this run began (not an earlier one)

    def __post_init__(self) -> None:
        for name, checkpoint in self.checkpoints.items():
            held = checkpoint is not None and checkpoint.get("snapshot_done") and checkpoint.get("lsn")
            self.positions[name] = parse_lsn(str(checkpoint["lsn"])) if held and checkpoint else None
            if held and checkpoint and isinstance(checkpoint.get(COPY), dict):
                self.copies[name] = CopyProgress(**checkpoint[COPY])

    @property
    def started(self) -> bool:
        """Some stream holds a log position: the slot and its log are in use."""
        return any(p is not None for p in self.positions.values())

    @property
    def low(self) -> int:
        """Where the slot is read from: the lowest position a stream holds."""
        return min(p for p in self.positions.values() if p is not None)

    def details(self, name: str) -> dict[str, Any]:
        return dict(self.checkpoints.get(name) or {})

    def recopy(self, name: str, reason: str) -> None:
        self.positions[name] = None
        self.copies.pop(name, None)
        self.reasons[name] = reason

    def copying(self) -> list[str]:
        """Streams without a position, or whose copy is under way."""
        return [name for name, position in self.positions.items() if position is None or name in self.copies]

    def start_copy(self, name: str, lsn: int, floor: str) -> CopyProgress:
        """A stream without a position starts its copy at `lsn` (it takes the log from there on) with `floor`;
        one whose copy is under way goes on with it."""
        if self.positions.get(name) is None:
            self.positions[name] = lsn
            self.copies[name] = CopyProgress(floor=floor)
            self.begun.add(name)
        return self.copies.setdefault(name, CopyProgress(floor=floor))

    def applied(self, name: str, end_lsn: int) -> bool:
        """The stream's own checkpoint is at or past this transaction: it is in the target already."""
        position = self.positions.get(name)
        return position is not None and end_lsn <= position
