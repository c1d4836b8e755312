"""One software-defined asset per catalog stream, key [source, stream], group = source; partitioned
streams are backfilled partition by partition, each with its own checkpoint."""

# No `from __future__ import annotations` here: Dagster inspects the asset's `context` annotation at runtime.

from typing import TYPE_CHECKING

import dagster as dg
from dagster import AssetExecutionContext

from ingestion_assets.catalog import Catalog, FilesSource, FilesStream, KeyPartitions, PostgresStream, RestStream
from ingestion_assets.defs.checks import check_specs
from ingestion_assets.defs.freshness import freshness_policy
from ingestion_assets.defs.metadata import definition_metadata
from ingestion_assets.defs.partitions import partitions_def
from ingestion_assets.defs.sources import stream_source_key
from ingestion_assets.defs.streams import StreamRef, catalog_refs, catalog_streams, is_cdc, is_table
from ingestion_assets.settings import Settings
from ingestion_assets.state.pools import pool_name

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream

__all__ = ["build_stream_assets", "catalog_streams", "is_cdc", "pool_name", "stream_asset"]


def build_stream_assets(settings: Settings, catalog: Catalog) -> list[dg.AssetsDefinition]:
    from ingestion_assets.defs.cdc import build_cdc_assets

    streams = [stream_asset(s) for s in catalog_refs(settings, catalog) if not is_cdc(s)]
    return streams + build_cdc_assets(settings, catalog)[0]


def stream_asset(stream: "StreamRef | Stream", columns: dg.TableSchema | None = None) -> dg.AssetsDefinition:
    """The stream's asset; `columns`: the column schema its last materialization recorded, if known."""
    spec = stream.spec
    retries = spec.retries
    partitions = partitions_def(stream.source_name, stream.name, spec) if not isinstance(spec, RestStream) else None
    reconciles = is_table(stream) or (
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
        from ingestion_assets.defs.run_stream import materialize_stream  # the readers and dlt: in the step only

        return materialize_stream(context, stream, _key_ranged(spec), reconciles)

    return _asset


def _backfill_policy(stream: "StreamRef | Stream") -> dg.BackfillPolicy | None:
    if isinstance(stream.spec, FilesStream) and stream.spec.partitions is not None:
        return dg.BackfillPolicy.single_run()  # a range of partitions in one run, one partition after another
    if not isinstance(stream.spec, PostgresStream) or stream.spec.partitions is None:
        return None
    per_run = stream.spec.max_partitions_per_run
    return dg.BackfillPolicy.single_run() if per_run == "all" else dg.BackfillPolicy.multi_run(per_run)


def _kind(stream: "StreamRef | Stream") -> str:
    return "postgres" if is_table(stream) else "files" if isinstance(stream.spec, FilesStream) else "api"


def _key_ranged(spec: PostgresStream | RestStream | FilesStream) -> bool:
    return isinstance(spec, PostgresStream) and isinstance(spec.partitions, KeyPartitions)


def _description(stream: "StreamRef | Stream") -> str:
    spec = stream.spec
    if isinstance(spec, FilesStream):
        assert isinstance(stream.source, FilesSource)
        key = ", ".join(spec.primary_key) or "file and row"
        return f"files {spec.path} under {stream.source.url} ({spec.write_disposition} on {key})"
    what = f"PostgreSQL table {spec.table}" if isinstance(spec, PostgresStream) else f"HTTP API {spec.path}"
    return f"{what} ({spec.write_disposition} on {', '.join(spec.primary_key)})"
