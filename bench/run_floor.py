"""Benchmark: a no-change run of one stream against Dagster's floor, two whole processes side by side.

Both are `dagster asset materialize` on the same instance: our stream with nothing new to read, and a
trivial asset that returns at once. Rounds alternate so a noisy machine hits both alike. Usage:

    .venv/bin/python bench/run_floor.py --rounds 5
    .venv/bin/python bench/run_floor.py --rounds 5 --in-process  # also both under Dagster's in-process executor
    .venv/bin/python bench/run_floor.py --definitions 5   # only loading the code location, in fresh processes

`--in-process` shows what the step subprocess of Dagster's default (multiprocess) executor costs each: the
same two assets with `in_process_executor`, which the product does not pick (BENCHMARKS.md says why).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORK = Path(__file__).resolve().parent / ".work" / "floor"
TRIVIAL = """
import dagster as dg


@dg.asset(key=["floor", "trivial"])
def trivial() -> None:
    return None


defs = dg.Definitions(assets=[trivial])
"""
IN_PROCESS = """
import dagster as dg

import ingestion_assets.definitions as ours


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions.merge(ours.defs(), dg.Definitions(executor=dg.in_process_executor))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--definitions", type=int, default=0, help="rounds of loading the definitions only")
    parser.add_argument("--in-process", action="store_true", help="also both assets under the in-process executor")
    args = parser.parse_args()
    env = _prepare(args.rows)
    if args.definitions:
        _definitions_load(env, args.definitions)
        return
    cases = {
        "no-change stream run": ["-m", "ingestion_assets.definitions", "--select", "floor/items"],
        "trivial asset run": ["-f", str(WORK / "trivial_defs.py"), "--select", "floor/trivial"],
    }
    if args.in_process:
        cases["stream, in-process"] = ["-f", str(WORK / "in_process_defs.py"), "--select", "floor/items"]
        cases["trivial, in-process"] = ["-f", str(WORK / "trivial_in_process.py"), "--select", "floor/trivial"]
    for target in cases.values():  # the first load, and each asset's first run, are not measured
        _materialize(target, env)
    runs: dict[str, list[Timing]] = {what: [] for what in cases}
    for _ in range(args.rounds):
        for what, target in cases.items():
            runs[what].append(_materialize(target, env))
    for what, timings in runs.items():
        print(
            f"{what:<21} median {_median(timings, 'wall'):6.2f}s wall, {_median(timings, 'cpu'):6.2f}s cpu  "
            f"(wall: {', '.join(f'{t.wall:.2f}' for t in timings)}; cpu: {', '.join(f'{t.cpu:.2f}' for t in timings)})"
        )
    pairs = [("no-change stream run", "trivial asset run")]
    if args.in_process:
        pairs += [("stream, in-process", "trivial asset run"), ("stream, in-process", "trivial, in-process")]
    for ours, floor in pairs:
        wall = _median(runs[ours], "wall") / _median(runs[floor], "wall")
        cpu = _median(runs[ours], "cpu") / _median(runs[floor], "cpu")
        print(f"{ours} / {floor}: {wall:.2f}x in wall time, {cpu:.2f}x in cpu time")
    print(f"load average {os.getloadavg()[0]:.1f}")


def _median(timings: list[Timing], what: str) -> float:
    return statistics.median(getattr(t, what) for t in timings)


LOAD = "import time, dagster; began = time.monotonic(); {load}; print(time.monotonic() - began)"


def _definitions_load(env: dict[str, str], rounds: int) -> None:
    """What every Dagster process of the code location pays before any step: import and build the definitions
    (after `import dagster`, which the floor pays too), against the trivial asset's module."""
    ours = "from ingestion_assets.definitions import defs; defs()"
    trivial = f"import runpy; runpy.run_path({str(WORK / 'trivial_defs.py')!r})"
    timings: dict[str, list[float]] = {"ours": [], "trivial": []}
    for _ in range(rounds):
        for name, load in (("ours", ours), ("trivial", trivial)):
            done = subprocess.run(
                [sys.executable, "-c", LOAD.format(load=load)], env=env, check=True, capture_output=True, text=True
            )
            timings[name].append(float(done.stdout.strip().splitlines()[-1]))
    o, f = statistics.median(timings["ours"]), statistics.median(timings["trivial"])
    print(f"load our definitions     median {o:6.2f}s  (runs: {', '.join(f'{s:.2f}' for s in timings['ours'])})")
    print(f"load the trivial asset   median {f:6.2f}s  (load average {os.getloadavg()[0]:.1f})")


def _prepare(rows: int) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import psycopg2

    from ingestion_assets.settings import Settings
    from ingestion_assets.stack.instance import bring_up

    WORK.mkdir(parents=True, exist_ok=True)
    settings = Settings(home=WORK / "home", catalog_path=WORK / "catalog.yaml")
    bring_up(settings)
    url = settings.embedded.ensure_database("floor")
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "DROP TABLE IF EXISTS floor_items; CREATE TABLE floor_items (id bigint PRIMARY KEY, name text,"
            " updated_at timestamptz NOT NULL);"
            " INSERT INTO floor_items SELECT g, 'item ' || g, timestamptz '2024-01-01' + g * interval '1 second'"
            " FROM generate_series(1, %s) g",
            (rows,),
        )
    (WORK / "source_url").write_text(url)
    (WORK / "trivial_defs.py").write_text(TRIVIAL)
    (WORK / "trivial_in_process.py").write_text(
        TRIVIAL.replace("assets=[trivial]", "assets=[trivial], executor=dg.in_process_executor")
    )
    (WORK / "in_process_defs.py").write_text(IN_PROCESS)
    (WORK / "catalog.yaml").write_text(
        "destination: {type: duckdb, path: " + str(WORK / "warehouse.duckdb") + "}\n"
        "sources:\n  floor:\n    type: postgres\n    connection: {file: " + str(WORK / "source_url") + "}\n"
        "    streams:\n      items: {table: public.floor_items, primary_key: id, cursor: updated_at}\n"
    )
    return {
        **os.environ,
        "INGEST_HOME": str(settings.home),
        "INGEST_CATALOG": str(WORK / "catalog.yaml"),
        "DAGSTER_HOME": str(settings.dagster_home),
    }


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float  # user + system seconds of the CLI process and its step process (not the storage server's)


def _materialize(target: list[str], env: dict[str, str]) -> Timing:
    dagster = str(Path(sys.executable).with_name("dagster"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run([dagster, "asset", "materialize", *target], env=env, check=True, capture_output=True, cwd=WORK)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Timing(wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    main()
