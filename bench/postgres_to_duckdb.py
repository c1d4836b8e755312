"""Benchmark: a PostgreSQL table into DuckDB through the asset, stock dlt sql_table, and raw COPY.

Each path runs in its own process (so peak RSS is its own), one after another in the same run, on the
same table, so the ratios compare like with like on a noisy machine. Usage:

    .venv/bin/python bench/postgres_to_duckdb.py --rows 5000000
    .venv/bin/python bench/postgres_to_duckdb.py --rows 1000000 --paths asset   # memory at another size
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

WORK = Path(__file__).resolve().parent / ".work"
TABLE_SQL = """
DROP TABLE IF EXISTS bench_orders;
CREATE TABLE bench_orders (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, sku text NOT NULL, quantity int NOT NULL,
    unit_price numeric(12,2) NOT NULL, total numeric(38,9) NOT NULL, status text NOT NULL, note text,
    zip text, placed_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, meta jsonb
);
INSERT INTO bench_orders
SELECT g, 1 + g %% 50000, lpad((g %% 2000)::text, 6, '0'), 1 + g %% 5, round((1 + g * 3.7 %% 500)::numeric, 2),
       round(((1 + g %% 5) * (1 + g * 3.7 %% 500))::numeric, 2) + (g %% 1000) * 0.000000001,
       (ARRAY['placed','paid','shipped','delivered'])[1 + g %% 4],
       CASE WHEN g %% 10 = 0 THEN 'gift for ' || g END, lpad((g * 7919 %% 99999)::text, 5, '0'),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '3 seconds 7 microseconds',
       timestamptz '2024-01-01 00:00:00+00' + (g / 40) * interval '120 seconds 654321 microseconds',
       CASE WHEN g %% 7 = 0 THEN NULL ELSE jsonb_build_object('channel', 'web', 'n', g %% 13) END
FROM generate_series(1::bigint, %(rows)s) g;
CREATE INDEX ON bench_orders (updated_at, id);
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--paths", default="raw,dlt,asset,asset_noop,backfill2")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: run one path in this process
    args = parser.parse_args()
    if args.run:
        result = _run_path(args.run)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(json.dumps(result))
        return
    home = WORK / "home"
    env = _prepare(home, args.rows)
    results = {}
    for path in args.paths.split(","):
        results[path] = _measure(path, env)
        line = results[path]
        print(
            f"{path:<11} {line['rows']:>10,} rows {line['seconds']:>8.2f}s {line['rows_per_s']:>11,.0f} rows/s"
            f"  peak RSS {line['peak_rss_mb']:>7,.0f} MB",
            flush=True,
        )
    _ratios(results)


