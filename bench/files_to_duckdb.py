"""Benchmark: files (CSV and Parquet) into DuckDB through the files stream, stock dlt's `filesystem` source,
and DuckDB's own read_csv / read_parquet of the same files (the physical limit).

Each path runs in its own process (peak RSS its own), one after another in the same run, on the same files,
so the ratios compare like with like on a noisy machine. Usage:

    .venv/bin/python bench/files_to_duckdb.py --rows 5000000
    .venv/bin/python bench/files_to_duckdb.py --rows 1000000 --paths duckdb_csv,stream_csv
    .venv/bin/python bench/files_to_duckdb.py --rows 5000000 --paths duckdb_parquetday,stream_parquetday

The `parquetday` paths read one day of `placed_at` (the rows span ~170 days): the stream as a partition of
`partitions: {by: time, column: placed_at}`, whose Parquet row groups outside the day are skipped by their
statistics, against DuckDB's read_parquet with the same WHERE (which skips them too).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORK = Path(__file__).resolve().parent / ".work" / "files"
FILES = 10  # the rows are split over this many files of each format
PATHS = "duckdb_csv,stream_csv,dlt_csv,duckdb_parquet,stream_parquet,dlt_parquet"
DAY = "2024-02-01"  # the partition the `parquetday` paths read


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--paths", default=PATHS)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: run one path in this process
    args = parser.parse_args()
    if args.run:
        result = _run_path(args.run)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    _prepare(args.rows)
    results: dict[str, dict[str, Any]] = {}
    for path in args.paths.split(","):
        out = subprocess.run([sys.executable, __file__, "--run", path], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{path:16} failed: {out.stderr.strip().splitlines()[-1][:300]}")
            continue
        results[path] = json.loads(out.stdout.strip().splitlines()[-1])
        line = results[path]
        print(
            f"{path:16} {line['rows']:>10,} rows {line['seconds']:8.1f} s {line['rows'] / line['seconds']:>12,.0f} rows/s  peak RSS {line['peak_rss_mb']:.0f} MB"
        )
    for kind in ("csv", "parquet", "parquetday"):
        floor = results.get(f"duckdb_{kind}")
        for path in (f"stream_{kind}", f"dlt_{kind}"):
            if floor and path in results:
                print(f"{path} / duckdb_{kind}: {results[path]['seconds'] / floor['seconds']:.1f}x the time")
        if f"stream_{kind}" in results and f"dlt_{kind}" in results:
            ratio = results[f"dlt_{kind}"]["seconds"] / results[f"stream_{kind}"]["seconds"]
            print(f"dlt_{kind} / stream_{kind}: {ratio:.2f}x the time")


def _prepare(rows: int) -> None:
    """The same rows as CSV and as Parquet (row groups of 100k), FILES files each."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    marker = WORK / f"rows-{rows}"
    if marker.exists():
        return
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "csv").mkdir(parents=True)
    (WORK / "parquet").mkdir(parents=True)
    per_file = rows // FILES
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    for number in range(FILES):
        ids = pa.array(range(number * per_file + 1, (number + 1) * per_file + 1), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "customer_id": pc.add(pc.divide(ids, 100), 1),
                "sku": pc.binary_join_element_wise("sku-", pc.cast(pc.bit_wise_and(ids, 2047), pa.string()), ""),
                "quantity": pc.add(pc.bit_wise_and(ids, 7), 1),
                "unit_price": pc.divide(pc.cast(pc.bit_wise_and(ids, 65535), pa.float64()), 100.0),
                "status": pc.take(pa.array(["placed", "paid", "shipped", "delivered"]), pc.bit_wise_and(ids, 3)),
                "placed_at": pc.cast(
                    pc.add(pc.multiply(ids, 3_000_000), int(start.timestamp() * 1e6)), pa.timestamp("us", "UTC")
                ),
            }
        )
        pacsv.write_csv(table, WORK / "csv" / f"part-{number:03}.csv")
        pq.write_table(table, WORK / "parquet" / f"part-{number:03}.parquet", row_group_size=100_000)
    marker.touch()


