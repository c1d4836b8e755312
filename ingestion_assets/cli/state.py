"""`ingest state`, `refresh`, `partitions`: stream checkpoints, generations and backfill partitions."""

from __future__ import annotations

import argparse
from typing import Any

from ingestion_assets.catalog import Catalog, load_catalog
from ingestion_assets.cli.common import bring_up, checkpoint_partition, stream_key
from ingestion_assets.settings import Settings


def state_show(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.state.summary import checkpoint_rows

    catalog = load_catalog(settings.catalog_path)
    bring_up(settings)
    selected = [stream_key(catalog, args.stream)] if args.stream else None
    rows = checkpoint_rows(settings, catalog, selected, args.partition)
    width = max([len(r.stream) for r in rows] + [20]) + 2
    part = max([len(r.partition) for r in rows] + [10]) + 2
    print(f"{'stream':<{width}}{'partition':<{part}}{'committed at (UTC)':<27}{'run':<10}position")
    for row in rows:
        print(f"{row.stream:<{width}}{row.partition:<{part}}{row.committed_at:<27}{row.run_id:<10}{row.position}")
    return 0


def state_reset(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.state.summary import reset_stream

    catalog = load_catalog(settings.catalog_path)
    bring_up(settings)
    source, stream = stream_key(catalog, args.stream)
    reset_stream(settings, source, stream, checkpoint_partition(catalog.sources[source], args.partition))
    print(f"reset {source}.{stream}: the next run re-reads from the start; the merge keeps the target exact")
    return 0


def refresh(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.cli.cdc_refresh import is_cdc, refresh_cdc
    from ingestion_assets.state.summary import request_refresh

    catalog = load_catalog(settings.catalog_path)
    source, stream = stream_key(catalog, args.stream)
    if is_cdc(catalog, source):
        return refresh_cdc(settings, catalog, source, stream, args)
    if catalog.sources[source].streams[stream].partitions is not None:
        raise SystemExit(
            f"error: {source}.{stream} is partitioned: read its partitions again instead: `ingest state reset "
            f"{source}.{stream} --partition P` for each (a partition run after it reads from the start, merged by "
            "key; a run that is not reset reads only what changed), then run them, e.g. with a backfill"
        )
    env = bring_up(settings)
    mode = "retain" if args.retain else "remove"
    request_refresh(settings, source, stream, mode)
    what = "merged over the target" if args.retain else "swapped in once complete; the old table stays until then"
    print(f"{source}.{stream}: refresh requested ({mode}): a new generation is read in full, {what}")
    if args.later:
        return 0
    from ingestion_assets.cli.demo_runs import materialize_logged

    status = materialize_logged(settings, env, f"refresh-{source}-{stream}", ["--select", f"{source}/{stream}"])
    if status == 0:
        print(refreshed_summary(settings, source, stream))
    return status


def refreshed_summary(settings: Settings, source: str, stream: str) -> str:
    """What the refresh left: the generation now in the target and the rows it holds."""
    from ingestion_assets.state.summary import latest_metadata

    metadata = latest_metadata(settings, source, stream)
    generation = metadata["generation"].value if "generation" in metadata else "?"
    rows = metadata["dagster/row_count"].value if "dagster/row_count" in metadata else None
    held = f"{rows:,} rows" if isinstance(rows, int) else "its rows"
    return f"{source}.{stream}: generation {generation} swapped in, the target holds {held}"


def plan_cdc_history(
    settings: Settings, catalog: Catalog, instance: Any, wanted: tuple[str, str] | None
) -> list[tuple[str, list[str]]]:
    """CDC sources with history partitions: `live`, and once its first run started the log, the key ranges."""
    from ingestion_assets.catalog import PostgresSource
    from ingestion_assets.defs.cdc import cdc_streams, cdc_sync, history_partitions
    from ingestion_assets.streams.cdc.history import history_keys

    planned = []
    for source_name, source in catalog.sources.items():
        if not isinstance(source, PostgresSource):
            continue
        partitions = history_partitions(source_name, source)
        if partitions is None:
            continue
        if wanted is not None and wanted[0] != source_name:
            continue
        sync = cdc_sync(
            settings, catalog, source_name, source, cdc_streams(settings, catalog, source_name, source), instance
        )
        name = partitions.name or ""
        before = set(instance.get_dynamic_partitions(name))
        assert sync.add_partitions is not None
        stored = next((c for c in sync.store.latest().values() if c is not None), None)
        sync.add_partitions(history_keys(stored or {}))
        planned.append((source_name, [k for k in instance.get_dynamic_partitions(name) if k not in before]))
    return planned


def partitions_plan(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.catalog import KeyPartitions, PathKeyPartitions
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.defs.partitions import plan_file_key_partitions, plan_key_partitions
    from ingestion_assets.state.summary import open_instance
    from ingestion_assets.streams.files import FileSourceStream

    catalog = load_catalog(settings.catalog_path)
    wanted = stream_key(catalog, args.stream) if args.stream else None
    bring_up(settings)
    planned = 0
    with open_instance(settings) as instance:
        for stream in catalog_streams(settings, catalog):
            if not isinstance(stream.spec.partitions, KeyPartitions | PathKeyPartitions):
                continue
            if wanted is not None and (stream.source_name, stream.name) != wanted:
                continue
            if isinstance(stream, FileSourceStream):
                added = plan_file_key_partitions(stream, instance)
            else:
                added = plan_key_partitions(stream, instance)
            more = " ..." if len(added) > 3 else ""
            print(f"{stream.qualified_name}: added {len(added)} partition(s) {added[:3]}{more}")
            planned += 1
        for source_name, added in plan_cdc_history(settings, catalog, instance, wanted):
            more = " ..." if len(added) > 3 else ""
            print(f"{source_name} (cdc history): added {len(added)} partition(s) {added[:3]}{more}")
            planned += 1
    if not planned:
        what = args.stream or "the catalog"
        print(
            f"nothing to plan: {what} has no key-partitioned stream (`partitions: {{by: key, chunk: N}}`) and no CDC "
            "source with `cdc.history_chunk`; time partitions need no planning"
        )
    return 0
