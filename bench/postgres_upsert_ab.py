"""Benchmark: the 10 % upsert's statement alone, written four ways, on a copy of the product's 1M-row target.

The stage (a temporary table, as write_slice makes it) holds every tenth row with a newer version; each way
runs in its own transaction on a fresh copy of `bench.orders` (the table bench/postgres_to_postgres.py leaves
in `bench_dst`: run that first), interleaved round by round. Printed per way: wall seconds, the server
backend's CPU seconds (from /proc) and the WAL the statement wrote. `--checkpoint` runs CHECKPOINT before each
statement, so every page it touches first costs a full-page image, as right after a large load.

- on_conflict: the loader's statement (loading/postgres_merge.upsert_sql, with the version guard);
- merge: MERGE … WHEN MATCHED AND <guard> THEN UPDATE … WHEN NOT MATCHED THEN INSERT (PostgreSQL 15+);
- update_insert: UPDATE … FROM the stage with the guard, then INSERT of the keys the target lacks;
- analyzed: on_conflict after ANALYZE of the stage;
- fillfactor90: on_conflict into a copy made WITH (fillfactor = 90) (room for HOT updates).

    .venv/bin/python bench/postgres_upsert_ab.py --rounds 3 [--checkpoint]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingestion_assets.loading.postgres_merge import STAGE, SliceWrite, quote, target_columns, upsert_sql

TARGET_URL = Path(__file__).resolve().parent / ".work" / "pg2pg" / "target_url"
COPY = "public.upsert_ab"
WAYS = ("on_conflict", "merge", "update_insert", "analyzed", "fillfactor90")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()
    conn = psycopg2.connect(TARGET_URL.read_text().strip())
    figures: dict[str, list[tuple[float, float, int]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            figures[way].append(_once(conn, way, args.checkpoint))
    conn.close()
    for way, runs in figures.items():
        walls, cpus, wal = [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]
        print(
            f"{way:<14} wall {' / '.join(f'{w:.2f}' for w in walls)} s   server CPU "
            f"{' / '.join(f'{c:.2f}' for c in cpus)} s   WAL {' / '.join(f'{b / 2**20:.0f}' for b in wal)} MB"
        )


def _once(conn: psycopg2.extensions.connection, way: str, checkpoint: bool) -> tuple[float, float, int]:
    conn.autocommit = True
    with conn.cursor() as cur:
        storage = " WITH (fillfactor = 90)" if way == "fillfactor90" else ""
        cur.execute(f"DROP TABLE IF EXISTS {COPY}; CREATE TABLE {COPY} (LIKE bench.orders){storage}")
        cur.execute(f"INSERT INTO {COPY} SELECT * FROM bench.orders ORDER BY id")
        cur.execute(f"CREATE UNIQUE INDEX ON {COPY} (id)")
        cur.execute(f"VACUUM (FREEZE, ANALYZE) {COPY}")
        columns = target_columns(cur, COPY)
        conn.autocommit = False
        cur.execute("SET LOCAL TimeZone = 'UTC'; SET LOCAL work_mem = '256MB'")  # as write_slice sets
        cur.execute(f"CREATE TEMP TABLE {STAGE} (LIKE {COPY}) ON COMMIT DROP")
        newer = {"status": "'changed again'", "updated_at": "updated_at + interval '1 day'"}
        newer["_ingest_position"] = "_ingest_position + interval '1 day'"
        listed = ", ".join(newer.get(c, quote(c)) for c in columns)
        cur.execute(f"INSERT INTO {STAGE} SELECT {listed} FROM {COPY} WHERE id % 10 = 0 ORDER BY id")
        if way == "analyzed":
            cur.execute(f"ANALYZE {STAGE}")
        if checkpoint:
            cur.execute("CHECKPOINT")
        cur.execute("SELECT pg_backend_pid(), pg_current_wal_lsn()")
        pid, lsn = cur.fetchone()  # type: ignore[misc]
        began, spent = time.monotonic(), _cpu(int(pid))
        for statement in _statements(way, columns):
            cur.execute(statement)
        wall, cpu = time.monotonic() - began, _cpu(int(pid)) - spent
        cur.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn,))
        wal = int(cur.fetchone()[0])  # type: ignore[index]
        conn.commit()
        conn.autocommit = True
        cur.execute(f"DROP TABLE {COPY}")
    return wall, cpu, wal


def _statements(way: str, columns: list[str]) -> list[str]:
    write = SliceWrite(table=COPY, key=("id",), mode="merge", guard=True)
    if way in ("on_conflict", "analyzed", "fillfactor90"):
        return [upsert_sql(write, columns, columns)]
    listed = ", ".join(quote(c) for c in columns)
    values = ", ".join(f"s.{quote(c)}" for c in columns)
    assignments = ", ".join(f"{quote(c)} = s.{quote(c)}" for c in columns if c != "id")
    guard = '(t."_ingest_position" > s."_ingest_position") IS NOT TRUE'
    if way == "merge":
        return [
            f"MERGE INTO {COPY} AS t USING {STAGE} AS s ON t.id = s.id WHEN MATCHED AND {guard} THEN UPDATE SET "
            f"{assignments} WHEN NOT MATCHED THEN INSERT ({listed}) VALUES ({values})"
        ]
    return [
        f"UPDATE {COPY} AS t SET {assignments} FROM {STAGE} AS s WHERE t.id = s.id AND {guard}",
        f"INSERT INTO {COPY} ({listed}) SELECT {values} FROM {STAGE} AS s "
        f"WHERE NOT EXISTS (SELECT 1 FROM {COPY} AS t WHERE t.id = s.id) ON CONFLICT DO NOTHING",
    ]


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a process (the server backend runs on this machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
