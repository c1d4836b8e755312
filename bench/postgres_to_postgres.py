"""Benchmark: a PostgreSQL table into a PostgreSQL destination: the product vs Sling vs stock dlt vs raw COPY.

Source and target are two databases of one embedded server (the bench's INGEST_HOME). Each path runs in its
own process, one after another in the same run: first the full loads, then 10 % of the source rows are
updated and each path runs its incremental upsert. Paths:

- raw: `psql COPY … (format binary) | psql COPY` into a table with the same primary key (incremental: the
  changed rows into a temporary table, then INSERT … ON CONFLICT, in one psql session);
- sling: Sling 1.4.11 (`pip install sling-linux-amd64==1.4.11`; skipped when it is not installed),
  full-refresh, then incremental with primary key and update key;
- dlt: stock `sql_table` (pyarrow backend, incremental on updated_at, merge) into dlt's postgres destination;
- product: the stream's Dagster asset materialized in-process (`dg.materialize`, checkpoints in the
  PostgreSQL-backed instance), i.e. the product's run path without the CLI's process start; with the
  default `reconcile: window` (the first run's window is the whole table) unless `--reconcile off`;
- backfill1 / backfill2: the product on 10 key-range partitions, in one run or in two worker processes.

    .venv/bin/python bench/postgres_to_postgres.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# A PYTHONPATH naming a checkout wins over this one (appended last): one bench, one server, two branches.
sys.path.insert(
    len(sys.path)
    if any(Path(p, "ingestion_assets").is_dir() for p in os.environ.get("PYTHONPATH", "").split(":"))
    else 0,
    str(Path(__file__).resolve().parent.parent),
)

from postgres_to_duckdb import TABLE_SQL

WORK = Path(__file__).resolve().parent / ".work" / "pg2pg"
SOURCE_TABLE = "bench_orders"
CHANGED = "UPDATE bench_orders SET status = 'changed', updated_at = updated_at + interval '400 days' WHERE id % 10 = 0"
FULL = ("raw", "sling", "dlt", "product")
DEFAULT_PATHS = "raw,sling,dlt,product,update,raw_inc,sling_inc,dlt_inc,product_inc,backfill1,backfill2"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--paths", default=DEFAULT_PATHS)
    parser.add_argument("--reconcile", default="window", help="the stream's reconcile scope (window: the default)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: run one path in this process
    args = parser.parse_args()
    if args.run:
        print(json.dumps(_run_path(args.run)))
        return
    import ingestion_assets

    print(f"ingestion_assets from {Path(ingestion_assets.__file__).parent.parent}", flush=True)
    env = _prepare(args.rows, args.reconcile)
    results: dict[str, dict[str, float]] = {}
    for path in args.paths.split(","):
        if path == "update":
            _source_execute(env["BENCH_SOURCE_URL"], CHANGED)
            continue
        if path.startswith("sling") and _sling() is None:
            print(f"{path:<12} skipped: sling-linux-amd64 is not installed", flush=True)
            continue
        results[path] = _measure(path, env)
        line = results[path]
        print(
            f"{path:<12} {line['rows']:>10,.0f} rows {line['seconds']:>8.2f}s {line['rows_per_s']:>11,.0f} rows/s",
            flush=True,
        )
    _ratios(results)


def _prepare(rows: int, reconcile: str) -> dict[str, str]:
    import psycopg2

    from ingestion_assets.settings import Settings
    from ingestion_assets.stack.instance import bring_up

    WORK.mkdir(parents=True, exist_ok=True)
    settings = Settings(home=WORK / "home", catalog_path=WORK / "catalog.yaml")
    bring_up(settings)
    source, target = settings.embedded.ensure_database("bench_src"), settings.embedded.ensure_database("bench_dst")
    began = time.monotonic()
    with psycopg2.connect(source) as conn, conn.cursor() as cur:
        cur.execute(TABLE_SQL, {"rows": rows})  # seeded afresh: the incremental paths changed it last time
    _source_execute(source, "VACUUM (FREEZE, ANALYZE) bench_orders")
    print(f"seeded bench_orders with {rows:,} rows in {time.monotonic() - began:.1f}s", flush=True)
    with psycopg2.connect(target) as conn, conn.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS raw CASCADE; DROP SCHEMA IF EXISTS sling CASCADE")
        cur.execute("DROP SCHEMA IF EXISTS stock CASCADE; DROP SCHEMA IF EXISTS stock_staging CASCADE")
        for schema in ("bench", "bench_staging", "bench_bf", "bench_bf_staging"):
            cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        cur.execute("CREATE SCHEMA raw; CREATE SCHEMA sling")
    (WORK / "source_url").write_text(source)
    (WORK / "target_url").write_text(target)
    stream = "{table: public.bench_orders, primary_key: id, cursor: updated_at, slice_rows: 500000"
    stream += f", reconcile: {{scope: '{reconcile}'}}"  # quoted: YAML reads a bare off as false
    head = f"destination: {{type: postgres, credentials: {{file: {WORK / 'target_url'}}}}}\nsources:\n"
    connection = f"    type: postgres\n    connection: {{file: {WORK / 'source_url'}}}\n    streams:\n"
    (WORK / "catalog.yaml").write_text(head + "  bench:\n" + connection + f"      orders: {stream}}}\n")
    partitions = f", partitions: {{by: key, chunk: {max(rows // 10, 1)}, live: false}}}}"
    (WORK / "catalog_backfill.yaml").write_text(
        head + "  bench_bf:\n" + connection + f"      orders: {stream}{partitions}\n"
    )
    return {
        "INGEST_HOME": str(settings.home),
        "INGEST_CATALOG": str(WORK / "catalog.yaml"),
        "DAGSTER_HOME": str(settings.dagster_home),
        "BENCH_SOURCE_URL": source,
        "BENCH_TARGET_URL": target,
    }


def _source_execute(url: str, statement: str) -> None:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(statement)
    conn.close()


def _measure(path: str, env: dict[str, str]) -> dict[str, float]:
    if path == "backfill2":
        from bench_backfill import two_workers

        result = two_workers(__file__, {**os.environ, **env, "INGEST_CATALOG": str(WORK / "catalog_backfill.yaml")})
    else:
        extra = {"INGEST_CATALOG": str(WORK / "catalog_backfill.yaml")} if path == "backfill1" else {}
        out = subprocess.run(
            [sys.executable, __file__, "--run", path],
            env={**os.environ, **env, **extra},
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"{path} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
    result["rows_per_s"] = result["rows"] / result["seconds"] if result["seconds"] else 0.0
    return result


def _run_path(path: str) -> dict[str, float]:
    source, target = os.environ["BENCH_SOURCE_URL"], os.environ["BENCH_TARGET_URL"]
    incremental = path.endswith("_inc")
    name = path.removesuffix("_inc")
    if name == "raw":
        return _raw(source, target, incremental)
    if name == "sling":
        return _sling_run(source, target, incremental)
    if name == "dlt":
        return _stock_dlt(source, target, incremental)
    if name == "product":
        return _product(reset=not incremental)
    from bench_backfill import plan, run_range

    if path == "backfill_plan":
        return plan("bench_bf", target)  # type: ignore[return-value]
    if path.startswith("backfill_worker:"):
        _, first, last = path.split(":")
        return run_range("bench_bf", first, last)
    keys = plan("bench_bf", target)["keys"]
    return run_range("bench_bf", keys[0], keys[-1])  # backfill1: every range in one run


def _psql() -> str:
    from ingestion_assets.settings import Settings

    return str(Settings.from_env().embedded.bin_dir() / "psql")  # the binaries the bench's server runs


def _raw(source: str, target: str, incremental: bool) -> dict[str, float]:
    """The physical limit: binary COPY out of one server and into the other, nothing in between."""
    import psycopg2

    ddl = TABLE_SQL.split("CREATE TABLE bench_orders", 1)[1].split(";", 1)[0]
    select = "SELECT * FROM bench_orders"
    with psycopg2.connect(target) as conn, conn.cursor() as cur:
        if not incremental:
            cur.execute(f"DROP TABLE IF EXISTS raw.orders; CREATE TABLE raw.orders {ddl}")
        else:
            cur.execute("SELECT max(updated_at)::text FROM raw.orders")
            select += f" WHERE updated_at > '{cur.fetchone()[0]}'"  # type: ignore[index]
    out = [_psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", source, "-c", f"\\copy ({select}) to stdout (format binary)"]
    if incremental:
        update = ", ".join(f"{c} = EXCLUDED.{c}" for c in _columns(ddl) if c != "id")
        into = [
            "-c", "CREATE TEMP TABLE stage (LIKE raw.orders)",
            "-c", "\\copy stage from stdin (format binary)",
            "-c", f"INSERT INTO raw.orders SELECT * FROM stage ON CONFLICT (id) DO UPDATE SET {update}",
        ]  # fmt: skip
    else:
        into = ["-c", "\\copy raw.orders from stdin (format binary)"]
    began = time.monotonic()
    reader = subprocess.Popen(out, stdout=subprocess.PIPE)
    subprocess.run([_psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", target, *into], stdin=reader.stdout, check=True)
    reader.wait()
    seconds = time.monotonic() - began
    return {"rows": float(_count(source, select)), "seconds": seconds}


def _columns(ddl: str) -> list[str]:
    return [part.strip().split()[0] for part in ddl.strip().strip("()").split(",") if part.strip()[:1].isalpha()]


def _count(url: str, select: str) -> int:
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM ({select}) s")
        return int(cur.fetchone()[0])  # type: ignore[index]


def _sling() -> str | None:
    found = shutil.which("sling")
    if found:
        return found
    try:
        import sling_linux_amd64  # type: ignore[import-not-found]
    except ImportError:
        return None
    binary = Path(sling_linux_amd64.__file__).parent / "bin" / "sling-linux-amd64"
    return str(binary) if binary.exists() else None


def _sling_run(source: str, target: str, incremental: bool) -> dict[str, float]:
    sling = _sling()
    assert sling is not None
    mode = ["--mode", "incremental", "--primary-key", "id", "--update-key", "updated_at"]
    command = [sling, "run", "--src-conn", "BENCH_SRC", "--src-stream", "public.bench_orders"]
    command += ["--tgt-conn", "BENCH_DST", "--tgt-object", "sling.orders"]
    command += mode if incremental else ["--mode", "full-refresh"]
    env = {
        **os.environ,
        "BENCH_SRC": source + "?sslmode=disable",
        "BENCH_DST": target + "?sslmode=disable",
        "SLING_HOME_DIR": str(WORK / "sling_home"),
        "SLING_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
    }
    began = time.monotonic()
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if out.returncode != 0:
        raise SystemExit(f"sling failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    select = "SELECT * FROM bench_orders" + (" WHERE id % 10 = 0" if incremental else "")
    return {"rows": float(_count(source, select)), "seconds": seconds}


def _stock_dlt(source: str, target: str, incremental: bool) -> dict[str, float]:
    """Stock dlt: sql_table with the pyarrow backend, incremental on updated_at, merge on the primary key."""
    import dlt
    from dlt.sources.sql_database import sql_table

    pipelines = WORK / "dlt_pipelines"
    if not incremental:
        shutil.rmtree(pipelines, ignore_errors=True)
    began = time.monotonic()
    resource_ = sql_table(
        credentials=source.replace("postgresql://", "postgresql+psycopg2://"),
        table="bench_orders",
        schema="public",
        backend="pyarrow",
        chunk_size=100_000,
        incremental=dlt.sources.incremental("updated_at"),
        write_disposition="merge",
        primary_key="id",
    )
    pipeline = dlt.pipeline(
        pipeline_name="bench_pg2pg_stock",
        destination=dlt.destinations.postgres(target.replace("postgres@", "postgres:trust@")),  # trust auth
        dataset_name="stock",
        pipelines_dir=str(pipelines),
    )
    info = pipeline.run(resource_)
    seconds = time.monotonic() - began
    assert not info.has_failed_jobs
    rows = pipeline.last_trace.last_normalize_info.row_counts.get("bench_orders", 0)
    return {"rows": float(rows), "seconds": seconds}


def _product(reset: bool) -> dict[str, float]:
    import dagster as dg
    from bench_backfill import warm_step_imports

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import build_stream_assets
    from ingestion_assets.settings import Settings
    from ingestion_assets.state.checkpoints import reset_checkpoint

    settings = Settings.from_env()
    key = dg.AssetKey(["bench", "orders"])
    with dg.DagsterInstance.get() as instance:
        if reset:
            reset_checkpoint(instance, key, None, reason="benchmark")
        assets = build_stream_assets(settings, load_catalog(settings.catalog_path))
        warm_step_imports()
        began = time.monotonic()
        result = dg.materialize(assets, instance=instance)
        seconds = time.monotonic() - began
    rows = result.asset_materializations_for_node("bench__orders")[0].metadata["rows read"].value
    return {"rows": float(rows), "seconds": seconds}  # type: ignore[arg-type]


def _ratios(results: dict[str, dict[str, float]]) -> None:
    for suffix, label in (("", "full load"), ("_inc", "10% incremental upsert")):
        product = results.get("product" + suffix)
        if not product:
            continue
        for baseline in ("sling", "dlt", "raw"):
            other = results.get(baseline + suffix)
            if other and other["rows_per_s"]:
                ratio = product["rows_per_s"] / other["rows_per_s"]
                print(f"{label}: product / {baseline:<5} throughput ratio: {ratio:.2f}x")
    if "backfill2" in results:
        for baseline in ("backfill1", "product"):
            if baseline in results:
                ratio = results["backfill2"]["rows_per_s"] / results[baseline]["rows_per_s"]
                print(f"backfill 10 ranges, 2 workers / {baseline} throughput ratio: {ratio:.2f}x")


if __name__ == "__main__":
    main()
