"""The body of a stream's asset: run its partitions, turn failures into Dagster's, report the metadata.

Imported by the asset only when its step runs: the readers, loaders and dlt come in here, not with the
definitions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ingestion_assets.defs.checks import DEAD_LETTERS, SCHEMA, check_results, failed_check
from ingestion_assets.defs.failures import permanent_failure
from ingestion_assets.defs.metadata import run_metadata
from ingestion_assets.defs.partitions import range_partitions
from ingestion_assets.defs.run_tags import mark_run
from ingestion_assets.defs.streams import StreamRef, is_table, open_stream
from ingestion_assets.defs.target_shrank import observe_target_rows, target_shrank
from ingestion_assets.drain import Drain
from ingestion_assets.loading.dead_letters import DeadLetterThreshold
from ingestion_assets.state.checkpoints import InstanceStateStore, latest_checkpoint
from ingestion_assets.streams.runner import NoProgress, PartitionJob, PartitionOutcome, StreamBusy
from ingestion_assets.streams.schema_step import SchemaPaused

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream


def materialize_stream(
    context: dg.AssetExecutionContext, ref: StreamRef | Stream, key_ranged: bool, reconciles: bool
) -> dg.MaterializeResult:
    stream = open_stream(ref)
    if context.instance.is_ephemeral:  # e.g. `dagster asset materialize` with DAGSTER_HOME unset, in CI
        context.log.warning(
            "%s: this run's Dagster instance is ephemeral (is DAGSTER_HOME set? `eval \"$(ingest env)\"`): it "
            "finds no checkpoint of the deployment's runs and its own are lost with it, so the stream is read from "
            "its start and the deployment's next run reads it all again",
            stream.qualified_name,
        )
    store = InstanceStateStore(context.instance, context.asset_key, context.log_event)
    mark_run(context, stream.source_name, key_ranges=key_ranged)
    shrank = target_shrank(context, stream) if reconciles and is_table(stream) else None
    if shrank is not None:
        context.log.warning("%s: %s", stream.qualified_name, shrank)
    try:
        return _run(context, stream, store, shrank, key_ranged, reconciles)
    except Exception:
        if shrank is None and _wrote(context):  # a shrink found and not repaired is not blessed as the new count
            observe_target_rows(context.log_event, context.asset_key, stream, _partitions_of(context)[-1])
        raise


def _wrote(context: dg.AssetExecutionContext) -> bool:
    """This run committed a slice of the stream: the target is no longer what its last materialization counted."""
    checkpoint = latest_checkpoint(context.instance, context.asset_key)
    return checkpoint is not None and checkpoint.run_id == context.run_id


def _run(
    context: dg.AssetExecutionContext,
    stream: Stream,
    store: InstanceStateStore,
    shrank: str | None,
    key_ranged: bool,
    reconciles: bool,
) -> dg.MaterializeResult:
    spec, outcomes = stream.spec, list[PartitionOutcome]()
    with Drain(spec.drain_seconds, context.log) as drain:
        for partition in _partitions_of(context):
            if drain.requested:
                break
            job = PartitionJob(
                stream, store, partition, stop=drain, log=context.log, run_id=context.run_id, compare_whole=shrank
            )
            outcomes.append(_run_partition(context, stream, job))
        if drain.requested:
            done = ", ".join(str(o.partition or stream.name) for o in outcomes) or "nothing"
            raise dg.Failure(
                description=f"{stream.qualified_name} drained ({drain.describe()}): the slice in flight was "
                f"committed and checkpointed ({done}); the next run resumes from there",
                allow_retries=False,
            )
    mark_run(context, stream.source_name, key_ranges=key_ranged, outcomes=outcomes)
    metadata = run_metadata(stream, outcomes)
    return dg.MaterializeResult(metadata=metadata, check_results=check_results(outcomes, reconciles, spec.freshness))


def _run_partition(context: dg.AssetExecutionContext, stream: Stream, job: PartitionJob) -> PartitionOutcome:
    try:
        return job.run()
    except SchemaPaused as exc:
        changes = dg.MetadataValue.json([c.as_json() for c in exc.changes])
        context.log_event(failed_check(context.asset_key, SCHEMA, str(exc), changes=changes))
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except DeadLetterThreshold as exc:
        context.log_event(failed_check(context.asset_key, DEAD_LETTERS, str(exc)))
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except (NoProgress, StreamBusy) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except Exception as exc:
        where = f"stream {stream.qualified_name}" + (f" partition {job.partition}" if job.partition else "")
        failure = permanent_failure(where, exc)
        if failure is None:
            raise
        raise failure from exc


def _partitions_of(context: dg.AssetExecutionContext) -> list[str | None]:
    if not context.has_partition_key and not context.has_partition_key_range:
        return [None]
    if context.has_partition_key_range:
        return list(range_partitions(context))
    return list(context.partition_keys)
