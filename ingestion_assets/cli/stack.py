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


def up(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.stack.embedded import EmbeddedServerError
    from ingestion_assets.stack.server_tls import TlsSetupError

    try:
        if args.pg_bin:
            settings.embedded.use_binaries(Path(args.pg_bin).resolve())
        if args.tls:
            settings.embedded.enable_tls()
    except (EmbeddedServerError, TlsSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = bring_up(settings)
    if args.archive or args.standby:
        from ingestion_assets.stack import durability

        server, archive = settings.embedded, durability.archive_for(settings.home)
        if args.archive:
            durability.enable_archiving(server, archive)
            if not archive.backups():
                print(f"base backup: {durability.base_backup(server, archive)}", file=sys.stderr)
        if args.standby:
            standby = durability.start_standby(server, settings.home)
            print(f"streaming standby: {standby.root} on port {standby.port()}", file=sys.stderr)
    print(exports(env))
    return 0


def storage_backup(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack import durability

    archive = durability.archive_for(settings.home)
    durability.enable_archiving(settings.embedded, archive)
    print(f"base backup: {durability.base_backup(settings.embedded, archive)}")
    return 0


def storage_promote(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack import durability
    from ingestion_assets.stack.embedded import EmbeddedServerError
    from ingestion_assets.stack.standby_check import PromotionRefused, check_follows

    standby, primary = durability.standby_server(settings.home), settings.embedded
    if not (standby.data_dir / "PG_VERSION").exists() or standby.root == primary.root:
        print("error: there is no standby (`ingest up --standby` starts one)", file=sys.stderr)
        return 2
    if not durability.is_standby(standby):  # a former primary kept by a restore: never start it to find out
        print(f"refused: {standby.root} is a primary of its own, not a standby: nothing to promote", file=sys.stderr)
        return 2
    try:
        notes = check_follows(standby.ensure_running(), primary)  # before anything stops: a refusal changes nothing
    except (PromotionRefused, EmbeddedServerError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    was_running = primary.is_running()
    primary.stop("immediate")  # if the old primary still runs, it must take no more checkpoints
    try:
        durability.promote(standby, settings.home)
    except (PromotionRefused, EmbeddedServerError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        if was_running:  # the promotion was abandoned: the old primary is primary still
            primary.ensure_running()
            print(f"the primary {primary.root} was started again; it is still Dagster's storage", file=sys.stderr)
        return 2
    bring_up(settings)  # dagster.yaml now names the promoted server
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"promoted {standby.root}; Dagster's storage is there now")
    return 0


def storage_restore(settings: Settings, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from ingestion_assets.stack.embedded import EmbeddedServerError
    from ingestion_assets.stack.restore import RestoreRefused, restore_storage

    try:
        to = datetime.fromisoformat(args.to)
    except ValueError:
        print(f"--to {args.to!r} is not an ISO time: give e.g. 2026-12-01T09:30:00Z", file=sys.stderr)
        return 2
    to = to if to.tzinfo else to.replace(tzinfo=UTC)
    try:
        restored = restore_storage(
            settings, to, args.force, args.timeout, include_other_databases=args.include_other_databases
        )
    except (RestoreRefused, EmbeddedServerError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    for warning in restored.warnings:
        print(f"WARNING (--force): {warning}", file=sys.stderr)
    for gap in restored.wal_gaps:
        print(f"WARNING: {gap}", file=sys.stderr)
    print(f"restored Dagster's storage to {to.isoformat()} (base backup of {restored.backup_started_at.isoformat()})")
    print(f"the replaced server is stopped and kept in {restored.previous}")
    if restored.rolled_back:
        print(
            f"WARNING: databases {', '.join(restored.rolled_back)} were rolled back to {to.isoformat()} as well",
            file=sys.stderr,
        )
    if restored.previous_port not in (None, restored.server.port()):
        print(
            f"WARNING: the embedded server now listens on port {restored.server.port()}, not "
            f"{restored.previous_port}: URLs naming port {restored.previous_port} reach nothing now",
            file=sys.stderr,
        )
    print(restored.standby)
    return 0


def down(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack.demo_api import DemoApiProcess
    from ingestion_assets.stack.durability import stop_all

    DemoApiProcess.for_settings(settings).stop()
    stopped = stop_all(settings.home)  # the primary, a standby, restored copies and the servers they replaced
    for root in stopped:
        print(f"stopped the embedded PostgreSQL under {root}")
    if not stopped:
        print(f"no embedded PostgreSQL was running under {settings.home}")
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
