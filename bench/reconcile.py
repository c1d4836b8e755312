"""Benchmark: reconciliation's cost as a share of the initial load of the same table.

Paths, each in its own process (peak RSS is its own), one after another on the same table:

- load: the initial load through the asset with `reconcile: off` (the baseline);
- load_window: the same with the default `reconcile: window` (the first run's window is the whole table);
- aggregate: a full comparison where nothing differs (one aggregate query per side);
- every_key: a full comparison with the key diff forced on every bucket;
- deletes: 0.1 % of the source's rows deleted (spread over the table), found and applied (hard);
- window_small: the window check of an incremental run that read 1,000 changed rows.

    .venv/bin/python bench/reconcile.py --rows 5000000 --repeat 3
    .venv/bin/python bench/reconcile.py --rows 1000000 --paths load,aggregate
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from postgres_to_duckdb import TABLE_SQL

from ingestion_assets.streams.reconcile import Request

WORK = Path(__file__).resolve().parent / ".work"
DELETED_SHARE = 1000  # one row in this many is deleted for the `deletes` path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--paths", default="load,load_window,aggregate,every_key,deletes,window_small")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of all paths; ratios use each path's fastest")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: run one path in this process
    args = parser.parse_args()
    if args.run:
        result = _run_path(args.run)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    env = _prepare(WORK / "home", args.rows)
    results: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):  # rounds over all paths: a busy spell of the machine hits each path alike
        for path in args.paths.split(","):
            line = _measure(path, env)
            extra = ", ".join(f"{k} {v:,.0f}" for k, v in line.items() if k not in ("seconds", "peak_rss_mb"))
            print(f"{path:<13} {line['seconds']:>8.2f}s  peak RSS {line['peak_rss_mb']:>7,.0f} MB  {extra}", flush=True)
            key = "reconcile_s" if path == "load_window" else "seconds"
            if path not in results or line[key] < results[path][key]:
                results[path] = line
    if args.repeat > 1:
        print(f"fastest of {args.repeat} rounds:")
    _ratios(results)


def _prepare(home: Path, rows: int) -> dict[str, str]:
    import psycopg2

    from ingestion_assets.settings import Settings
    from ingestion_assets.stack.instance import bring_up

    settings = Settings(home=home, catalog_path=WORK / "reconcile_catalog.yaml")
    bring_up(settings)
    url = settings.embedded.ensure_database("bench")
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('bench_orders') IS NOT NULL")
        exists = bool(cur.fetchone()[0])  # type: ignore[index]
        count = 0
        if exists:
            cur.execute("SELECT count(*) FROM bench_orders")
            count = cur.fetchone()[0]  # type: ignore[index]
        if count != rows:
            began = time.monotonic()
            cur.execute(TABLE_SQL, {"rows": rows})
            conn.commit()
            conn.autocommit = True
            cur.execute("VACUUM (FREEZE, ANALYZE) bench_orders")
            print(f"seeded bench_orders with {rows:,} rows in {time.monotonic() - began:.1f}s", flush=True)
    conn.close()
    (WORK / "source_url").write_text(url)
    return {
        "INGEST_HOME": str(home),
        "DAGSTER_HOME": str(settings.dagster_home),
        "BENCH_SOURCE_URL": url,
        "BENCH_ROWS": str(rows),
    }


def _catalog(reconcile: str) -> Path:
    path = WORK / f"reconcile_catalog_{reconcile}.yaml"
    path.write_text(
        "destination: {type: duckdb, path: " + str(WORK / "reconcile.duckdb") + "}\n"
        "sources:\n  bench:\n    type: postgres\n    connection: {file: " + str(WORK / "source_url") + "}\n"
        "    streams:\n      orders: {table: public.bench_orders, primary_key: id, cursor: updated_at,"
        f" slice_rows: 500000, reconcile: {{scope: '{reconcile}'}}}}\n"
    )
    return path


def _measure(path: str, env: dict[str, str]) -> dict[str, float]:
    catalog = _catalog("window" if path == "load_window" else "off")
    out = subprocess.run(
        [sys.executable, __file__, "--run", path],
        env={**os.environ, **env, "INGEST_CATALOG": str(catalog)},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{path} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _run_path(path: str) -> dict[str, float]:
    if path in ("load", "load_window"):
        return _load()
    if path == "deletes":
        return _with_deletes()
    if path == "window_small":
        return _window_small()
    return _reconcile(every_key=path == "every_key")


def _load() -> dict[str, float]:
    """The initial load: empty target, no checkpoint; the run's own reconciliation included."""
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint

    settings = Settings.from_env()
    with dg.DagsterInstance.get() as instance:
        (WORK / "reconcile.duckdb").unlink(missing_ok=True)
        reset_checkpoint(instance, dg.AssetKey(["bench", "orders"]), None, reason="benchmark")
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        began = time.monotonic()
        result = dg.materialize(assets, instance=instance)
        seconds = time.monotonic() - began
    rows = result.asset_materializations_for_node("bench__orders")[0].metadata["rows read"].value
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    spent = check.metadata["seconds"].value if "seconds" in check.metadata else 0.0
    return {"seconds": seconds, "rows": float(rows), "reconcile_s": float(spent)}  # type: ignore[arg-type]


