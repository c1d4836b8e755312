"""Benchmark: changes of a PostgreSQL table into DuckDB by CDC (the slot) against cursor polling (a table
stream on `updated_at`), in the same run on the same table and the same writer; decoding alone is the
physical limit of the log path. Usage:

    .venv/bin/python bench/cdc_to_duckdb.py --seconds 60 --rate 2000

Phase 1 (steady): a writer makes `rate` changes/s for `seconds` (small transactions: updates, inserts,
deletes) while CDC syncs back to back; then the same with polling. Reported: changes applied and the
commit-to-target latency percentiles (CDC: per change, from the log's commit time; polling: per row, from
its `updated_at` to the end of the sync that loaded it).
Each path first catches up with what the other's phase wrote. Phase 2 (backlog): the writer runs with
nobody reading; then a second slot is decoded without loading (raw), CDC drains its slot, polling reads
the changed rows: changes (rows) per second each.
Phase 3 (added table, `--added-rows`, default 1M): a table with that many rows joins the catalog of the
live source while the writer keeps changing the first table; reported: the run that copies it (seconds,
rows/s) and the first table's commit-to-target latency in that run and the next (`--only-added` runs this
phase alone).
`--live`: a live run (`cdc.live_seconds`) through `dagster asset materialize` instead; see bench/cdc_live.py.
The syncs run in this process with checkpoints in the PostgreSQL-backed Dagster instance (the asset's
body without the ~1-4 s of starting a Dagster run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WORK = Path(__file__).resolve().parent / ".work"
SEED_SQL = """
DROP TABLE IF EXISTS bench_events;
CREATE TABLE bench_events (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12,2) NOT NULL,
                           status text NOT NULL, note text, updated_at timestamptz NOT NULL);
INSERT INTO bench_events SELECT g, g %% 5000, g * 0.25, 'open', CASE WHEN g %% 9 = 0 THEN 'n' || g END,
                                clock_timestamp() FROM generate_series(1, %(rows)s) g;
CREATE INDEX ON bench_events (updated_at, id);
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=2000, help="changes per second the writer makes")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--added-rows", type=int, default=1_000_000)
    parser.add_argument("--only-added", action="store_true")
    parser.add_argument("--live", action="store_true", help="only the live phase: a live run through Dagster")
    parser.add_argument("--writer", help=argparse.SUPPRESS)  # internal: url, run the writer in this process
    args = parser.parse_args()
    if args.writer:
        print(_write(args.writer, args.seconds, args.rate), flush=True)
        return
    bench = Bench(args.seconds, args.rate, args.rows)
    bench.prepare()
    if args.live:
        import cdc_live  # bench/cdc_live.py, beside this file

        cdc_live.report(args, cdc_live.steady(bench), cdc_live.drain(bench))
        return
    if args.only_added:
        _report_added(args, bench.added_table(args.added_rows))
        return
    cdc_steady = bench.steady(bench.cdc_sync)
    poll_steady = bench.steady(bench.poll_sync)
    backlog = bench.backlog()
    _report(args, cdc_steady, poll_steady, backlog)
    _report_added(args, bench.added_table(args.added_rows))


def _write(url: str, seconds: float, rate: int) -> int:
    """Transactions of 20 changes (14 updates, 4 inserts, 2 deletes) at `rate` changes/s; prints the count."""
    import psycopg2

    rng = random.Random(1)
    conn = psycopg2.connect(url)
    conn.autocommit = False
    cur = conn.cursor()
    cur.execute("SELECT max(id) FROM bench_events")
    top = int(cur.fetchone()[0])  # type: ignore[index]
    written, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        for _ in range(14):
            cur.execute(
                "UPDATE bench_events SET amount = amount + 1, status = 'paid', updated_at = clock_timestamp() "
                "WHERE id = %s",
                (rng.randint(1, top),),
            )
        for _ in range(4):
            top += 1
            cur.execute(
                "INSERT INTO bench_events VALUES (%s, %s, 1, 'open', NULL, clock_timestamp())", (top, top % 5000)
            )
        for _ in range(2):
            cur.execute("DELETE FROM bench_events WHERE id = %s", (rng.randint(1, top),))
        conn.commit()
        written += 20
        ahead = written / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)
    conn.close()
    return written


