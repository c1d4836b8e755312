"""Run tags that say what a run did: `ingest/mode` (incremental | refresh | backfill | cdc | replay),
`ingest/source` and `ingest/generation`; the runs list and the timeline filter on them.

Tags set at launch come from the source's job (defs/jobs.py); a stream asset adds what only its run
learns (a refresh found in the state, the generation it wrote) while it runs."""

from __future__ import annotations

import logging

import dagster as dg

from ingestion_assets.partitions import LIVE
from ingestion_assets.streams.runner import PartitionOutcome

log = logging.getLogger(__name__)

MODE = "ingest/mode"
SOURCE = "ingest/source"
GENERATION = "ingest/generation"
MODES = ("incremental", "refresh", "backfill", "cdc", "replay")
BACKFILL_TAG = "dagster/backfill"


def run_mode(
    run_tags: dict[str, str], partitions: list[str | None], key_ranges: bool, outcomes: list[PartitionOutcome]
) -> str:
    if any(o.mode.startswith("refresh") for o in outcomes):
        return "refresh"
    if BACKFILL_TAG in run_tags or (key_ranges and any(p not in (None, LIVE) for p in partitions)):
        return "backfill"  # history: a backfill, or key-range chunks launched by hand
    given = run_tags.get(MODE, "")
    return given if given in MODES else "incremental"


def mark_run(
    context: dg.AssetExecutionContext,
    source_name: str,
    key_ranges: bool,
    outcomes: list[PartitionOutcome] | None = None,
) -> None:
    """Tag the run (before the read, then with its outcome). Tags are for people: a storage error here is
    logged, never the reason a run fails."""
    partitions = list(context.partition_keys) if context.has_partition_key or context.has_partition_key_range else []
    tags = {SOURCE: source_name, MODE: run_mode(dict(context.run.tags), partitions, key_ranges, outcomes or [])}
    generations = sorted({o.generation for o in outcomes or [] if o.generation})
    if generations:
        tags[GENERATION] = ",".join(str(g) for g in generations)
    try:
        context.instance.add_run_tags(context.run_id, tags)
    except dg.DagsterError as exc:
        log.warning("could not tag run %s with %s: %s", context.run_id, tags, exc)
