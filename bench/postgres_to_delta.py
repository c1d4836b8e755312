"""Benchmark: a PostgreSQL table into a Delta and an Iceberg lake against the same stream into DuckDB, same run.
Usage:

    .venv/bin/python bench/postgres_to_delta.py --rows 1000000

Both paths are the product's Dagster asset (checkpoints in the PostgreSQL-backed instance), each in a fresh
process from an empty target: the first full read (appended slices), then `--changed` rows updated in the
source and an incremental run merged on the key. Printed: seconds and rows/s per path and each lake's ratio to
DuckDB. `--paths duckdb,delta` leaves Iceberg out (its merge is pyiceberg's upsert, 1,000 rows a snapshot).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from postgres_to_duckdb import WORK, _prepare  # the same seeded table and Dagster instance

PATHS = ("duckdb", "delta", "iceberg")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changed", type=int, default=10_000)
    parser.add_argument("--paths", default=",".join(PATHS), help="which of duckdb,delta,iceberg (duckdb first)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: one path in this process
    args = parser.parse_args()
    if args.run:
        result = _run(args.run, args.changed)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    env = _prepare(WORK / "home", args.rows)
    results = {path: _measure(path, env, args.changed) for path in args.paths.split(",")}
    for path, line in results.items():
        print(
            f"{path:<7} full {line['rows']:>10,.0f} rows {line['seconds']:>7.2f}s {line['rows'] / line['seconds']:>9,.0f}"
            f" rows/s | merge {line['changed']:>7,.0f} rows {line['merge_seconds']:>6.2f}s"
            f" | peak RSS {line['peak_rss_mb']:>6,.0f} MB",
            flush=True,
        )
    duck = results["duckdb"]
    for path, lake in results.items():
        if path != "duckdb":
            print(
                f"ratio {path}/duckdb: full {lake['seconds'] / duck['seconds']:.2f}x the time, "
                f"merge {lake['merge_seconds'] / duck['merge_seconds']:.2f}x"
            )


def _measure(path: str, env: dict[str, str], changed: int) -> dict[str, float]:
    catalog = WORK / f"catalog_{path}.yaml"
    destination = (
        "{type: duckdb, path: " + str(WORK / "delta_bench.duckdb") + "}"
        if path == "duckdb"
        else "{type: filesystem, table_format: " + path + ", bucket_url: " + str(WORK / "lake") + "}"
    )
    catalog.write_text(
        f"destination: {destination}\n"
        "sources:\n  bench:\n    type: postgres\n    connection: {file: " + str(WORK / "source_url") + "}\n"
        "    streams:\n      orders: {table: public.bench_orders, primary_key: id, cursor: updated_at,"
        " slice_rows: 500000}\n"
    )
    out = subprocess.run(
        [sys.executable, __file__, "--run", path, "--changed", str(changed)],
        env={**os.environ, **env, "INGEST_CATALOG": str(catalog)},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{path} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _run(path: str, changed: int) -> dict[str, float]:
    import dagster as dg
    import psycopg2

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint

    settings = Settings.from_env()
    key = dg.AssetKey(["bench", "orders"])
    (WORK / "delta_bench.duckdb").unlink(missing_ok=True)
    shutil.rmtree(WORK / "lake", ignore_errors=True)
    with dg.DagsterInstance.get() as instance:
        reset_checkpoint(instance, key, None, reason="benchmark")
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        began = time.monotonic()
        result = dg.materialize(assets, instance=instance)
        seconds = time.monotonic() - began
        rows = result.asset_materializations_for_node("bench__orders")[0].metadata["rows read"].value
        with psycopg2.connect(os.environ["BENCH_SOURCE_URL"]) as conn, conn.cursor() as cur:
            cur.execute("UPDATE bench_orders SET updated_at = clock_timestamp() WHERE id <= %s", (changed,))
        began = time.monotonic()
        dg.materialize(assets, instance=instance)
        merge_seconds = time.monotonic() - began
    return {"rows": float(rows), "seconds": seconds, "changed": float(changed), "merge_seconds": merge_seconds}  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
