"""One replication session held for a whole live run: batches of whole transactions as they commit, each
acknowledged on the same connection once its checkpoint is stored.

A run that opens a session per batch pays a connection, START_REPLICATION and a decode restart from the
slot's restart position every time; holding the session makes a batch cost only its load and checkpoint.
The slot still moves only through `acknowledge`: the session writes no status of its own (see copydata.py),
and a server that asks for one (it is shutting down) gets the session closed (SourceStopping).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable

from ingestion_assets.sources.postgres.cdc.assembler import TransactionAssembler
from ingestion_assets.sources.postgres.cdc.changes import ChangeBatch
from ingestion_assets.sources.postgres.cdc.errors import CdcError
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn
from ingestion_assets.sources.postgres.cdc.replication import ReplicationStream

POLL_SECONDS = 0.05  # how often a waiting batch looks at `stop`


class LiveReader:
    """`next_batch()` returns the transactions committed since the previous batch: at most about
    `max_changes` changes (a bigger transaction comes whole), waiting at most `batch_seconds` after the
    first one arrived, so a change waits for its load no longer than that plus the load itself."""

    def __init__(
        self,
        url: str,
        slot: str,
        publication: str,
        start_lsn: int,
        *,
        max_changes: int,
        batch_seconds: float,
        lifetime_seconds: float,
    ) -> None:
        if max_changes < 1 or batch_seconds <= 0:
            raise ValueError(f"max_changes ({max_changes}) and batch_seconds ({batch_seconds}) must be positive")
        self.max_changes, self.batch_seconds = max_changes, batch_seconds
        self.position = start_lsn  # the end of the last batch handed out
        self._acknowledged = start_lsn
        # The walsender asks for a reply after half its timeout without one: beyond the run, it never asks.
        self._stream = ReplicationStream(url, slot, publication, start_lsn, session_seconds=lifetime_seconds + 60)
        self._assembler = TransactionAssembler()

    def __enter__(self) -> LiveReader:
        self._stream.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self._stream.close()

    def next_batch(self, stop: Callable[[], bool] = lambda: False) -> ChangeBatch:
        """Whole transactions, or an empty batch after `batch_seconds` with none (its end may still move:
        WAL in which nothing was published). Returns early, with what it has, once `stop()` is true."""
        assembler, stream = self._assembler, self._stream
        began = time.monotonic()
        first: float | None = None
        while assembler.change_count < self.max_changes and not stop():
            now = time.monotonic()
            deadline = (first if first is not None else began) + self.batch_seconds
            if now >= deadline and (assembler.completed or assembler.idle):
                break
            item = stream.next(timeout=min(POLL_SECONDS, max(0.0, deadline - now)) or POLL_SECONDS)
            if item is not None:
                assembler.feed(item[1])
                if first is None and assembler.completed:
                    first = time.monotonic()
        return self._take()

    def _take(self) -> ChangeBatch:
        assembler, start = self._assembler, self.position
        done = tuple(assembler.completed)
        end = done[-1].end_lsn if done else start
        if assembler.idle:  # every transaction committing before wal_end was sent, and is in the batch
            end = max(end, self._stream.wal_end)
        assembler.completed, assembler.change_count = [], 0
        self.position = max(start, end)
        return ChangeBatch(start_lsn=start, end_lsn=self.position, transactions=done, caught_up=assembler.idle)

    def acknowledge(self, lsn: int) -> None:
        """Everything before `lsn` is stored (its checkpoint committed): the server may release that WAL.
        Call it only after the checkpoint is stored; a position at or behind the last one is not sent."""
        if lsn > self.position:
            raise CdcError(f"acknowledging {format_lsn(lsn)} beyond what was read ({format_lsn(self.position)})")
        if lsn > self._acknowledged:
            self._stream.send_flush(lsn)
            self._acknowledged = lsn
