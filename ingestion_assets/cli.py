"""The `ingest` command: up, down, env, demo, dev, check, state."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ingestion_assets.catalog import Catalog, CatalogError, load_catalog
from ingestion_assets.settings import Settings

DEFINITIONS_MODULE = "ingestion_assets.definitions"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    try:
        return int(args.handler(settings, args) or 0)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, handler: object, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    command("up", _up, "start the embedded PostgreSQL (Dagster storage, demo source) and print the env")
    command("down", _down, "stop the embedded PostgreSQL")
    command("env", _env, "print `export` lines that point dagster commands at this instance")
    demo = command("demo", _demo, "seed the demo shop, materialize every stream twice, print a summary")
    demo.add_argument("--orders", type=int, default=int(os.environ.get("INGEST_DEMO_ORDERS", "1000000")))
    dev = command("dev", _dev, "run the Dagster webserver and daemon on this instance")
    dev.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed to `dagster dev`")
    command("check", _check, "validate the catalog, reach every source, find every table and column")
    state = command("state", None, "show or reset stream checkpoints")
    state_commands = state.add_subparsers(required=True, metavar="ACTION")
    show = state_commands.add_parser("show", help="each stream's checkpoint: position, when, which run")
    show.add_argument("stream", nargs="?", help="SOURCE.STREAM (default: all)")
    show.add_argument("--partition")
    show.set_defaults(handler=_state_show)
    reset = state_commands.add_parser("reset", help="clear a checkpoint: the next run re-reads from the start")
    reset.add_argument("stream", help="SOURCE.STREAM")
    reset.add_argument("--partition")
    reset.set_defaults(handler=_state_reset)
    refresh = command("refresh", _refresh, "re-read a stream in full as a new generation")
    refresh.add_argument("stream", help="SOURCE.STREAM (not partitioned)")
    refresh.add_argument("--retain", action="store_true", help="merge over the target: rows gone from the source stay")
    refresh.add_argument("--later", action="store_true", help="only mark it: the next scheduled run refreshes")
    partitions = command("partitions", None, "backfill partitions")
    partition_commands = partitions.add_subparsers(required=True, metavar="ACTION")
    plan = partition_commands.add_parser("plan", help="add the key ranges key-partitioned streams now need")
    plan.add_argument("stream", nargs="?", help="SOURCE.STREAM (default: all key-partitioned streams)")
    plan.set_defaults(handler=_partitions_plan)
    return parser


def _up(settings: Settings, _args: argparse.Namespace) -> int:
    env = _bring_up(settings)
    print(_exports(env))
    return 0


def _down(settings: Settings, _args: argparse.Namespace) -> int:
    settings.embedded.stop()
    print(f"stopped the embedded PostgreSQL under {settings.embedded.root}")
    return 0


def _env(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.stack.instance import instance_env

    print(_exports(instance_env(settings)))
    return 0


def _dev(settings: Settings, args: argparse.Namespace) -> int:
    env = _bring_up(settings)
    extra = args.dagster_args[1:] if args.dagster_args[:1] == ["--"] else args.dagster_args
    command = [_sibling("dagster"), "dev", "-m", DEFINITIONS_MODULE, *extra]
    print(f"DAGSTER_HOME={env['DAGSTER_HOME']} {shlex.join(command)}", file=sys.stderr)
    return subprocess.call(command, env={**os.environ, **env})


def _demo(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.demo.seed import ShopSize, seed_shop, simulate_activity

    env = _bring_up(settings)
    shop_url = settings.embedded.ensure_database("shop")
    began = time.monotonic()
    seed_shop(shop_url, ShopSize(orders=args.orders))
    print(f"seeded the demo database `shop` ({args.orders:,} orders) in {time.monotonic() - began:.1f}s")
    for round_number, title in ((1, "first sync (full history)"), (2, "second sync (incremental)")):
        if round_number == 2:
            simulate_activity(shop_url)
            print("simulated shop activity: 20,000 order updates, 5,000 new orders, product and customer edits")
        status = _materialize_all(settings, env, round_number)
        if status != 0:
            return status
        _print_summary(settings, title)
    print(f"\nwarehouse: {settings.warehouse_path}   Dagster UI: ingest dev   state: ingest state show")
    return 0


def _materialize_all(settings: Settings, env: dict[str, str], round_number: int) -> int:
    """Run `dagster asset materialize` exactly as a CI job would, logging to INGEST_HOME/logs."""
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"demo-round-{round_number}.log"
    command = [_sibling("dagster"), "asset", "materialize", "-m", DEFINITIONS_MODULE, "--select", "*"]
    print(f"\n$ {shlex.join(command)}   (log: {log_file})")
    with log_file.open("w") as handle:
        status = subprocess.call(command, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT)
    if status != 0:
        print(f"materialization failed (exit {status}); last lines of {log_file}:", file=sys.stderr)
        print("\n".join(log_file.read_text().splitlines()[-30:]), file=sys.stderr)
    return status


def _print_summary(settings: Settings, title: str) -> None:
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


def _check(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.checks import check_catalog

    catalog = load_catalog(settings.catalog_path)
    problems = check_catalog(settings, catalog)
    for line in problems:
        print(f"FAIL {line}")
    if not problems:
        print(f"ok: {len(catalog.streams())} stream(s) in {settings.catalog_path} are readable")
    return 1 if problems else 0


def _state_show(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.state.summary import checkpoint_rows

    catalog = load_catalog(settings.catalog_path)
    _bring_up(settings)
    selected = [_stream_key(catalog, args.stream)] if args.stream else None
    rows = checkpoint_rows(settings, catalog, selected, args.partition)
    width = max([len(r.stream) for r in rows] + [20]) + 2
    part = max([len(r.partition) for r in rows] + [10]) + 2
    print(f"{'stream':<{width}}{'partition':<{part}}{'committed at (UTC)':<27}{'run':<10}position")
    for row in rows:
        print(f"{row.stream:<{width}}{row.partition:<{part}}{row.committed_at:<27}{row.run_id:<10}{row.position}")
    return 0


def _state_reset(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.state.summary import reset_stream

    catalog = load_catalog(settings.catalog_path)
    _bring_up(settings)
    source, stream = _stream_key(catalog, args.stream)
    reset_stream(settings, source, stream, args.partition)
    print(f"reset {source}.{stream}: the next run re-reads from the start; the merge keeps the target exact")
    return 0


def _refresh(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.state.summary import request_refresh

    catalog = load_catalog(settings.catalog_path)
    source, stream = _stream_key(catalog, args.stream)
    if catalog.sources[source].streams[stream].partitions is not None:
        raise SystemExit(f"error: {source}.{stream} is partitioned: refresh its partitions with a backfill instead")
    env = _bring_up(settings)
    mode = "retain" if args.retain else "remove"
    request_refresh(settings, source, stream, mode)
    what = "merged over the target" if args.retain else "swapped in once complete; the old table stays until then"
    print(f"{source}.{stream}: refresh requested ({mode}): a new generation is read in full, {what}")
    if args.later:
        return 0
    command = [_sibling("dagster"), "asset", "materialize", "-m", DEFINITIONS_MODULE, "--select", f"{source}/{stream}"]
    return subprocess.call(command, env={**os.environ, **env})


def _partitions_plan(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.catalog import KeyPartitions
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.defs.partitions import plan_key_partitions
    from ingestion_assets.state.summary import open_instance

    catalog = load_catalog(settings.catalog_path)
    wanted = _stream_key(catalog, args.stream) if args.stream else None
    _bring_up(settings)
    with open_instance(settings) as instance:
        for stream in catalog_streams(settings, catalog):
            if not isinstance(stream.spec.partitions, KeyPartitions):
                continue
            if wanted is not None and (stream.source_name, stream.name) != wanted:
                continue
            added = plan_key_partitions(stream, instance)
            more = " ..." if len(added) > 3 else ""
            print(f"{stream.qualified_name}: added {len(added)} partition(s) {added[:3]}{more}")
    return 0


def _stream_key(catalog: Catalog, name: str) -> tuple[str, str]:
    source, _, stream = name.replace("/", ".").partition(".")
    known = {(s, t) for s, _, t, _ in catalog.streams()}
    if (source, stream) not in known:
        names = ", ".join(sorted(f"{s}.{t}" for s, t in known))
        raise SystemExit(f"error: no stream {name!r} in the catalog; streams: {names}")
    return source, stream


def _bring_up(settings: Settings) -> dict[str, str]:
    from ingestion_assets.stack.instance import bring_up
    from ingestion_assets.state.summary import size_pools

    env = bring_up(settings)
    try:
        size_pools(settings, load_catalog(settings.catalog_path))
    except CatalogError as exc:
        print(f"warning: {exc}", file=sys.stderr)
    return env


def _exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())


def _sibling(executable: str) -> str:
    """The console script installed beside this interpreter (the project's venv), else from PATH."""
    candidate = Path(sys.executable).parent / executable
    return str(candidate) if candidate.exists() else executable


if __name__ == "__main__":
    raise SystemExit(main())