def _run_path(path: str) -> dict[str, Any]:
    kind = path.split("_", 1)[1]
    target = WORK / f"{path}.duckdb"
    target.unlink(missing_ok=True)
    _import_for(path)  # the imports are not timed: each path's process pays its own
    began = time.monotonic()
    if path.startswith("duckdb_"):
        rows = _duckdb(kind, target)
    elif path.startswith("stream_"):
        rows = _stream(kind, target)
    else:
        rows = _dlt(kind, target)
    return {"rows": rows, "seconds": time.monotonic() - began}


def _import_for(path: str) -> None:
    import duckdb  # noqa: F401

    if path.startswith("stream_"):
        import ingestion_assets.defs.assets
        import ingestion_assets.streams.runner  # noqa: F401
    elif path.startswith("dlt_"):
        import dlt
        import dlt.sources.filesystem  # noqa: F401


def _duckdb(kind: str, target: Path) -> int:
    import duckdb

    reader = "read_csv" if kind == "csv" else "read_parquet"
    folder, where = (WORK / "parquet", _day_filter()) if kind == "parquetday" else (WORK / kind, "")
    suffix = "csv" if kind == "csv" else "parquet"
    with duckdb.connect(str(target)) as con:
        con.execute(f"CREATE TABLE orders AS SELECT * FROM {reader}('{folder}/*.{suffix}') {where}")
        return int(con.execute("SELECT count(*) FROM orders").fetchone()[0])  # type: ignore[index]


def _stream(kind: str, target: Path) -> int:
    import yaml

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.settings import Settings
    from ingestion_assets.streams.runner import PartitionJob

    home = WORK / f"home-{kind}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    spec: dict[str, Any] = {"path": f"*.{kind}", "primary_key": "id"}
    partition = None
    if kind == "parquetday":  # one day of a partitioning by placed_at
        spec = {"path": "*.parquet", "primary_key": "id", "partitions": {"by": "time", "column": "placed_at"}}
        spec["partitions"]["start"], partition, kind = "2024-01-01", DAY, "parquet"
    catalog = {
        "destination": {"type": "duckdb", "path": str(target)},
        "sources": {"drops": {"type": "files", "url": str(WORK / kind), "streams": {"orders": spec}}},
    }
    (home / "catalog.yaml").write_text(yaml.safe_dump(catalog))
    settings = Settings(home=home, catalog_path=home / "catalog.yaml")
    stream = catalog_streams(settings, load_catalog(home / "catalog.yaml"))[0]
    outcome = PartitionJob(stream, _MemoryStore(), partition, run_id="bench").run()
    return outcome.result.rows


def _day_filter() -> str:
    day = dt.date.fromisoformat(DAY)
    return f"WHERE placed_at >= '{day}T00:00:00Z' AND placed_at < '{day + dt.timedelta(days=1)}T00:00:00Z'"


class _MemoryStore:
    """Checkpoints kept in memory: the benchmark times the stream, not Dagster's storage."""

    def __init__(self) -> None:
        self.saved: Any = None

    def latest(self, partition: str | None) -> Any:
        return self.saved

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None:
        from ingestion_assets.state.model import Checkpoint

        self.saved = Checkpoint(position, "bench", dt.datetime.now(dt.UTC), 0, details)


def _dlt(kind: str, target: Path) -> int:
    import dlt
    from dlt.sources.filesystem import filesystem, read_csv_duckdb, read_parquet

    pipelines = WORK / "dlt-pipelines"
    shutil.rmtree(pipelines, ignore_errors=True)
    files = filesystem(bucket_url=f"file://{WORK / kind}", file_glob=f"*.{kind}")
    reader = (files | read_csv_duckdb()) if kind == "csv" else (files | read_parquet())
    pipeline = dlt.pipeline(
        pipeline_name=f"bench_files_{kind}",
        pipelines_dir=str(pipelines),
        destination=dlt.destinations.duckdb(str(target)),
        dataset_name="drops",
    )
    pipeline.run(reader.with_name("orders"), write_disposition="merge", primary_key="id")
    with pipeline.sql_client() as client:
        return int(client.execute_sql("SELECT count(*) FROM orders")[0][0])


if __name__ == "__main__":
    main()
