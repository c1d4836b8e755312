"""A live CDC run: one replication session held for `cdc.live_seconds`, each batch loaded, checkpointed, then
acknowledged on that session, until the lifetime ends or SIGTERM asks it to drain (the batch in flight is
finished and checkpointed, then the run ends)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ingestion_assets.sources.postgres.cdc import slot_health
from ingestion_assets.sources.postgres.cdc.live import LiveReader
from ingestion_assets.streams.cdc.batches import apply_batch
from ingestion_assets.streams.cdc.preflight import slot_ready
from ingestion_assets.sync import Faults, checkpoint_first

if TYPE_CHECKING:
    from ingestion_assets.streams.cdc.sync import CdcOutcome, CdcSync

log = logging.getLogger(__name__)
IDLE_CHECKPOINT_SECONDS = 10.0  # a run that sees only WAL without published changes checkpoints this often


def apply_live(sync: CdcSync, url: str, outcome: CdcOutcome) -> None:
    """Apply the log batch by batch for the source's lifetime; the slot is acknowledged only behind each
    stored checkpoint, so a kill anywhere resumes from the last one (the merge absorbs the replay)."""
    cdc = sync.source.cdc
    lifetime = float(cdc.live_seconds or 0.0)
    slot_ready(sync, url)
    faults = sync.faults or Faults.from_env()
    unsafe = checkpoint_first()
    until = time.monotonic() + lifetime
    stored_at, index = time.monotonic(), 0
    reader = LiveReader(
        url,
        sync.slot,
        sync.publication,
        outcome.lsn,
        max_changes=cdc.max_changes,
        batch_seconds=cdc.batch_seconds,
        lifetime_seconds=lifetime,
    )
    with reader:
        while not sync.stop() and time.monotonic() < until:
            batch = reader.next_batch(sync.stop)
            idle = not batch.transactions and time.monotonic() - stored_at < IDLE_CHECKPOINT_SECONDS
            if batch.end_lsn <= outcome.lsn or idle:
                continue
            if unsafe:  # never in production: checkpoint first, so a crash in the load loses the batch
                sync._commit(batch.end_lsn)
            faults.hit("before_load", index)
            began = time.monotonic()
            apply_batch(sync, url, batch, outcome, None)
            faults.hit("after_load", index)
            loaded = time.monotonic()
            if not unsafe:
                sync._commit(batch.end_lsn)
            faults.hit("after_checkpoint", index)
            reader.acknowledge(batch.end_lsn)  # only behind stored checkpoints
            outcome.lsn, stored_at, index = batch.end_lsn, time.monotonic(), index + 1
            (sync.log or log).debug(
                "live batch %d: %d changes, load %.0f ms, checkpoint and acknowledge %.0f ms",
                index,
                len(batch),
                (loaded - began) * 1000,
                (stored_at - loaded) * 1000,
            )
    outcome.health = slot_health(url, sync.slot)
