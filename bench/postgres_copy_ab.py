"""Benchmark: one slice of `bench_orders`' shape COPYed as CSV and as binary (pgpq) into a fresh indexed table.

The loader's copy step alone (loading/postgres_merge.copy_slice), both ways interleaved, with the CPU the server's
backend and this process spent (from /proc), which a shared machine's load distorts less than the wall clock.
Uses the embedded server bench/postgres_to_postgres.py leaves running (run that first).

    .venv/bin/python bench/postgres_copy_ab.py --rows 500000 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from decimal import Decimal
from pathlib import Path

import psycopg2
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingestion_assets.loading.postgres_binary import column_types
from ingestion_assets.loading.postgres_merge import copy_slice

TARGET_URL = Path(__file__).resolve().parent / ".work" / "pg2pg" / "target_url"
DDL = """DROP TABLE IF EXISTS public.copy_ab; CREATE TABLE public.copy_ab (id bigint NOT NULL,
 customer_id bigint NOT NULL, sku text NOT NULL, quantity int NOT NULL, unit_price numeric(12,2) NOT NULL,
 total numeric(38,9) NOT NULL, status text NOT NULL, note text, zip text, placed_at timestamptz NOT NULL,
 updated_at timestamptz NOT NULL, meta jsonb); CREATE UNIQUE INDEX ON public.copy_ab (id)"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    table = _slice(args.rows)
    conn = psycopg2.connect(TARGET_URL.read_text().strip())
    wall: dict[str, list[float]] = {"csv": [], "binary": []}
    cpu: dict[str, list[float]] = {"csv": [], "binary": []}
    for _ in range(args.rounds):
        for way in ("csv", "binary"):
            with conn.cursor() as cur:
                cur.execute(DDL)
                conn.commit()
                cur.execute("SET LOCAL TimeZone = 'UTC'")  # as write_slice sets
                cur.execute("SELECT pg_backend_pid()")
                pid = int(cur.fetchone()[0])  # type: ignore[index]
                types = column_types(cur, "public.copy_ab") if way == "binary" else {}  # none known: CSV
                began, spent = time.monotonic(), _cpu(pid)
                copy_slice(cur, "public.copy_ab", table, types)
                conn.commit()
                wall[way].append(time.monotonic() - began)
                cpu[way].append(_cpu(pid) - spent)
    with conn.cursor() as cur:
        cur.execute("DROP TABLE public.copy_ab")
    conn.commit()
    conn.close()
    for way in ("csv", "binary"):
        print(
            f"{way:<7} wall {' '.join(f'{v:.2f}s' for v in wall[way])}  cpu {' '.join(f'{v:.2f}s' for v in cpu[way])}"
        )
    print(f"csv / binary, best wall: {min(wall['csv']) / min(wall['binary']):.2f}x")
    print(f"csv / binary, best CPU (server backend + client): {min(cpu['csv']) / min(cpu['binary']):.2f}x")


def _cpu(pid: int) -> float:
    """CPU seconds of the server backend `pid` and of this process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + time.process_time()


def _slice(rows: int) -> pa.Table:
    """bench_orders' columns and values (postgres_to_duckdb.TABLE_SQL) as the source lands them."""
    keys = range(1, rows + 1)
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    zoned = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "customer_id": pa.array([1 + g % 50000 for g in keys], pa.int64()),
            "sku": pa.array([f"{g % 2000:06d}" for g in keys]),
            "quantity": pa.array([1 + g % 5 for g in keys], pa.int32()),
            "unit_price": pa.array([Decimal(g % 50000) / 100 for g in keys], pa.decimal128(12, 2)),
            "total": pa.array([Decimal(g * 37) / 1_000_000_000 + 5 for g in keys], pa.decimal128(38, 9)),
            "status": pa.array([("placed", "paid", "shipped", "delivered")[g % 4] for g in keys]),
            "note": pa.array([f"gift for {g}" if g % 10 == 0 else None for g in keys]),
            "zip": pa.array([f"{g * 7919 % 99999:05d}" for g in keys]),
            "placed_at": pa.array([start + dt.timedelta(seconds=3 * g, microseconds=7 * g) for g in keys], zoned),
            "updated_at": pa.array([start + dt.timedelta(seconds=120.654321 * (g // 40)) for g in keys], zoned),
            "meta": pa.array([None if g % 7 == 0 else json.dumps({"channel": "web", "n": g % 13}) for g in keys]),
        }
    )


if __name__ == "__main__":
    main()