def _prepare(home: Path, rows: int) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import psycopg2

    from ingestion_assets.settings import Settings
    from ingestion_assets.stack.instance import bring_up

    settings = Settings(home=home, catalog_path=WORK / "catalog.yaml")
    bring_up(settings)
    url = settings.embedded.ensure_database("bench")
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'bench_orders'")
        exists = cur.fetchone()[0] == 1  # type: ignore[index]
        count = 0
        if exists:
            cur.execute("SELECT count(*) FROM bench_orders")
            count = cur.fetchone()[0]  # type: ignore[index]
        if count != rows:
            began = time.monotonic()
            cur.execute(TABLE_SQL, {"rows": rows})
            conn.commit()
            conn.autocommit = True  # VACUUM sets hint bits now, or the first path measured pays for them
            cur.execute("VACUUM (FREEZE, ANALYZE) bench_orders")
            conn.autocommit = False
            print(f"seeded bench_orders with {rows:,} rows in {time.monotonic() - began:.1f}s", flush=True)
    conn.close()
    (WORK / "source_url").write_text(url)
    (WORK / "catalog.yaml").write_text(
        "destination: {type: duckdb, path: " + str(WORK / "asset.duckdb") + "}\n"
        "sources:\n  bench:\n    type: postgres\n    connection: {file: " + str(WORK / "source_url") + "}\n"
        "    streams:\n      orders: {table: public.bench_orders, primary_key: id, cursor: updated_at,"
        " slice_rows: 500000}\n"
    )
    chunk = max(rows // 10, 1)
    (WORK / "catalog_backfill.yaml").write_text(
        "destination: {type: duckdb, path: " + str(WORK / "backfill.duckdb") + "}\n"
        "sources:\n  bench:\n    type: postgres\n    connection: {file: " + str(WORK / "source_url") + "}\n"
        "    streams:\n      orders: {table: public.bench_orders, primary_key: id, cursor: updated_at,"
        f" slice_rows: 500000, partitions: {{by: key, chunk: {chunk}, live: false}}}}\n"
    )
    return {
        "INGEST_HOME": str(home),
        "INGEST_CATALOG": str(WORK / "catalog.yaml"),
        "DAGSTER_HOME": str(settings.dagster_home),
        "BENCH_SOURCE_URL": url,
    }


def _measure(path: str, env: dict[str, str]) -> dict[str, float]:
    if path == "backfill2":
        return _backfill_two_workers(env)
    out = subprocess.run(
        [sys.executable, __file__, "--run", path],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{path} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["rows_per_s"] = result["rows"] / result["seconds"] if result["seconds"] else 0.0
    return result


def _run_path(path: str) -> dict[str, float]:
    url = os.environ["BENCH_SOURCE_URL"]
    if path == "raw":
        return _raw(url)
    if path == "dlt":
        return _stock_dlt(url)
    if path == "backfill_plan":
        return _backfill_plan()  # type: ignore[return-value]
    if path.startswith("backfill_worker:"):
        _, first, last = path.split(":")
        return _backfill_range(first, last)
    return _asset(reset=(path == "asset"))


def _raw(url: str) -> dict[str, float]:
    """The physical limit: COPY -> Arrow -> DuckDB insert; no merge, no checkpoints, no dlt."""
    import duckdb

    from ingestion_assets.sources.postgres import plan_table_read
    from ingestion_assets.sources.postgres.reader import copy_batches
    from ingestion_assets.sources.slices import rechunk

    target = WORK / "raw.duckdb"
    target.unlink(missing_ok=True)
    began = time.monotonic()
    plan = plan_table_read(url, "public", "bench_orders", ("updated_at",), ("id",))
    statement = "COPY (SELECT * FROM public.bench_orders ORDER BY updated_at, id) TO STDOUT WITH (FORMAT csv)"
    rows = 0
    with duckdb.connect(str(target)) as con:
        for chunk in rechunk(copy_batches(url, statement, plan.shape, "bench-raw"), 500_000):
            if rows == 0:
                con.execute("CREATE TABLE orders AS SELECT * FROM chunk")
            else:
                con.execute("INSERT INTO orders SELECT * FROM chunk")
            rows += chunk.num_rows
    return {"rows": rows, "seconds": time.monotonic() - began}


def _stock_dlt(url: str) -> dict[str, float]:
    """Stock dlt: sql_table with the pyarrow backend, merge on the primary key."""
    import dlt
    from dlt.sources.sql_database import sql_table

    target = WORK / "dlt.duckdb"
    target.unlink(missing_ok=True)
    shutil.rmtree(WORK / "dlt_pipelines", ignore_errors=True)
    began = time.monotonic()
    resource_ = sql_table(
        credentials=url.replace("postgresql://", "postgresql+psycopg2://"),
        table="bench_orders",
        schema="public",
        backend="pyarrow",
        chunk_size=100_000,
        write_disposition="merge",
        primary_key="id",
    )
    pipeline = dlt.pipeline(
        pipeline_name="bench_stock",
        destination=dlt.destinations.duckdb(str(target)),
        dataset_name="bench",
        pipelines_dir=str(WORK / "dlt_pipelines"),
    )
    info = pipeline.run(resource_)
    rows = sum(pipeline.last_trace.last_normalize_info.row_counts.get(t, 0) for t in ["bench_orders"])
    assert not info.has_failed_jobs
    return {"rows": rows, "seconds": time.monotonic() - began}


def _asset(reset: bool) -> dict[str, float]:
    """The product path: the Dagster asset, with checkpoints in the PostgreSQL-backed instance."""
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint

    settings = Settings.from_env()
    key = dg.AssetKey(["bench", "orders"])
    with dg.DagsterInstance.get() as instance:
        if reset:
            (WORK / "asset.duckdb").unlink(missing_ok=True)
            reset_checkpoint(instance, key, None, reason="benchmark")
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        began = time.monotonic()
        result = dg.materialize(assets, instance=instance)
        seconds = time.monotonic() - began
    rows = result.asset_materializations_for_node("bench__orders")[0].metadata["rows read"].value
    return {"rows": int(rows), "seconds": seconds}


def _backfill_two_workers(env: dict[str, str]) -> dict[str, float]:
    """Ten key-range partitions, two worker processes with half of them each, as two backfill runs."""
    from bench_backfill import two_workers  # beside this script

    result = two_workers(__file__, {**os.environ, **env, "INGEST_CATALOG": str(WORK / "catalog_backfill.yaml")})
    return {**result, "rows_per_s": result["rows"] / result["seconds"]}


def _backfill_plan() -> dict[str, object]:
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.defs.partitions import dynamic_partitions_name, plan_key_partitions
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint
    from ingestion_assets.state.summary import size_pools

    settings = Settings.from_env()
    catalog = load_catalog(settings.catalog_path)
    (stream,) = catalog_streams(settings, catalog)
    (WORK / "backfill.duckdb").unlink(missing_ok=True)
    with dg.DagsterInstance.get() as instance:
        size_pools(settings, catalog)
        name = dynamic_partitions_name("bench", "orders")
        for old in instance.get_dynamic_partitions(name):  # a fresh plan for this table size
            instance.delete_dynamic_partition(name, old)
        plan_key_partitions(stream, instance)
        keys = instance.get_dynamic_partitions(name)
        for key in keys:
            reset_checkpoint(instance, dg.AssetKey(["bench", "orders"]), key, reason="benchmark")
    return {"keys": keys}


def _backfill_range(first: str, last: str) -> dict[str, float]:
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings

    settings = Settings.from_env()
    with dg.DagsterInstance.get() as instance:
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        began = time.monotonic()
        result = dg.materialize(
            assets,
            instance=instance,
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        )
        seconds = time.monotonic() - began
    rows = result.asset_materializations_for_node("bench__orders")[0].metadata["rows read"].value
    return {"rows": int(rows), "seconds": seconds}


def _ratios(results: dict[str, dict[str, float]]) -> None:
    asset = results.get("asset")
    if not asset:
        return
    for baseline in ("dlt", "raw"):
        if baseline in results and results[baseline]["rows_per_s"]:
            ratio = asset["rows_per_s"] / results[baseline]["rows_per_s"]
            print(f"asset / {baseline:<4} throughput ratio: {ratio:.2f}x")
    if "backfill2" in results:
        ratio = results["backfill2"]["rows_per_s"] / asset["rows_per_s"]
        print(f"backfill (10 partitions, 2 workers) / single-run asset throughput ratio: {ratio:.2f}x")
    if "asset_noop" in results:
        print(f"no-change incremental run (in-process materialize): {results['asset_noop']['seconds']:.2f}s")


if __name__ == "__main__":
    main()
