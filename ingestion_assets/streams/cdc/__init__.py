"""The stream side of change data capture, one module per part: `sync` (the run), `preflight` (checks, the
publication, streams paused for a lost identity), `recopy` (which streams need their table copied again, and
why), `copying` (copies beside the log), `batches` (the log applied batch by batch), `live` (one session held
for a run's lifetime), `apply` (one batch into the targets), `rows` (log changes as rows for a target), `copy`
(a table or key range as of a snapshot), `history` (key ranges as backfill partitions, and the fences that keep
a copy from undoing the log), `state` (one checkpoint per stream), `schema` (the table streams' schema step)
and `outcome` (what a run returns, its errors)."""

from __future__ import annotations

from ingestion_assets.streams.cdc.sync import CdcError, CdcOutcome, CdcStore, CdcSync

__all__ = ["CdcError", "CdcOutcome", "CdcStore", "CdcSync"]