def _pct(histogram: Any) -> dict[str, float]:
    """p50/p95/p99 of an HDR histogram (the runs' own, merged; polling's recorded here alike)."""
    from ingestion_assets.observe.freshness import percentiles

    return percentiles(histogram) or {"p50": 0.0, "p95": 0.0, "p99": 0.0}


def _histogram(latencies: list[float]) -> Any:
    from ingestion_assets.observe.freshness import record

    return record(latencies)


class Bench:
    def __init__(self, seconds: float, rate: int, rows: int) -> None:
        self.seconds, self.rate, self.rows = seconds, rate, rows
        self.url = ""

    def prepare(self) -> None:
        import psycopg2

        from ingestion_assets.catalog import load_catalog
        from ingestion_assets.settings import Settings
        from ingestion_assets.stack.instance import bring_up

        self.settings = Settings(home=WORK / "home", catalog_path=WORK / "cdc_catalog.yaml")
        bring_up(self.settings)
        self.url = self.settings.embedded.ensure_database("bench_cdc")
        for slot in ("ingest_cdcb", "bench_raw"):
            self._execute(
                f"SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots WHERE slot_name = '{slot}'"
            )
        conn = psycopg2.connect(self.url)
        with conn.cursor() as cur:
            cur.execute(SEED_SQL, {"rows": self.rows})
        conn.commit()
        conn.close()
        for name in ("cdc.duckdb", "poll.duckdb"):
            (WORK / name).unlink(missing_ok=True)
        (WORK / "cdc_source_url").write_text(self.url)
        source = "connection: {file: " + str(WORK / "cdc_source_url") + "}"
        (WORK / "cdc_catalog.yaml").write_text(
            "destination: {type: duckdb, path: " + str(WORK / "cdc.duckdb") + "}\n"
            f"sources:\n  cdcb:\n    type: postgres\n    mode: cdc\n    {source}\n"
            "    cdc: {max_changes: 50000, max_seconds: 2, max_batches_per_run: 1000}\n"
            "    streams:\n      events: {table: public.bench_events, primary_key: id}\n"
        )
        (WORK / "poll_catalog.yaml").write_text(
            "destination: {type: duckdb, path: " + str(WORK / "poll.duckdb") + "}\n"
            f"sources:\n  pollb:\n    type: postgres\n    {source}\n"
            "    streams:\n      events: {table: public.bench_events, primary_key: id, cursor: updated_at}\n"
        )
        os.environ["DAGSTER_HOME"] = str(self.settings.dagster_home)
        import dagster as dg

        self.instance = dg.DagsterInstance.get()
        self.cdc_catalog = load_catalog(WORK / "cdc_catalog.yaml")
        self.poll_catalog = load_catalog(WORK / "poll_catalog.yaml")
        self._reset()
        began = time.monotonic()
        self.cdc_sync()  # the initial copies, not measured
        self.poll_sync()
        print(f"seeded {self.rows:,} rows and copied them both ways in {time.monotonic() - began:.1f}s", flush=True)

    def _execute(self, statement: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.close()

    def _reset(self) -> None:
        import dagster as dg

        from ingestion_assets.state.checkpoints import reset_checkpoint

        for source, stream in (("cdcb", "events"), ("cdcb", "added"), ("pollb", "events")):
            reset_checkpoint(self.instance, dg.AssetKey([source, stream]), None, reason="benchmark")

    def cdc_sync(self) -> tuple[int, Any]:
        from ingestion_assets.defs.cdc import cdc_streams, cdc_sync

        source = self.cdc_catalog.sources["cdcb"]
        streams = cdc_streams(self.settings, self.cdc_catalog, "cdcb", source)  # type: ignore[arg-type]
        outcome = cdc_sync(self.settings, self.cdc_catalog, "cdcb", source, streams, self.instance).run()  # type: ignore[arg-type]
        return outcome.rows.get("events", 0), outcome.histogram

    def poll_sync(self) -> tuple[int, Any]:
        import dagster as dg
        import duckdb

        from ingestion_assets.defs.assets import catalog_streams
        from ingestion_assets.state.checkpoints import InstanceStateStore
        from ingestion_assets.streams.runner import PartitionJob

        stream = catalog_streams(self.settings, self.poll_catalog)[0]
        store = InstanceStateStore(self.instance, dg.AssetKey(["pollb", "events"]))
        began = dt.datetime.now(dt.UTC)
        outcome = PartitionJob(stream, store, None).run()
        done = dt.datetime.now(dt.UTC)
        with duckdb.connect(str(WORK / "poll.duckdb"), read_only=True) as con:
            stamps = con.execute(
                "SELECT updated_at FROM pollb.events WHERE _ingest_extracted_at >= ?", [began]
            ).fetchall()
        latency = [(done - stamp).total_seconds() * 1000 for (stamp,) in stamps]
        return int(outcome.result.rows), _histogram(latency)

    def _writer(self, seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, __file__, "--writer", self.url, "--seconds", str(seconds), "--rate", str(self.rate)],
            stdout=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def _drain(sync: Any) -> None:
        while sync()[0]:
            pass

    def steady(self, sync: Any) -> dict[str, Any]:
        self._drain(sync)  # what the other path's phase wrote: not this phase's latency
        writer = self._writer(self.seconds)
        applied, latency, syncs = 0, _histogram([]), 0
        while writer.poll() is None:
            rows, lat = sync()
            applied, syncs = applied + rows, syncs + 1
            latency.add(lat)
        rows, lat = sync()  # what the writer's last second left
        latency.add(lat)
        written = int((writer.stdout.read() if writer.stdout else "0").strip() or 0)
        return {"written": written, "applied": applied + rows, "syncs": syncs + 1, "latency": _pct(latency)}

    def added_table(self, rows: int) -> dict[str, Any]:
        """A table of `rows` rows added to the live source while the writer changes the first one."""
        from ingestion_assets.catalog import load_catalog

        self._execute(
            "DROP TABLE IF EXISTS bench_added; CREATE TABLE bench_added (id bigint PRIMARY KEY, note text NOT NULL, "
            f"amount numeric(12,2) NOT NULL); INSERT INTO bench_added SELECT g, 'n' || g, g * 0.5 "
            f"FROM generate_series(1, {rows}) g"
        )
        self._drain(self.cdc_sync)
        catalog = WORK / "cdc_catalog.yaml"
        catalog.write_text(catalog.read_text() + "      added: {table: public.bench_added, primary_key: id}\n")
        self.cdc_catalog = load_catalog(catalog)
        writer = self._writer(max(self.seconds, 30.0))
        time.sleep(2)
        began = time.monotonic()
        copy_rows, copy_latency = self.cdc_sync_all()
        copy_seconds = time.monotonic() - began
        after_rows, after_latency = self.cdc_sync_all()
        writer.terminate()
        writer.wait()
        return {
            "rows": copy_rows.get("added", 0),
            "seconds": copy_seconds,
            "live_changes": copy_rows.get("events", 0),
            "latency_during": _pct(copy_latency),
            "latency_after": _pct(after_latency),
            "after_changes": after_rows.get("events", 0),
        }

    def cdc_sync_all(self) -> tuple[dict[str, int], Any]:
        from ingestion_assets.defs.cdc import cdc_streams, cdc_sync

        source = self.cdc_catalog.sources["cdcb"]
        streams = cdc_streams(self.settings, self.cdc_catalog, "cdcb", source)  # type: ignore[arg-type]
        outcome = cdc_sync(self.settings, self.cdc_catalog, "cdcb", source, streams, self.instance).run()  # type: ignore[arg-type]
        return outcome.rows, outcome.histogram

    def backlog(self) -> dict[str, Any]:
        from ingestion_assets.sources.postgres.cdc import acknowledge, create_slot_with_snapshot, read_changes

        self._drain(self.cdc_sync)
        self._drain(self.poll_sync)
        with create_slot_with_snapshot(self.url, "bench_raw") as raw_slot:
            start = raw_slot.consistent_lsn
        writer = self._writer(self.seconds)
        writer.wait()
        written = int((writer.stdout.read() if writer.stdout else "0").strip() or 0)
        results: dict[str, Any] = {"written": written}
        began = time.monotonic()
        changes = 0
        while True:
            batch = read_changes(self.url, "bench_raw", "ingest_cdcb", start, max_changes=50_000, max_seconds=2)
            changes += len(batch)
            if batch.end_lsn > start:
                acknowledge(self.url, "bench_raw", "ingest_cdcb", batch.end_lsn)
            start = batch.end_lsn
            if batch.caught_up and len(batch) == 0:
                break
        results["raw"] = {"rows": changes, "seconds": time.monotonic() - began}
        self._execute("SELECT pg_drop_replication_slot('bench_raw')")
        for name, sync in (("cdc", self.cdc_sync), ("poll", self.poll_sync)):
            began, rows = time.monotonic(), 0
            while True:
                got, _ = sync()
                rows += got
                if got == 0:
                    break
            results[name] = {"rows": rows, "seconds": time.monotonic() - began}
        return results


def _report(args: argparse.Namespace, cdc: dict[str, Any], poll: dict[str, Any], backlog: dict[str, Any]) -> None:
    print(f"\nsteady writer, {args.rate:,} changes/s for {args.seconds:.0f} s (20 per transaction)")
    for name, line in (("cdc", cdc), ("polling", poll)):
        lat = line["latency"]
        print(
            f"  {name:<8} statements {line['written']:>8,}  applied {line['applied']:>8,} in {line['syncs']:>3} syncs"
            f"  latency ms p50 {lat['p50']:>7,.0f}  p95 {lat['p95']:>7,.0f}  p99 {lat['p99']:>7,.0f}"
        )
    print(f"\nbacklog: {backlog['written']:,} statements with nobody reading, then drained")
    for name in ("raw", "cdc", "poll"):
        line = backlog[name]
        rate = line["rows"] / line["seconds"] if line["seconds"] else 0.0
        print(f"  {name:<8} {line['rows']:>9,} changes/rows {line['seconds']:>8.2f}s {rate:>11,.0f} /s")
    raw, cdc_line = backlog["raw"], backlog["cdc"]
    cdc_rate = cdc_line["rows"] / cdc_line["seconds"]
    print(f"\n  cdc / raw decode: {cdc_rate / (raw['rows'] / raw['seconds']):.2f}x")
    print(f"  cdc / polling:    {cdc_rate / (backlog['poll']['rows'] / backlog['poll']['seconds']):.2f}x (rows/s)")
    print("  polling never sees the deletes (10 % of the statements) and misses no update only because every")
    print("  writer statement sets updated_at; 'applied' counts row versions loaded (polling re-reads rows")
    print("  changed again before it read them once)")


def _report_added(args: argparse.Namespace, added: dict[str, Any]) -> None:
    rate = added["rows"] / added["seconds"] if added["seconds"] else 0.0
    print(
        f"\nadded table: {added['rows']:,} rows copied beside the live log in {added['seconds']:.1f} s "
        f"({rate:,.0f} rows/s, the run that also applied {added['live_changes']:,} changes of the live table)"
    )
    print(f"  live table latency (ms) in that run: {added['latency_during']}")
    print(f"  and in the next run ({added['after_changes']:,} changes): {added['latency_after']}")


if __name__ == "__main__":
    main()
