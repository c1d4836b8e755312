"""The demo's syncs as CI would run them: `dagster asset materialize` for the unpartitioned streams (CDC
included), then each key-partitioned stream's history ranges as one backfill run (first round) or its `live`
partition (later rounds)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from ingestion_assets.catalog import Catalog, KeyPartitions, PostgresStream, load_catalog
from ingestion_assets.cli.common import DEFINITIONS_MODULE, sibling
from ingestion_assets.cli.progress import wait_for
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings


def materialize_all(settings: Settings, env: dict[str, str], round_number: int) -> int:
    catalog = load_catalog(settings.catalog_path)
    plain, ranged = _streams(catalog)
    label = f"demo-round-{round_number}"
    status = materialize_logged(settings, env, label, ["--select", ",".join(plain)]) if plain else 0
    for key in ranged:
        if status != 0:
            return status
        if round_number == 1:
            for ranges in _plan(settings, catalog, key):
                if status == 0:
                    status = materialize_logged(settings, env, f"{label}-history", _range_args(key, ranges))
        else:
            status = materialize_logged(settings, env, f"{label}-live", ["--select", key, "--partition", LIVE])
    return status


def _streams(catalog: Catalog) -> tuple[list[str], list[str]]:
    """Asset keys (`source/stream`) of the unpartitioned streams, and of the key-partitioned ones; time
    partitions are left to the schedule."""
    plain, ranged = [], []
    for source_name, _, stream_name, spec in catalog.streams():
        key = f"{source_name}/{stream_name}"
        partitions = spec.partitions if isinstance(spec, PostgresStream) else None
        if partitions is None:
            plain.append(key)
        elif isinstance(partitions, KeyPartitions):
            ranged.append(key)
    return plain, ranged


def _plan(settings: Settings, catalog: Catalog, key: str) -> list[list[str]]:
    """The stream's key ranges, planned now from the table's smallest and largest key, in runs around `live`."""
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.defs.partitions import dynamic_partitions_name, plan_key_partitions
    from ingestion_assets.state.summary import open_instance
    from ingestion_assets.streams.postgres_table import PostgresTableStream

    source_name, stream_name = key.split("/")
    stream = next(
        s
        for s in catalog_streams(settings, catalog)
        if (s.source_name, s.name) == (source_name, stream_name) and isinstance(s, PostgresTableStream)
    )
    with open_instance(settings) as instance:
        plan_key_partitions(stream, instance)
        keys = instance.get_dynamic_partitions(dynamic_partitions_name(source_name, stream_name))
    return _around_live(list(keys))


def _around_live(keys: list[str]) -> list[list[str]]:
    """The key ranges in runs that do not take in `live` (ranges planned after it follow it in the list)."""
    at = keys.index(LIVE) if LIVE in keys else len(keys)
    return [part for part in (keys[:at], keys[at + 1 :]) if part]


def _range_args(key: str, ranges: list[str]) -> list[str]:
    return ["--select", key, "--partition-range", f"{ranges[0]}...{ranges[-1]}"]


def materialize_logged(settings: Settings, env: dict[str, str], label: str, selection: list[str]) -> int:
    """Run `dagster asset materialize` exactly as a CI job would, logging to INGEST_HOME/logs (its dlt and
    Dagster lines stay there; the last ones are shown if it fails); a terminal sees the slices go by."""
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{label}.log"
    command = [sibling("dagster"), "asset", "materialize", "-m", DEFINITIONS_MODULE, *selection]
    print(f"\n$ {shlex.join(command)}   (log: {log_file})")
    with log_file.open("w") as handle:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT)
        status = wait_for(process, f"materializing {' '.join(selection[1:2])}", log_file)
    if status != 0:
        print(f"materialization failed (exit {status}); last lines of {log_file}:", file=sys.stderr)
        print("\n".join(log_file.read_text().splitlines()[-30:]), file=sys.stderr)
    return status
