"""What a CDC run returns, and the errors it stops with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from ingestion_assets.observe.freshness import empty, percentiles
from ingestion_assets.sources.postgres.cdc import SlotHealth


class CdcError(RuntimeError):
    """The log cannot be read safely; the message says why and what to do."""

    transient = False


class LogBehind(CdcError):
    """The slot did not reach a copy's snapshot position in time: nothing of the copy was loaded, a retry may."""

    transient = True


class ColumnsUnlandable(CdcError):
    """A column that cannot land appeared in a table while its copy ran: nothing of the range was loaded. A copy
    beside the log pauses that stream and goes on with the others (`problem`: what cannot land); a history range
    fails, and the next attempt's checks leave that stream out while the others go on."""

    transient = True

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass
class CdcOutcome:
    mode: str  # snapshot | changes | chunk
    lsn: int
    rows: dict[str, int] = field(default_factory=dict)  # per stream: rows (snapshot) or changes applied
    histogram: HdrHistogram = field(default_factory=empty)  # commit-to-target ms per change (memory stays flat)
    health: SlotHealth | None = None
    dead_letters: int = 0
    checkpoints: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # stream -> (lsn, details)
    copied: list[str] = field(default_factory=list)  # streams whose copy beside the log ended in this run
    paused: dict[str, str] = field(default_factory=dict)  # stream -> why it sits out (key lost, or refused)
    reasons: dict[str, str] = field(default_factory=dict)  # stream -> why this run copies it again
    truncated: set[str] = field(default_factory=set)  # streams whose target a truncate from the log emptied

    def latency(self) -> dict[str, float]:
        """p50/p95/p99 of the commit-to-target latency (ms); empty when no change was applied."""
        return percentiles(self.histogram)
