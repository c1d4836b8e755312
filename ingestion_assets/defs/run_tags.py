"""Run tags that say what a run did: `ingest/mode` (incremental | refresh | backfill | cdc | replay),
`ingest/source` and `ingest/generation`; the runs list and the timeline filter on them. `ingest/refused`: a run
that refused to start (another run holds the source or stream, a partition range it cannot take) and did
nothing: `ingest status` shows its streams as they stand, not as failed.

Tags set at launch come from the source's job (defs/jobs.py); a stream asset adds what only its run
learns (a refresh found in the state, the generation it wrote) while it runs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.partitions import LIVE

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import PartitionOutcome

log = logging.getLogger(__name__)

MODE = "ingest/mode"
SOURCE = "ingest/source"
GENERATION = "ingest/generation"
REFUSED = "ingest/refused"  # why the run refused to start (it read and stored nothing)
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
    try:
        run = context.instance.get_run_by_id(context.run_id)  # now: other steps of the run may have tagged it
        current = dict(run.tags) if run is not None else dict(context.run.tags)
        mode = run_mode(dict(context.run.tags), partitions, key_ranges, outcomes or [])
        tags = {SOURCE: _joined(current.get(SOURCE), source_name), MODE: _modes(current.get(MODE), mode)}
        for outcome in outcomes or []:
            if outcome.generation:
                tags[GENERATION] = _joined(tags.get(GENERATION, current.get(GENERATION)), str(outcome.generation))
        context.instance.add_run_tags(context.run_id, tags)
    except dg.DagsterError as exc:
        log.warning("could not tag run %s: %s", context.run_id, exc)


def mark_refused(context: dg.AssetExecutionContext, why: str) -> None:
    """Tag a run that refuses to start: its failure is no stream's state. Logged, never raised, like the others."""
    try:
        context.instance.add_run_tags(context.run_id, {REFUSED: why[:500]})
    except dg.DagsterError as exc:
        log.warning("could not tag run %s: %s", context.run_id, exc)


def _joined(existing: str | None, value: str) -> str:
    """A run of several streams names all their sources (modes, generations): `shop,demo_api` stays sorted."""
    values = {v for v in (existing or "").split(",") if v} | {value}
    return ",".join(sorted(values))


def _modes(existing: str | None, mode: str) -> str:
    """The run's modes over its streams; `incremental` (also the job's launch tag) gives way to any other."""
    values = {v for v in (existing or "").split(",") if v} | {mode}
    if len(values) > 1:
        values.discard("incremental")
    return ",".join(sorted(values))
