"""A CDC run's row counts: before it applies anything, each stream's target is counted and compared with what the
last run recorded it should hold, so rows deleted from it outside ingest are told and kept owed (`rows missing`)
rather than taken as the new normal by the count this run records; a run that fails after committing records its
counts too, so `ingest status` does not compare with a count from before its changes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import dagster as dg

from ingestion_assets.defs.target_shrank import observe_target_rows, rows_expected, uncounted_run
from ingestion_assets.state.checkpoints import latest_checkpoint

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingestion_assets.defs.streams import StreamRef
    from ingestion_assets.streams.cdc import CdcOutcome

log = logging.getLogger(__name__)


def rows_missing(
    context: dg.AssetExecutionContext, keys: list[dg.AssetKey], streams: list[StreamRef], say: Callable[[str], None]
) -> dict[str, int]:
    """Per stream whose target holds fewer rows than the last run recorded it should (less what ingest removed):
    how many fewer. Counted before the run loads anything: its own changes (the log's deletes, a truncate) are no
    loss. A stream with no position (its copy comes) or whose last run was killed before counting is not judged."""
    from ingestion_assets.observe.target import read_target
    from ingestion_assets.streams.cdc.state import stream_checkpoint

    missing: dict[str, int] = {}
    for key, stream in zip(keys, streams, strict=True):
        if stream_checkpoint(latest_checkpoint(context.instance, key)) is None:
            continue
        expected = rows_expected(context.instance, key)
        if expected is None or uncounted_run(context.instance, key, context.run_id) is not None:
            continue
        try:
            now = read_target(stream.settings, stream.destination, stream.source_name, stream.name)
        except Exception as exc:  # noqa: BLE001 - a count to compare (pyiceberg raises its own): never fails the run
            log.warning("%s: could not count the target table before the run: %s", stream.qualified_name, exc)
            continue
        if now.rows is None or now.rows >= expected:
            continue  # a table gone is the binding check's: the stream is copied again
        missing[stream.name] = expected - now.rows
        say(
            f"{stream.qualified_name}: the target holds {now.rows:,} row(s), {expected - now.rows:,} fewer than the "
            "last run left in it: rows were deleted from it outside ingest (by hand, or an older copy restored); "
            "the log brings changes only, not those rows"
        )
    return missing


def say_missing(
    outcome: CdcOutcome, streams: list[StreamRef], missing: dict[str, int], say: Callable[[str], None]
) -> None:
    """After the run: what became of the rows found missing before it."""
    for stream in streams:
        if stream.name not in missing:
            continue
        owed = still_missing(outcome, stream.name, missing)
        if not owed:
            say(f"{stream.qualified_name}: this run copies the table again: the rows found missing come back with it")
            continue
        say(
            f"{stream.qualified_name}: {owed:,} row(s) deleted from the target outside ingest are still missing: "
            f"`ingest status` reports the stream `target short` until `ingest refresh {stream.qualified_name}` "
            "copies the table again"
        )


def still_missing(outcome: CdcOutcome, name: str, missing: dict[str, int]) -> int:
    """The rows found missing that this run did not put back: none when it copied the table (again, or a copy
    beside the log is under way: it brings every row) or a truncate from the log emptied it."""
    from ingestion_assets.streams.cdc.state import COPY

    if name in outcome.copied or name in outcome.reasons or name in outcome.truncated:
        return 0
    checkpoint = outcome.checkpoints.get(name)
    if checkpoint is not None and COPY in checkpoint[1]:
        return 0
    return missing.get(name, 0)


def missing_metadata(rows: int) -> dict[str, Any]:
    from ingestion_assets.defs.target_shrank import ROWS_MISSING

    return {ROWS_MISSING: rows} if rows else {}


def count_after_failure(
    context: dg.AssetExecutionContext,
    keys: list[dg.AssetKey],
    streams: list[StreamRef],
    missing: dict[str, int],
    partition: str | None,
) -> None:
    """A run that failed after committing changes of some streams: their targets' counts now (with the rows found
    missing), as observations, so status and the next run compare with what the target holds after them."""
    for key, stream in zip(keys, streams, strict=True):
        checkpoint = latest_checkpoint(context.instance, key)
        if checkpoint is not None and checkpoint.run_id == context.run_id:
            observe_target_rows(context.log_event, key, stream, partition, missing.get(stream.name, 0))
