"""`ingest refresh` of a CDC stream: its table copied again by the CDC copy (as after `ingest state reset`), in a
run of its whole source, whose streams are one Dagster asset that runs whole."""

from __future__ import annotations

import argparse

from ingestion_assets.catalog import Catalog, PostgresSource
from ingestion_assets.cli.common import bring_up, checkpoint_partition
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings


def is_cdc(catalog: Catalog, source: str) -> bool:
    found = catalog.sources[source]
    return isinstance(found, PostgresSource) and found.mode == "cdc"


def refresh_cdc(settings: Settings, catalog: Catalog, source: str, stream: str, args: argparse.Namespace) -> int:
    """Refused before anything is recorded when asked to keep rows: a CDC copy retires those the source lacks."""
    import dagster as dg

    from ingestion_assets.state.checkpoints import reset_checkpoint
    from ingestion_assets.state.summary import open_instance

    name = f"{source}.{stream}"
    if args.retain:
        raise SystemExit(
            f"error: {name} is a CDC stream: --retain does not apply (its copy retires the rows the source no longer "
            f"has, as the log deletes them); run `ingest refresh {name}` without it"
        )
    spec = catalog.sources[source]
    assert isinstance(spec, PostgresSource)
    partition = checkpoint_partition(spec)
    env = bring_up(settings)
    with open_instance(settings) as instance:
        reset_checkpoint(instance, dg.AssetKey([source, stream]), partition, reason="ingest refresh")
    print(
        f"{name}: refresh requested: the next run of source {source} copies its table again under a snapshot, "
        "fenced against the log (rows the source no longer has are retired); its other streams go on from their "
        "positions"
    )
    if args.later:
        return 0
    from ingestion_assets.cli.demo_runs import materialize_logged

    selection = ["--select", ",".join(f"{source}/{other}" for other in spec.streams)]
    selection += ["--partition", LIVE] if partition else []
    status = materialize_logged(settings, env, f"refresh-{source}-{stream}", selection)
    if status == 0:
        print(_copied(settings, source, stream))
    return status


def _copied(settings: Settings, source: str, stream: str) -> str:
    from ingestion_assets.defs.metadata import SUMMARY
    from ingestion_assets.state.summary import latest_metadata

    metadata = latest_metadata(settings, source, stream)
    said = metadata[SUMMARY].value if SUMMARY in metadata else "run done"
    return f"{source}.{stream}: {said}"
