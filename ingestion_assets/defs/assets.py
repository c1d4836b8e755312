"""One partitioned software-defined asset per catalog stream, key [source, stream], group = source."""

# No `from __future__ import annotations` here: Dagster inspects the asset's `context` annotation at runtime.

import dagster as dg
from dagster import AssetExecutionContext

from ingestion_assets.catalog import Catalog
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import RunCheckpointSink, checkpoint_metadata, latest_checkpoint
from ingestion_assets.streams.postgres_table import PostgresTableStream


def pool_name(source_name: str) -> str:
    """The Dagster concurrency pool that caps how many of a source's streams read at once."""
    return f"ingest_{source_name}"


def build_stream_assets(settings: Settings, catalog: Catalog) -> list[dg.AssetsDefinition]:
    return [
        _postgres_table_asset(
            PostgresTableStream(settings, catalog.destination, source_name, source, stream_name, stream)
        )
        for source_name, source, stream_name, stream in catalog.streams()
    ]


def _postgres_table_asset(stream: PostgresTableStream) -> dg.AssetsDefinition:
    spec = stream.spec

    @dg.asset(
        key=dg.AssetKey([stream.source_name, stream.name]),
        group_name=stream.source_name,
        pool=pool_name(stream.source_name),
        kinds={"postgres", "dlt", stream.destination.type},
        description=f"PostgreSQL table {spec.table} ({spec.write_disposition} on {', '.join(spec.primary_key)})",
        metadata={
            "source_table": spec.table,
            "primary_key": ", ".join(spec.primary_key),
            "cursor": ", ".join(spec.cursor) or "(none: full read each run)",
            "slice_rows": spec.slice_rows,
            "target": f"{stream.source_name}.{stream.name}",
        },
    )
    def _asset(context: AssetExecutionContext) -> dg.MaterializeResult:
        partition = context.partition_key if context.has_partition_key else None
        previous = latest_checkpoint(context.instance, context.asset_key, partition)
        after = None
        if previous is not None:
            after = stream.resume_position(previous.position, bool(previous.details.get("complete", True)))
            context.log.info("resuming %s from checkpoint %s (run %s)", stream.qualified_name, after, previous.run_id)
        result = stream.run(after, RunCheckpointSink(context, partition), partition=partition, log=context.log)
        return dg.MaterializeResult(
            metadata={
                **checkpoint_metadata(result.position, complete=True, rows=result.rows, slices=result.slices),
                "rows": result.rows,
                "slices": result.slices,
                "seconds": round(result.seconds, 3),
                "rows_per_second": round(result.rows_per_second),
                "started_from": dg.MetadataValue.json({"position": result.started_from}),
                "dagster/table_name": f"{stream.source_name}.{stream.name}",
            }
        )

    return _asset
