"""`python -m ingestion_assets_tests.chaos [--trials N] [--seed S]`: kills and server crashes, then a row-by-row
comparison; exits 1 if any row is lost, stale, duplicated or not deleted."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ingestion_assets_tests.chaos.run import Chaos, ChaosConfig


def main() -> int:
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=defaults.trials)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--restart-share", type=float, default=defaults.restart_share)
    parser.add_argument("--horizon", type=float, default=defaults.horizon, help="faults land within N s of a start")
    parser.add_argument("--keep", action="store_true", help="keep INGEST_HOME (logs, warehouse) for a look")
    args = parser.parse_args()
    config = ChaosConfig(trials=args.trials, seed=args.seed, restart_share=args.restart_share, horizon=args.horizon)
    home = Path(tempfile.mkdtemp(prefix="ingest-chaos-"))
    began = time.monotonic()
    chaos = Chaos(home, config)
    try:
        report = chaos.run(say=lambda line: print(line, flush=True))
    finally:
        chaos.settings.embedded.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    print(f"chaos seed {config.seed}, {time.monotonic() - began:.0f}s" + (f", kept {home}" if args.keep else ""))
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
