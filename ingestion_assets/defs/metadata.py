"""The metadata of stream assets, under one naming scheme: Dagster's own `dagster/...` keys where Dagster
has one (row count, column schema, table name), `ingest/checkpoint` for the stored state, and short lower-case
phrases for everything else ("rows read", "rows written", "http 429s")."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.errors import DagsterError
from sqlalchemy.exc import SQLAlchemyError

from ingestion_assets.catalog import Catalog, FilesStream, PostgresSource, RestStream
from ingestion_assets.defs.streams import StreamRef
from ingestion_assets.observe.freshness import HISTOGRAM, histogram_metadata, merged
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import checkpoint_metadata
from ingestion_assets.state.pools import size_pools_of
from ingestion_assets.state.runs import release_dead_runs as release_dead_runs_of
from ingestion_assets.streams.outside_windows import OUTSIDE, outside_text

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram

    from ingestion_assets.observe.target import TargetTableFacts
    from ingestion_assets.streams.runner import PartitionOutcome, Stream

log = logging.getLogger(__name__)

ROW_COUNT = "dagster/row_count"
COLUMN_SCHEMA = "dagster/column_schema"
TABLE_NAME = "dagster/table_name"
POSITION = "position"
ROWS_READ = "rows read"
ROWS_WRITTEN = "rows written"  # with the rows a repair wrote (ROWS_REPAIRED)
ROWS_REPAIRED = "rows repaired"  # missing or older rows the run's comparison found and read again by key
SUMMARY = "summary"
SECONDS = "seconds"
NO_CHANGES = "no changes"


def table_name(source_name: str, stream_name: str) -> str:
    return f"{source_name}.{stream_name}"


def definition_metadata(stream: StreamRef | Stream, columns: dg.TableSchema | None = None) -> dict[str, Any]:
    """What the asset is, before any run: where it lands, what it reads and how. `columns` is the column
    schema the last materialization recorded (the definitions cannot ask the source without reaching it)."""
    spec = stream.spec
    metadata: dict[str, Any] = {
        TABLE_NAME: table_name(stream.source_name, stream.name),
        "destination": stream.destination.type,
        "primary key": ", ".join(spec.primary_key),
        "write disposition": spec.write_disposition,
    }
    if columns is not None:
        metadata[COLUMN_SCHEMA] = columns
    if isinstance(spec, FilesStream):
        metadata.update(
            {
                "source path": spec.path,
                "cursor": "(files: modified_at, path)",
                "slice rows": spec.slice_rows,
                "files per slice": spec.files_per_slice,
            }
        )
        return metadata
    if isinstance(spec, RestStream):
        metadata.update(
            {
                "source path": spec.path,
                "cursor": spec.cursor or "(none: full read each run)",
                "pages per slice": spec.pages_per_slice,
            }
        )
        return metadata
    cdc = isinstance(stream.source, PostgresSource) and stream.source.mode == "cdc"
    metadata.update(
        {
            "source table": spec.table,
            "cursor": "(cdc: the log position)" if cdc else ", ".join(spec.cursor) or "(none: full read each run)",
            "slice rows": spec.slice_rows,
            "partitions": dg.MetadataValue.json(spec.partitions.model_dump(mode="json")) if spec.partitions else "none",
        }
    )
    return metadata


def column_schema(facts: TargetTableFacts, primary_key: list[str]) -> dg.TableSchema:
    """The target's columns with their destination types and nullability; the primary key as a constraint."""
    key = [c.lower() for c in primary_key]
    columns = [
        dg.TableColumn(
            name=c.name,
            type=c.type,
            description="primary key" if c.name.lower() in key else None,
            constraints=dg.TableColumnConstraints(nullable=c.nullable, unique=len(key) == 1 and c.name.lower() in key),
        )
        for c in facts.columns
    ]
    return dg.TableSchema(
        columns=columns, constraints=dg.TableConstraints(other=[f"primary key ({', '.join(primary_key)})"])
    )