def _request(scope_name: str, deletes: str = "report", every_key: bool = False) -> Request:
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import latest_checkpoint
    from ingestion_assets.streams.postgres_table import Target
    from ingestion_assets.streams.reconcile import Scope

    settings = Settings.from_env()
    (stream,) = catalog_streams(settings, load_catalog(settings.catalog_path))
    with dg.DagsterInstance.get() as instance:
        checkpoint = latest_checkpoint(instance, dg.AssetKey(["bench", "orders"]), None)
    position = checkpoint.position if checkpoint is not None else None
    plan = stream.plan()
    loader = stream.loader(Target("orders", 1), None, plan)  # type: ignore[union-attr]
    scope = Scope(scope_name, cursor=tuple(plan.cursor), highest=position)
    return Request(os.environ["BENCH_SOURCE_URL"], plan, loader, scope, position, deletes, every_key)


def _reconcile(every_key: bool, deletes: str = "report") -> dict[str, float]:
    from ingestion_assets.streams.reconcile import reconcile

    request = _request("full", deletes, every_key)
    began = time.monotonic()
    found = reconcile(request)
    seconds = time.monotonic() - began
    assert found.passed, found
    return {
        "seconds": seconds,
        "source rows": found.source_rows,
        "buckets": found.buckets,
        "differing": found.buckets_differing,
        "diffed": found.keys_diffed,
        "deleted": found.deletions_applied,
    }


def _with_deletes() -> dict[str, float]:
    """Delete 0.1 % at the source, find and apply them; then put the rows back on both sides (not timed)."""
    import duckdb
    import psycopg2

    share, warehouse = DELETED_SHARE, str(WORK / "reconcile.duckdb")
    with duckdb.connect(warehouse) as con:
        con.execute(
            f"CREATE OR REPLACE TABLE bench.orders_deleted AS SELECT * FROM bench.orders WHERE id % {share} = 7"
        )
    conn = psycopg2.connect(os.environ["BENCH_SOURCE_URL"])
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS bench_deleted")
        cur.execute(f"CREATE TABLE bench_deleted AS SELECT * FROM bench_orders WHERE id % {share} = 7")
        cur.execute(f"DELETE FROM bench_orders WHERE id % {share} = 7")
    try:
        result = _reconcile(every_key=False, deletes="hard")
        assert result["deleted"] == int(os.environ["BENCH_ROWS"]) // share, result
    finally:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO bench_orders SELECT * FROM bench_deleted")
            cur.execute("DROP TABLE bench_deleted")
        conn.close()
        with duckdb.connect(warehouse) as con:
            con.execute("INSERT INTO bench.orders SELECT * FROM bench.orders_deleted")
            con.execute("DROP TABLE bench.orders_deleted")
    return result


def _window_small() -> dict[str, float]:
    """Change 1,000 rows and run the stream (not timed), then time the window check of what that run read."""
    import psycopg2

    from ingestion_assets.streams.reconcile import Request, Scope, reconcile

    before = _request("window")
    conn = psycopg2.connect(os.environ["BENCH_SOURCE_URL"])
    conn.autocommit = True
    with conn.cursor() as cur:
        step = max(int(os.environ["BENCH_ROWS"]) // 1000, 1)
        cur.execute(
            "UPDATE bench_orders SET status = 'paid', updated_at = clock_timestamp() WHERE id %% %s = 1", (step,)
        )
    conn.close()
    _incremental()
    after = _request("window")
    scope = Scope("window", cursor=after.scope.cursor, lowest=before.checkpoint, highest=after.checkpoint)
    request = Request(after.url, after.plan, after.loader, scope, after.checkpoint)
    began = time.monotonic()
    found = reconcile(request)
    seconds = time.monotonic() - began
    assert found.passed, found
    return {"seconds": seconds, "source rows": found.source_rows, "differing": found.buckets_differing}


def _incremental() -> None:
    import dagster as dg

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings

    settings = Settings.from_env()
    with dg.DagsterInstance.get() as instance:
        dg.materialize(build_stream_assets(settings, load_catalog(settings.catalog_path)), instance=instance)


def _ratios(results: dict[str, dict[str, float]]) -> None:
    """Each comparison against the initial load without reconciliation; the default window check of the
    initial load is timed inside that run (its own figure), so load-to-load noise does not enter it."""
    load = results.get("load")
    if not load:
        return
    for path, line in results.items():
        if path != "load":
            spent = line["reconcile_s"] if path == "load_window" else line["seconds"]
            print(
                f"{path:<13} / initial load: {spent / load['seconds']:.1%} ({spent:.2f}s against {load['seconds']:.2f}s)"
            )


if __name__ == "__main__":
    main()
