"""Benchmark: a ten-partition backfill into PostgreSQL, in one in-process run against Celery workers (1 and 2).

- `in_process`: one `dagster asset materialize --partition-range` run, Dagster's default executor: the ten
  key ranges one after another in one step (the CLI's way, `max_partitions_per_run: all`).
- `celery1` / `celery2`: ten runs, one per range (what a UI backfill with `max_partitions_per_run: 1`
  launches), all started at once; their steps execute on 1 or 2 Celery workers (one slot each) on the
  machine's Redis, under the source's pool (`max_concurrency`, default 4).

Every path loads a fresh target schema from its own checkpoints (a source name of its own); the time is the
wall clock from launching the runs to the last one ending, run process start-up included, workers already
up. Usage:

    .venv/bin/python bench/celery_backfill.py --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ingestion_assets.catalog import load_catalog  # noqa: E402
from ingestion_assets.defs.assets import catalog_streams  # noqa: E402
from ingestion_assets.defs.partitions import plan_key_partitions  # noqa: E402
from ingestion_assets.settings import Settings  # noqa: E402
from ingestion_assets.stack.instance import bring_up  # noqa: E402
from ingestion_assets.state.summary import open_instance, size_pools  # noqa: E402
from ingestion_assets_tests.celery_workers import celery_deployment  # noqa: E402

WORK = Path(__file__).resolve().parent / ".work" / "celery"
TABLE_SQL = """
DROP TABLE IF EXISTS bench_orders;
CREATE TABLE bench_orders (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, sku text NOT NULL, quantity int NOT NULL,
    unit_price numeric(12,2) NOT NULL, status text NOT NULL, note text, updated_at timestamptz NOT NULL
);
INSERT INTO bench_orders
SELECT g, 1 + g %% 50000, lpad((g %% 2000)::text, 6, '0'), 1 + g %% 5, round((1 + g * 3.7 %% 500)::numeric, 2),
       (ARRAY['placed','paid','shipped','delivered'])[1 + g %% 4], CASE WHEN g %% 10 = 0 THEN 'gift ' || g END,
       timestamptz '2024-01-01 00:00:00+00' + (g / 40) * interval '120 seconds 654321 microseconds'
FROM generate_series(1::bigint, %(rows)s) g;
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--paths", default="in_process,celery1,celery2")
    parser.add_argument("--max-concurrency", type=int, default=4)
    args = parser.parse_args()
    settings = Settings(home=WORK / "home", catalog_path=WORK / "catalog.yaml")
    bring_up(settings)
    source_url, target_url = _prepare(settings, args.rows)
    results: dict[str, tuple[float, float]] = {}
    for path in args.paths.split(","):
        seconds, steps = _measure(path, settings, source_url, target_url, args)
        results[path] = (args.rows / seconds, args.rows / steps)
        print(
            f"{path:<11} {args.rows:>10,} rows {seconds:>8.2f}s {results[path][0]:>8,.0f} rows/s"
            f"   steps phase {steps:>7.2f}s {results[path][1]:>8,.0f} rows/s",
            flush=True,
        )
    if "in_process" in results:
        base = results["in_process"]
        for path, (rate, step_rate) in results.items():
            print(f"ratio {path} / in_process: {rate / base[0]:.2f}x wall clock, {step_rate / base[1]:.2f}x steps phase")