def target_metadata(stream: StreamRef | Stream, step_timing: bool = True) -> dict[str, Any]:
    """Row count and column schema of the stream's target table as it is after the run; nothing (and a
    warning) when the destination cannot be asked: the run's data is committed either way. With
    `step_timing` (what a CDC run's materializations use), also `seconds`: how long the step has run."""
    figures: dict[str, Any] = {}
    seconds = step_seconds() if step_timing else None
    if seconds is not None:
        figures[SECONDS] = seconds

    from ingestion_assets.observe.target import read_target

    try:
        facts = read_target(stream.settings, stream.destination, stream.source_name, stream.name)
    except Exception as exc:  # noqa: BLE001 - a count for metadata (pyiceberg raises its own): never fails the run
        log.warning("%s: could not count the target table for the asset's metadata: %s", stream.qualified_name, exc)
        return figures
    if not facts.exists:
        return figures
    return {**figures, ROW_COUNT: facts.rows, COLUMN_SCHEMA: column_schema(facts, list(stream.spec.primary_key))}


def step_seconds() -> float | None:
    """Seconds since the current Dagster step started (its latest start or restart event); None outside one."""
    try:
        context = dg.AssetExecutionContext.get()
    except DagsterError:
        return None
    if context is None:
        return None
    step = context.get_step_execution_context().step.key
    starts = [
        record.event_log_entry.timestamp
        for kind in (dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_RESTARTED)
        for record in context.instance.get_records_for_run(context.run_id, of_type=kind).records
        if record.event_log_entry.step_key == step
    ]
    return round(time.time() - max(starts), 3) if starts else None


def run_metadata(stream: Stream, outcomes: list[PartitionOutcome]) -> dict[str, Any]:
    read = sum(o.result.rows for o in outcomes)
    repaired = sum(_repaired(o) for o in outcomes)
    written = sum(_written(o) for o in outcomes)
    seconds = sum(o.result.seconds for o in outcomes)
    metadata: dict[str, Any] = {
        SUMMARY: _summary(stream, outcomes, read, written, repaired),
        ROWS_READ: read,
        ROWS_WRITTEN: written,
        ROWS_REPAIRED: repaired,
        "dead letters": sum(o.result.dead_letters for o in outcomes),
        "slices": sum(o.result.slices for o in outcomes),
        SECONDS: round(seconds, 3),
        "rows per second": round(read / seconds) if seconds > 0 else 0,
        "mode": ", ".join(sorted({o.mode for o in outcomes})),
        **target_metadata(stream, step_timing=False),
        **_http_figures(outcomes),
        **histogram_metadata(run_histogram(outcomes)),
    }
    notes = [o.result.note for o in outcomes if o.result.note]
    if notes:
        metadata["late commits"] = "; ".join(notes)
    moved = [o.result.partitions_moved for o in outcomes if o.result.partitions_moved]
    if moved:
        metadata["partitions moved"] = "; ".join(moved)
    outside = [o.result.details[OUTSIDE] for o in outcomes if isinstance(o.result.details.get(OUTSIDE), dict)]
    if outside:  # a time-partitioned table's rows no window reads (streams/outside_windows.py)
        newest = outside[-1]
        metadata["rows in no window"] = sum(int(newest.get(k) or 0) for k in ("before", "after", "null"))
        said = outside_text(stream.qualified_name, newest)
        if said is not None:
            metadata["rows in no window: why"] = said
    started_over = [f"{o.partition or stream.name}: {o.started_over}" for o in outcomes if o.started_over]
    if started_over:  # the target did not hold what the checkpoint described: this run read from the start
        metadata["started over"] = "; ".join(started_over)
    listings = [o.key_listing.as_metadata() for o in outcomes if o.key_listing is not None]
    if listings:
        metadata["key listing"] = dg.MetadataValue.json(listings[0] if len(listings) == 1 else listings)
    if len(outcomes) == 1:  # one partition (or none): the materialization carries its final checkpoint
        only = outcomes[0]
        metadata[POSITION] = dg.MetadataValue.json(only.result.position or {})
        metadata.update(checkpoint_metadata(only.result.position, **only.checkpoint))
        metadata["generation"] = only.generation
        metadata["started from"] = dg.MetadataValue.json(only.result.started_from or {})
    else:
        metadata["partitions"] = dg.MetadataValue.json(
            {
                str(o.partition): {ROWS_READ: o.result.rows, ROWS_WRITTEN: _written(o), POSITION: o.result.position}
                for o in outcomes
            }
        )
    return metadata


def _repaired(outcome: PartitionOutcome) -> int:
    return outcome.reconciliation.repaired if outcome.reconciliation is not None else 0


