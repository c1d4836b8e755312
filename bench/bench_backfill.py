"""Bench helper: a stream's key-range backfill planned afresh, run as one range or by two worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any


def plan(source: str, target_url: str) -> dict[str, Any]:
    """Fresh partitions for the table's size, checkpoints reset, the target schema dropped (PostgreSQL)."""
    import dagster as dg
    import psycopg2

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.defs.partitions import dynamic_partitions_name, plan_key_partitions
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint
    from ingestion_assets.state.summary import size_pools

    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    (stream,) = catalog_streams(settings, catalog)
    with psycopg2.connect(target_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP SCHEMA IF EXISTS {source} CASCADE; DROP SCHEMA IF EXISTS {source}_staging CASCADE")
    with dg.DagsterInstance.get() as instance:
        size_pools(settings, catalog)
        name = dynamic_partitions_name(source, stream.name)
        for old in instance.get_dynamic_partitions(name):
            instance.delete_dynamic_partition(name, old)
        plan_key_partitions(stream, instance)
        keys = instance.get_dynamic_partitions(name)
        for key in keys:
            reset_checkpoint(instance, dg.AssetKey([source, stream.name]), key, reason="benchmark")
    return {"keys": keys}


def warm_step_imports() -> None:
    """The step's modules (readers, loaders, dlt) load with the first step since the definitions stopped
    importing them; loaded before the clock, the figure is the run's, as it was before (the whole process's
    cost is bench/run_floor.py's). dlt and the loaders that use it are imported by a step only when it loads
    through dlt (a new table or column, dead letters): a first load does, so they are loaded here too."""
    import dlt  # noqa: F401

    import ingestion_assets.defs.run_stream
    import ingestion_assets.loading.duckdb_batch
    import ingestion_assets.loading.postgres_load
    import ingestion_assets.loading.type_mappers  # noqa: F401


def run_range(source: str, first: str, last: str) -> dict[str, float]:
    """One run over the partitions first..last (a single-run backfill)."""
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings

    settings = Settings.from_env()
    with dg.DagsterInstance.get() as instance:
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        warm_step_imports()
        began = time.monotonic()
        result = dg.materialize(
            assets,
            instance=instance,
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        )
        seconds = time.monotonic() - began
    rows = result.asset_materializations_for_node(f"{source}__orders")[0].metadata["rows read"].value  # the run's
    return {"rows": float(rows), "seconds": seconds}  # type: ignore[arg-type]


def two_workers(script: str, env: dict[str, str]) -> dict[str, float]:
    """Plan in one process, then two workers with half of the partitions each, started together."""
    planned = subprocess.run(
        [sys.executable, script, "--run", "backfill_plan"], env=env, capture_output=True, text=True
    )
    if planned.returncode != 0:
        raise SystemExit(f"backfill planning failed:\n{planned.stderr[-3000:]}")
    keys = json.loads(planned.stdout.strip().splitlines()[-1])["keys"]
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    began = time.monotonic()
    workers = [
        subprocess.Popen(
            [sys.executable, script, "--run", f"backfill_worker:{half[0]}:{half[-1]}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for half in halves
    ]
    outputs = [w.communicate() for w in workers]
    seconds = time.monotonic() - began
    for worker, (out, err) in zip(workers, outputs, strict=True):
        if worker.returncode != 0:
            raise SystemExit(f"backfill worker failed:\n{out[-2000:]}\n{err[-3000:]}")
    parts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    result = {"rows": sum(p["rows"] for p in parts), "seconds": seconds}
    if all("peak_rss_mb" in p for p in parts):  # workers that report their memory
        result["peak_rss_mb"] = max(p["peak_rss_mb"] for p in parts)
    return result
