"""One software-defined asset per catalog stream, key [source, stream], group = source; partitioned
streams are backfilled partition by partition, each with its own checkpoint."""

# No `from __future__ import annotations` here: Dagster inspects the asset's `context` annotation at runtime.

import dagster as dg
from dagster import AssetExecutionContext

from ingestion_assets.catalog import (
    Catalog,
    FilesSource,
    FilesStream,
    KeyPartitions,
    PostgresSource,
    PostgresStream,
    RestSource,
    RestStream,
)
from ingestion_assets.defs.checks import DEAD_LETTERS, SCHEMA, check_results, check_specs, failed_check
from ingestion_assets.defs.failures import permanent_failure
from ingestion_assets.defs.freshness import freshness_policy
from ingestion_assets.defs.metadata import definition_metadata, run_metadata
from ingestion_assets.defs.partitions import partitions_def
from ingestion_assets.defs.run_tags import mark_run
from ingestion_assets.defs.sources import stream_source_key
from ingestion_assets.drain import Drain
from ingestion_assets.loading.dead_letters import DeadLetterThreshold
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import InstanceStateStore
from ingestion_assets.streams.files import FileSourceStream
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.streams.rest_api import RestApiStream
from ingestion_assets.streams.runner import NoProgress, PartitionJob, PartitionOutcome, Stream, StreamBusy
from ingestion_assets.streams.schema_step import SchemaPaused


def pool_name(source_name: str) -> str:
    """The Dagster concurrency pool that caps how many of a source's streams read at once."""
    return f"ingest_{source_name}"


def catalog_streams(settings: Settings, catalog: Catalog) -> list[Stream]:
    streams: list[Stream] = []
    for source_name, source, stream_name, spec in catalog.streams():
        if isinstance(source, RestSource) and isinstance(spec, RestStream):
            streams.append(RestApiStream(settings, catalog.destination, source_name, source, stream_name, spec))
        elif isinstance(source, FilesSource) and isinstance(spec, FilesStream):
            streams.append(FileSourceStream(settings, catalog.destination, source_name, source, stream_name, spec))
        elif isinstance(source, PostgresSource) and isinstance(spec, PostgresStream):
            streams.append(PostgresTableStream(settings, catalog.destination, source_name, source, stream_name, spec))
    return streams


def is_cdc(stream: Stream) -> bool:
    """Streams of a `mode: cdc` source are materialized together, from their slot (defs/cdc.py)."""
    return isinstance(stream.source, PostgresSource) and stream.source.mode == "cdc"


def build_stream_assets(settings: Settings, catalog: Catalog) -> list[dg.AssetsDefinition]:
    from ingestion_assets.defs.cdc import build_cdc_assets

    streams = [stream_asset(s) for s in catalog_streams(settings, catalog) if not is_cdc(s)]
    return streams + build_cdc_assets(settings, catalog)[0]


def stream_asset(stream: Stream, columns: dg.TableSchema | None = None) -> dg.AssetsDefinition:
    """The stream's asset; `columns`: the column schema its last materialization recorded, if known."""
    spec = stream.spec
    retries = spec.retries
    partitions = partitions_def(stream.source_name, stream.name, spec) if not isinstance(spec, RestStream) else None
    reconciles = isinstance(stream, PostgresTableStream) or (
        isinstance(spec, RestStream) and spec.deletes is not None and spec.deletes.key_listing is not None
    )

    @dg.asset(
        key=dg.AssetKey([stream.source_name, stream.name]),
        group_name=stream.source_name,
        pool=pool_name(stream.source_name),
        kinds={_kind(stream), "dlt", stream.destination.type},
        description=_description(stream),
        metadata=definition_metadata(stream, columns),
        deps=[stream_source_key(stream.source_name, spec)],
        tags={"ingest/source": stream.source_name},
        partitions_def=partitions,
        backfill_policy=_backfill_policy(stream),
        check_specs=check_specs(dg.AssetKey([stream.source_name, stream.name]), reconciles, spec.freshness),
        freshness_policy=freshness_policy(spec.freshness),
        retry_policy=dg.RetryPolicy(
            max_retries=retries.max_attempts - 1,
            delay=retries.delay_seconds,
            backoff=dg.Backoff.EXPONENTIAL,
            jitter=dg.Jitter.FULL,
        ),
    )
    def _asset(context: AssetExecutionContext) -> dg.MaterializeResult:
        store = InstanceStateStore(context.instance, context.asset_key, context.log_event)
        mark_run(context, stream.source_name, key_ranges=_key_ranged(spec))
        outcomes: list[PartitionOutcome] = []
        with Drain(spec.drain_seconds, context.log) as drain:
            for partition in _partitions_of(context):
                if drain.requested:
                    break
                job = PartitionJob(stream, store, partition, stop=drain, log=context.log, run_id=context.run_id)
                try:
                    outcomes.append(job.run())
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
                    where = f"stream {stream.qualified_name}" + (f" partition {partition}" if partition else "")
                    failure = permanent_failure(where, exc)
                    if failure is None:
                        raise
                    raise failure from exc
            if drain.requested:
                done = ", ".join(str(o.partition or stream.name) for o in outcomes) or "nothing"
                raise dg.Failure(
                    description=f"{stream.qualified_name} drained ({drain.describe()}): the slice in flight was "
                    f"committed and checkpointed ({done}); the next run resumes from there",
                    allow_retries=False,
                )
        mark_run(context, stream.source_name, key_ranges=_key_ranged(spec), outcomes=outcomes)
        return dg.MaterializeResult(
            metadata=run_metadata(stream, outcomes), check_results=check_results(outcomes, reconciles, spec.freshness)
        )

    return _asset


def _backfill_policy(stream: Stream) -> dg.BackfillPolicy | None:
    if isinstance(stream.spec, FilesStream) and stream.spec.partitions is not None:
        return dg.BackfillPolicy.single_run()  # a range of partitions in one run, one partition after another
    if not isinstance(stream.spec, PostgresStream) or stream.spec.partitions is None:
        return None
    per_run = stream.spec.max_partitions_per_run
    return dg.BackfillPolicy.single_run() if per_run == "all" else dg.BackfillPolicy.multi_run(per_run)


def _kind(stream: Stream) -> str:
    return {PostgresTableStream: "postgres", FileSourceStream: "files"}.get(type(stream), "api")


def _key_ranged(spec: PostgresStream | RestStream | FilesStream) -> bool:
    return isinstance(spec, PostgresStream) and isinstance(spec.partitions, KeyPartitions)


def _partitions_of(context: AssetExecutionContext) -> list[str | None]:
    if not context.has_partition_key and not context.has_partition_key_range:
        return [None]
    return list(context.partition_keys)


def _description(stream: Stream) -> str:
    spec = stream.spec
    if isinstance(stream, FileSourceStream):
        spec = stream.spec
        key = ", ".join(spec.primary_key) or "file and row"
        return f"files {spec.path} under {stream.source.url} ({spec.write_disposition} on {key})"
    what = f"PostgreSQL table {spec.table}" if isinstance(spec, PostgresStream) else f"HTTP API {spec.path}"
    return f"{what} ({spec.write_disposition} on {', '.join(spec.primary_key)})"
