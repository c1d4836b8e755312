"""The errors of change data capture, and the problems a check reports, written out in one place."""

from __future__ import annotations

from dataclasses import dataclass


class CdcError(RuntimeError):
    """Change data capture cannot go on; the message names the slot, publication or table and the fix."""

    transient = False  # whether a retry of the run may succeed (ingestion_assets.errors reads it)


class ProtocolError(CdcError):
    """Bytes from the replication stream that are not a valid pgoutput message, or arrive out of order."""


class SlotMissingError(CdcError):
    """The replication slot does not exist (never created, or dropped)."""


class SlotInUseError(CdcError):
    """Another process is streaming from the replication slot."""

    transient = True


class OpenTransactions(CdcError):
    """Transactions older than a copy's start are still open; the copy waits for them, then gives up for now."""

    transient = True


class DecodeTimeout(CdcError):
    """The server decoded longer than the read waits before anything arrived; a longer wait gets past it."""

    transient = True


class StreamLost(CdcError):
    """The replication session broke or was ended from outside (a terminated walsender, a dropped connection):
    nothing was acknowledged past the stored checkpoint, so the next attempt resumes from there."""

    transient = True


class SourceStopping(CdcError):
    """The source server is shutting down; the stream was closed at once so as not to hold the shutdown up."""

    transient = True


class AcknowledgeTimeout(CdcError):
    """The server did not show the acknowledged position on the slot in time."""

    transient = True


@dataclass(frozen=True)
class Problem:
    subject: str  # what is wrong: "server", "slot 'x'", "publication 'p'", "table s.t"
    message: str  # why it matters and what to do
    transient: bool = False  # may clear by itself in a moment (a slot still held by a reader that is exiting)
    table: tuple[str, str] | None = None  # (schema, table) when the problem is one table's

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"
