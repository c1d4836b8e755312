"""The stream side of change data capture, one module per part: `sync` (the run: snapshot, log, copies),
`rows` (log changes as rows for a target), `copy` (a table or key range as of a snapshot), `history`
(key ranges as backfill partitions, and the fences that keep a copy from undoing the log), `state` (one
checkpoint per stream) and `schema` (the table streams' schema step, fed by the log's relation messages)."""

from __future__ import annotations

from ingestion_assets.streams.cdc.sync import CdcError, CdcOutcome, CdcStore, CdcSync

__all__ = ["CdcError", "CdcOutcome", "CdcStore", "CdcSync"]