def _prepare(settings: Settings, rows: int) -> tuple[str, str]:
    source_url = settings.embedded.ensure_database("bench")
    target_url = settings.embedded.ensure_database("bench_target")
    with psycopg2.connect(source_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'bench_orders'")
        count = 0
        if cur.fetchone()[0]:  # type: ignore[index]
            cur.execute("SELECT count(*) FROM bench_orders")
            count = cur.fetchone()[0]  # type: ignore[index]
        if count != rows:
            cur.execute(TABLE_SQL, {"rows": rows})
    return source_url, target_url


def _measure(
    path: str, settings: Settings, source_url: str, target_url: str, args: argparse.Namespace
) -> tuple[float, float]:
    """(wall clock, steps phase): the steps phase runs from the first step's start to the last step's end, in
    Dagster's event log, leaving out the run processes' start-up."""
    source_name = f"b_{path}_{uuid.uuid4().hex[:6]}"
    folder = WORK / source_name
    folder.mkdir(parents=True)
    (folder / "source_url").write_text(source_url)
    (folder / "target_url").write_text(target_url)
    celery = path.startswith("celery")
    catalog = _catalog(folder, source_name, args.rows, args.max_concurrency, per_run="all" if not celery else 1)
    with celery_deployment(folder / "celery") as deployment:
        if celery:
            raw = yaml.safe_load(catalog.read_text())
            raw["execution"] = deployment.execution()
            catalog.write_text(yaml.safe_dump(raw))
        run_settings = Settings(home=settings.home, catalog_path=catalog)
        keys = _plan(run_settings, source_name)
        if celery:
            for _ in range(int(path.removeprefix("celery"))):
                deployment.start_worker(catalog, settings.dagster_home)
            deployment.wait_ready()
        started = time.monotonic()
        runs = [["--partition", key] for key in keys] if celery else [["--partition-range", f"{keys[0]}...{keys[-1]}"]]
        processes = [_materialize(run_settings, source_name, folder, index, run) for index, run in enumerate(runs)]
        for index, process in enumerate(processes):
            if process.wait() != 0:
                log = (folder / f"run-{index}.log").read_text()[-4000:]
                raise SystemExit(f"{path}: run {index} failed:\n{log}")
        seconds = time.monotonic() - started
    _check_and_drop(target_url, source_name, args.rows)
    return seconds, _steps_phase(settings, source_name)


def _steps_phase(settings: Settings, source_name: str) -> float:
    import dagster as dg

    with open_instance(settings) as instance:
        starts: list[float] = []
        ends: list[float] = []
        for kind, into in ((dg.DagsterEventType.STEP_START, starts), (dg.DagsterEventType.STEP_SUCCESS, ends)):
            for record in instance.get_event_records(dg.EventRecordsFilter(event_type=kind), limit=500):
                if record.event_log_entry.step_key == f"{source_name}__orders":
                    into.append(record.event_log_entry.timestamp)
    return max(ends) - min(starts)


def _catalog(folder: Path, source_name: str, rows: int, max_concurrency: int, per_run: object) -> Path:
    stream = {
        "table": "public.bench_orders",
        "primary_key": "id",
        "cursor": "updated_at",
        "partitions": {"by": "key", "chunk": -(-(rows + 1) // 10), "live": False},  # ids 1..rows: ten ranges
        "max_partitions_per_run": per_run,
    }
    catalog = {
        "destination": {"type": "postgres", "credentials": {"file": str(folder / "target_url")}},
        "sources": {
            source_name: {
                "type": "postgres",
                "connection": {"file": str(folder / "source_url")},
                "max_concurrency": max_concurrency,
                "streams": {"orders": stream},
            }
        },
    }
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def _plan(settings: Settings, source_name: str) -> list[str]:
    catalog = load_catalog(settings.catalog_path)
    size_pools(settings, catalog)
    stream = next(s for s in catalog_streams(settings, catalog) if s.source_name == source_name)
    with open_instance(settings) as instance:
        return plan_key_partitions(stream, instance)  # type: ignore[arg-type]


def _materialize(
    settings: Settings, source_name: str, folder: Path, index: int, partition: list[str]
) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-m", "ingestion_assets.definitions"]
    env = {
        **os.environ,
        "INGEST_HOME": str(settings.home),
        "INGEST_CATALOG": str(settings.catalog_path),
        "DAGSTER_HOME": str(settings.dagster_home),
    }
    with (folder / f"run-{index}.log").open("wb") as log:
        return subprocess.Popen(
            [*command, "--select", f"{source_name}/orders", *partition], env=env, stdout=log, stderr=subprocess.STDOUT
        )


def _check_and_drop(target_url: str, schema: str, rows: int) -> None:
    """Every row arrived once (the tests compare row by row; here the count guards the figure)."""
    with psycopg2.connect(target_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT count(*), count(DISTINCT id) FROM "{schema}".orders')
        count, distinct = cur.fetchone()  # type: ignore[misc]
        cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    if count != rows or distinct != rows:
        raise SystemExit(f"{schema}: the target holds {count} rows ({distinct} keys), the source {rows}")


if __name__ == "__main__":
    main()
