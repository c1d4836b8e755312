"""The live phase of bench/cdc_to_duckdb.py (`--live`): a `dagster asset materialize` run with
`cdc.live_seconds` holds the slot while the writer makes `rate` changes/s; the run's own HDR histogram
(commit time in the log to the target's commit, in the run's process) gives p50/p95/p99. Then, with the
run stopped by SIGTERM, a backlog is written with nobody reading, decoded raw on a second slot, and drained
by a new live run: from the moment its walsender is active until the slot is acknowledged past the backlog.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LIVE_CDC = "    cdc: {max_changes: 20000, batch_seconds: 0.25, live_seconds: 3600, max_seconds: 2}\n"


def live_catalog(work: Path) -> Path:
    """The benchmark's CDC catalog with a live lifetime (the ordinary one stays for the other phases)."""
    text = (work / "cdc_catalog.yaml").read_text()
    lines = [LIVE_CDC if line.startswith("    cdc:") else line for line in text.splitlines(keepends=True)]
    path = work / "cdc_live_catalog.yaml"
    path.write_text("".join(lines))
    return path


def start_run(bench: Any, catalog: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INGEST_HOME": str(bench.settings.home), "INGEST_CATALOG": str(catalog)}
    command = [
        str(Path(sys.executable).parent / "dagster"),
        "asset",
        "materialize",
        "-m",
        "ingestion_assets.definitions",
    ]
    log = (catalog.parent / "live_run.log").open("ab")
    return subprocess.Popen(
        [*command, "--select", "cdcb/events"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )


def _slot(bench: Any) -> tuple[bool, int]:
    import psycopg2

    from ingestion_assets.sources.postgres.cdc import parse_lsn

    with psycopg2.connect(bench.url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'ingest_cdcb'"
        )
        row = cur.fetchone()
    conn.close()
    return (bool(row[0]), parse_lsn(row[1])) if row else (False, 0)


def _wal(bench: Any) -> int:
    import psycopg2

    from ingestion_assets.sources.postgres.cdc import parse_lsn

    with psycopg2.connect(bench.url) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        lsn = parse_lsn(cur.fetchone()[0])
    conn.close()
    return lsn


def _wait_active(bench: Any, run: subprocess.Popen[bytes]) -> float:
    while not _slot(bench)[0]:
        if run.poll() is not None:
            raise SystemExit(f"the live run ended with {run.returncode}; see {REPO / 'bench/.work/live_run.log'}")
        time.sleep(0.05)
    return time.monotonic()


def _wait_acknowledged(bench: Any, lsn: int, run: subprocess.Popen[bytes]) -> float:
    while _slot(bench)[1] < lsn:
        if run.poll() is not None:
            raise SystemExit(f"the live run ended with {run.returncode}")
        time.sleep(0.05)
    return time.monotonic()


def _stop(run: subprocess.Popen[bytes]) -> int:
    os.killpg(run.pid, signal.SIGTERM)  # drains: the batch in flight is loaded and checkpointed
    return run.wait(timeout=300)


def _run_latency(bench: Any) -> dict[str, float]:
    """The p50/p95/p99 of the last run's HDR histogram, as stored on the asset's materialization."""
    import dagster as dg

    from ingestion_assets.observe.freshness import HISTOGRAM, merged, percentiles

    run_id = bench.instance.get_runs(limit=1)[0].run_id  # the live run just stopped
    deadline = time.monotonic() + 15  # its step's last events may still be on their way when the CLI exits
    event = bench.instance.get_latest_materialization_event(dg.AssetKey(["cdcb", "events"]))
    while (event is None or event.run_id != run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
        event = bench.instance.get_latest_materialization_event(dg.AssetKey(["cdcb", "events"]))
    if event is None or event.run_id != run_id:
        print(f"  the live run {run_id} stored no materialization: no latency figures", flush=True)
        return {}
    metadata = event.asset_materialization.metadata if event.asset_materialization else {}
    encoded = metadata.get(HISTOGRAM)
    return percentiles(merged([encoded.value])) if encoded is not None else {}


def steady(bench: Any) -> dict[str, Any]:
    bench._drain(bench.cdc_sync)
    run = start_run(bench, live_catalog(bench.settings.home.parent))
    _wait_active(bench, run)
    time.sleep(3)  # the run settles (its first empty batches)
    writer = bench._writer(bench.seconds)
    writer.wait()
    written = int((writer.stdout.read() if writer.stdout else "0").strip() or 0)
    _wait_acknowledged(bench, _wal(bench), run)
    code = _stop(run)
    return {"written": written, "rc": code, "latency": _run_latency(bench)}


def drain(bench: Any) -> dict[str, Any]:
    from ingestion_assets.sources.postgres.cdc import acknowledge, create_slot_with_snapshot, read_changes

    bench._drain(bench.cdc_sync)
    with create_slot_with_snapshot(bench.url, "bench_raw") as raw_slot:
        start = raw_slot.consistent_lsn
    writer = bench._writer(bench.seconds)
    writer.wait()
    written = int((writer.stdout.read() if writer.stdout else "0").strip() or 0)
    target = _wal(bench)
    began, changes = time.monotonic(), 0
    while True:
        batch = read_changes(bench.url, "bench_raw", "ingest_cdcb", start, max_changes=50_000, max_seconds=2)
        changes += len(batch)
        if batch.end_lsn > start:
            acknowledge(bench.url, "bench_raw", "ingest_cdcb", batch.end_lsn)
        start = batch.end_lsn
        if batch.caught_up and len(batch) == 0:
            break
    raw = {"rows": changes, "seconds": time.monotonic() - began}
    bench._execute("SELECT pg_drop_replication_slot('bench_raw')")
    run = start_run(bench, live_catalog(bench.settings.home.parent))
    active = _wait_active(bench, run)
    done = _wait_acknowledged(bench, target, run)
    code = _stop(run)
    return {"written": written, "raw": raw, "live": {"rows": changes, "seconds": done - active}, "rc": code}


def batch_costs(work: Path) -> dict[str, float]:
    """Median changes, load ms and checkpoint+acknowledge ms per batch, from the runs' `live batch` lines."""
    pattern = r"live batch \d+: (\d+) changes, load (\d+) ms, checkpoint and acknowledge (\d+) ms"
    found = re.findall(pattern, (work / "live_run.log").read_text(errors="replace"))
    if not found:
        return {}
    columns = list(zip(*[[float(v) for v in row] for row in found], strict=True))
    names = ("changes", "load ms", "checkpoint ms")
    return {"batches": len(found), **{k: statistics.median(c) for k, c in zip(names, columns, strict=True)}}


def report(args: Any, steady_line: dict[str, Any], drain_line: dict[str, Any]) -> None:
    lat = steady_line["latency"]
    print(f"\nlive run through Dagster, {args.rate:,} changes/s for {args.seconds:.0f} s (rc {steady_line['rc']})")
    print(f"  statements {steady_line['written']:,}  commit->target ms (run's HDR histogram) {lat}")
    raw, live = drain_line["raw"], drain_line["live"]
    raw_rate, live_rate = raw["rows"] / raw["seconds"], live["rows"] / live["seconds"]
    print(f"backlog of {drain_line['written']:,} statements ({raw['rows']:,} changes), drained (rc {drain_line['rc']})")
    print(f"  raw pgoutput decode {raw['seconds']:7.2f}s {raw_rate:>9,.0f} changes/s")
    print(
        f"  live run            {live['seconds']:7.2f}s {live_rate:>9,.0f} changes/s  ({live_rate / raw_rate:.2f}x raw)"
    )
    print(f"  per batch (median over both runs): {batch_costs(REPO / 'bench' / '.work')}")