def _written(outcome: PartitionOutcome) -> int:
    """The rows the run loaded, and those its repair wrote (read again by key: missing or older in the target)."""
    return outcome.result.loaded + _repaired(outcome)


def _summary(stream: Stream, outcomes: list[PartitionOutcome], read: int, written: int, repaired: int) -> str:
    """One line on top of the asset page; a run that found nothing new (and repaired nothing) says so."""
    if read == 0 and repaired == 0 and not any(o.mode.startswith("refresh") for o in outcomes):
        if all(o.result.started_from is None for o in outcomes):  # a first read: there is no checkpoint yet
            return f"{NO_CHANGES}: the source holds no rows to read yet"
        return f"{NO_CHANGES}: nothing new in the source since the last checkpoint"
    where = ", ".join(str(o.partition) for o in outcomes if o.partition) or stream.name
    fixed = f" ({repaired:,} repaired: read again by key)" if repaired else ""
    return f"{', '.join(sorted({o.mode for o in outcomes}))} of {where}: {read:,} rows read, {written:,} written{fixed}"


def run_histogram(outcomes: list[PartitionOutcome]) -> HdrHistogram:
    """The commit-to-target latencies of every partition the run read, in one histogram (exact merge)."""
    return merged(str(o.result.figures[HISTOGRAM]) for o in outcomes if HISTOGRAM in o.result.figures)


def _http_figures(outcomes: list[PartitionOutcome]) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    for outcome in outcomes:
        for name, value in outcome.result.figures.items():
            if isinstance(value, str):  # a few names (files read that nothing knew): joined across partitions
                totals[name] = "; ".join(filter(None, (totals.get(name), value)))
            elif name != HISTOGRAM:
                totals[name] = totals.get(name, 0) + value
    return {name: round(value, 3) if isinstance(value, float) else value for name, value in totals.items()}


def known_column_schemas(
    settings: Settings, keys: list[dg.AssetKey], release_dead_runs: bool = False, pools: Catalog | None = None
) -> dict[dg.AssetKey, dg.TableSchema]:
    """For the asset definitions: the column schemas the streams' last materializations recorded, read from
    this machine's instance; nothing elsewhere or on errors. `release_dead_runs`: first free the pool slots
    of runs whose processes died on this machine (a killed run's slots would block its source for good), on
    the same instance (opening one costs more than both reads). Neither in a step process of the multiprocess
    executor: it loads the definitions only to run its one step, and its run process did both moments before
    (it released the dead runs before claiming the step's pool slot, and the column schemas serve the UI).
    `pools`: create the catalog's source pools not created yet, before any step claims a slot: Dagster
    otherwise creates a pool at a step's first claim with its default size, and two runs of a new source doing
    so at once failed with a unique violation (state/pools.py)."""
    home = os.environ.get("DAGSTER_HOME")
    if not keys and not release_dead_runs and pools is None:
        return {}
    if not home or Path(home).resolve() != settings.dagster_home.resolve():
        return {}
    if multiprocessing.parent_process() is not None:  # a step process (run processes are started as commands)
        return {}
    try:
        with dg.DagsterInstance.get() as instance:
            if pools is not None:
                size_pools_of(instance, pools, missing_only=True)
            if release_dead_runs:
                released = release_dead_runs_of(instance)
                if released:
                    log.warning(
                        "released the pool slots of %d run(s) whose processes died: %s", len(released), released
                    )
            return latest_column_schemas(instance, keys) if keys else {}
    except (DagsterError, SQLAlchemyError, OSError) as exc:  # the definitions load without them
        log.warning("could not read the instance for the definitions: %s", exc)
        return {}


def latest_column_schemas(instance: dg.DagsterInstance, keys: list[dg.AssetKey]) -> dict[dg.AssetKey, dg.TableSchema]:
    """The column schema each asset's newest materialization recorded (one query for all of them)."""
    found: dict[dg.AssetKey, dg.TableSchema] = {}
    for key, entry in instance.get_latest_materialization_events(keys).items():
        materialization = entry.asset_materialization if entry is not None else None
        value = materialization.metadata.get(COLUMN_SCHEMA) if materialization is not None else None
        if value is not None and isinstance(value.value, dg.TableSchema):
            found[key] = value.value
    return found
