"""`python -m ingestion_assets_tests.simulation [--seed N | --runs N] [--unsafe]` on its own embedded PostgreSQL."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets_tests.simulation.api import ApiSimulation
from ingestion_assets_tests.simulation.cdc import CdcSimulation
from ingestion_assets_tests.simulation.cdc_live import LiveCdcSimulation
from ingestion_assets_tests.simulation.files import FilesSimulation
from ingestion_assets_tests.simulation.harness import Simulation, SimulationFailure

KINDS = ("table", "api", "cdc", "cdch", "cdcl", "files")  # cdch: history partitions; cdcl: live runs; files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, help="replay one seed exactly")
    parser.add_argument("--runs", type=int, default=20, help="how many seeds, from --start")
    parser.add_argument("--start", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6, help="source changes and crashing syncs per seed")
    parser.add_argument("--kind", choices=[*KINDS, "all"], default="all", help="which stream to simulate")
    parser.add_argument("--unsafe", action="store_true", help="the broken protocol: checkpoint before the load")
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.runs))
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    root = Path(tempfile.mkdtemp(prefix="ingest-sim-"))
    server = EmbeddedPostgres(root / "pg").ensure_running()
    failures = crashes = 0
    began = time.monotonic()
    try:
        url = server.ensure_database("sim")
        for seed, kind in [(seed, kind) for seed in seeds for kind in kinds]:
            simulation: Simulation | ApiSimulation | CdcSimulation | FilesSimulation
            if kind == "table":
                simulation = Simulation(seed, url, root, unsafe=args.unsafe)
            elif kind == "api":
                simulation = ApiSimulation(seed, root, unsafe=args.unsafe)
            elif kind == "cdcl":
                simulation = LiveCdcSimulation(seed, url, root, unsafe=args.unsafe)
            elif kind == "files":
                simulation = FilesSimulation(seed, root, unsafe=args.unsafe)
            else:
                simulation = CdcSimulation(seed, url, root, unsafe=args.unsafe, history=kind == "cdch")
            seed_began = time.monotonic()
            try:
                events = simulation.run(rounds=args.rounds)
            except SimulationFailure as failure:
                failures += 1
                print(f"FAIL seed {seed} ({kind}): {failure}")
                continue
            except Exception as error:  # noqa: BLE001 - the product raised: that seed fails, the others still run
                failures += 1
                print(f"FAIL seed {seed} ({kind}): {type(error).__name__}: {error}; replay: {simulation.replay}")
                continue
            crashes += sum(e.startswith("crash") for e in events)
            print(
                f"ok   seed {seed} ({simulation.mode}{_detection(simulation)}): {len(events)} events "
                f"[{hashlib.sha256(chr(10).join(events).encode()).hexdigest()[:10]}], "
                f"{sum(e.startswith('crash') for e in events)} crashes survived, {time.monotonic() - seed_began:.0f}s"
            )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - began
    print(f"{len(seeds)} seed(s) x {len(kinds)} kind(s): {crashes} crashes survived, {failures} failed, {elapsed:.0f}s")
    return 1 if failures else 0


def _detection(simulation: object) -> str:
    detect = getattr(simulation, "detect", None)
    return f", deletes detected {detect}" if detect else ""


if __name__ == "__main__":
    sys.exit(main())
