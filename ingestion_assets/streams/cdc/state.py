"""One checkpoint per stream of a CDC source: its log position and details, whatever the catalog's order.

All streams of a source read one slot, but each keeps its own position: a stream that is new, reset or whose
target no longer holds what its checkpoint says has none and gets a copy; the others keep theirs. The slot is
read from the lowest position any stream holds, and a stream skips the transactions its own position is past.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingestion_assets.sources.postgres.cdc import parse_lsn

StreamCheckpoint = dict[str, Any]  # {"lsn": "0/16B3748", **details} as stored for one stream


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

    def __post_init__(self) -> None:
        for name, checkpoint in self.checkpoints.items():
            held = checkpoint is not None and checkpoint.get("snapshot_done") and checkpoint.get("lsn")
            self.positions[name] = parse_lsn(str(checkpoint["lsn"])) if held and checkpoint else None

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
        self.reasons[name] = reason

    def copying(self) -> list[str]:
        return [name for name, position in self.positions.items() if position is None]

    def applied(self, name: str, end_lsn: int) -> bool:
        """The stream's own checkpoint is at or past this transaction: it is in the target already."""
        position = self.positions.get(name)
        return position is not None and end_lsn <= position
