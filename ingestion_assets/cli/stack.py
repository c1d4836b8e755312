"""`ingest up`, `down`, `env`, `dev`, `demo`: the embedded stack and the demo."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from ingestion_assets.catalog import load_catalog
from ingestion_assets.cli.common import DEFINITIONS_MODULE, bring_up, exports, sibling, uses_demo_api
from ingestion_assets.cli.demo_runs import materialize_all
from ingestion_assets.cli.progress import working
from ingestion_assets.cli.supervise import run_supervised
from ingestion_assets.settings import Settings


def up(settings: Settings, _args: argparse.Namespace) -> int:
    env = bring_up(settings)
    print(exports(env))
    return 0


def down(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack.demo_api import DemoApiProcess

    DemoApiProcess.for_settings(settings).stop()
    settings.embedded.stop()
    print(f"stopped the embedded PostgreSQL under {settings.embedded.root}")
    return 0


def env(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack.instance import instance_env

    print(exports(instance_env(settings)))
    return 0


def dev(settings: Settings, args: argparse.Namespace) -> int:
    env = bring_up(settings)
    extra = args.dagster_args[1:] if args.dagster_args[:1] == ["--"] else args.dagster_args
    command = [sibling("dagster"), "dev", "-m", DEFINITIONS_MODULE, *extra]
    print(f"DAGSTER_HOME={env['DAGSTER_HOME']} {shlex.join(command)}", file=sys.stderr)
    # SIGTERM or Ctrl-C stops every process it started
    return run_supervised(command, {**os.environ, **env}, cwd=_away_from_other_config(Path(env["DAGSTER_HOME"])))


def _away_from_other_config(home: Path) -> Path | None:
    """`dagster dev` warns about a dagster.yaml in the current folder that is not DAGSTER_HOME's (the repository
    root holds the deployment's): run it from DAGSTER_HOME then; elsewhere from here (relative arguments work)."""
    here = Path.cwd()
    found = any((here / name).exists() for name in ("dagster.yaml", "dagster.yml"))
    return home if found and here.resolve() != home.resolve() else None


def demo(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.demo.seed import ShopSize, seed_shop, simulate_activity

    env = bring_up(settings)
    shop_url = settings.embedded.ensure_database("shop")
    began = time.monotonic()
    with working(f"seeding the demo database `shop` ({args.orders:,} orders)"):
        seed_shop(shop_url, ShopSize(orders=args.orders))
    print(f"seeded the demo database `shop` ({args.orders:,} orders) in {time.monotonic() - began:.1f}s")
    for round_number, title in ((1, "first sync (full history)"), (2, "second sync (incremental)")):
        if round_number == 2:
            simulate_activity(shop_url)
            print("simulated shop activity: 20,000 order updates, 5,000 new orders, product and customer edits")
            if uses_demo_api(load_catalog(settings.catalog_path)):
                from ingestion_assets.stack.demo_api import DemoApiProcess

                DemoApiProcess.for_settings(settings).ensure_running().mutate("orders", inserts=40, updates=60)
                print("simulated API activity: 40 new orders and 60 changed ones on the demo API")
        status = materialize_all(settings, env, round_number)
        if status != 0:
            return status
        print_summary(settings, title)
    print(f"\nwarehouse: {settings.warehouse_path}   Dagster UI: ingest dev   streams: ingest status")
    return 0


def print_summary(settings: Settings, title: str) -> None:
    import duckdb

    from ingestion_assets.loading.destinations import duckdb_path
    from ingestion_assets.state.summary import latest_runs

    catalog = load_catalog(settings.catalog_path)
    print(f"\n{title}")
    print(f"{'stream':<22}{'rows':>10}{'seconds':>9}{'rows/s':>10}{'in target':>11}  position")
    counts: dict[str, int] = {}
    if catalog.destination.type == "duckdb":
        with duckdb.connect(str(duckdb_path(settings, catalog.destination)), read_only=True) as con:
            for source_name, _, stream_name, _ in catalog.streams():
                row = con.execute(f'SELECT count(*) FROM "{source_name}"."{stream_name}"').fetchone()
                counts[f"{source_name}.{stream_name}"] = int(row[0]) if row else 0
    for line in latest_runs(settings, catalog):
        print(
            f"{line.stream:<22}{line.rows:>10,}{line.seconds:>9.1f}{line.rows_per_second:>10,.0f}"
            f"{counts.get(line.stream, 0):>11,}  {line.position}"
        )
