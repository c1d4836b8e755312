"""One named job per source (and per partitioned stream, whose partitions a job cannot share with other
streams), used by the source's schedule and sensors: the runs list, the timeline and the Target column then
name the source instead of an anonymous asset job."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from ingestion_assets.catalog import FilesStream, PostgresStream
from ingestion_assets.defs.run_tags import MODE, SOURCE
from ingestion_assets.defs.streams import StreamRef

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream

Jobs = dict[str, UnresolvedAssetJobDefinition]


def job_name(source_name: str, stream_name: str | None = None) -> str:
    return f"{source_name}__{stream_name}__job" if stream_name else f"{source_name}__job"


def build_jobs(streams: list[StreamRef] | list[Stream]) -> Jobs:
    """The jobs of the table and API sources, by name: one per source for its plain streams, one per
    partitioned stream."""
    plain: dict[str, list[dg.AssetKey]] = {}
    jobs: Jobs = {}
    for stream in streams:
        key = dg.AssetKey([stream.source_name, stream.name])
        if isinstance(stream.spec, PostgresStream | FilesStream) and stream.spec.partitions is not None:
            job = source_job(stream.source_name, [key], stream.name)
            jobs[job.name] = job
        else:
            plain.setdefault(stream.source_name, []).append(key)
    for source_name, keys in plain.items():
        jobs[job_name(source_name)] = source_job(source_name, keys)
    return jobs


def source_job(
    source_name: str, keys: list[dg.AssetKey], stream_name: str | None = None
) -> UnresolvedAssetJobDefinition:
    """The streams `keys` of a table or API source; `stream_name` for a partitioned stream's own job."""
    what = f"stream {source_name}.{stream_name}" if stream_name else f"the streams of source {source_name}"
    return dg.define_asset_job(
        name=job_name(source_name, stream_name),
        selection=dg.AssetSelection.assets(*keys),
        description=f"syncs {what} from their checkpoints",
        tags={SOURCE: source_name, MODE: "incremental"},
    )


def cdc_job(source_name: str, keys: list[dg.AssetKey]) -> UnresolvedAssetJobDefinition:
    """A CDC source's streams, all from one slot in one run."""
    return dg.define_asset_job(
        name=job_name(source_name),
        selection=dg.AssetSelection.assets(*keys),
        description=f"applies the changes waiting in the replication slot of source {source_name}",
        tags={SOURCE: source_name, MODE: "cdc"},
    )
