"""The PostgreSQL destination's COPY + ON CONFLICT merge (loading/postgres_merge.py) on a real server."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg2
import pyarrow as pa
import pytest

from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.postgres_merge import (
    SliceWrite,
    ensure_unique_key,
    newest_per_key,
    target_columns,
    write_slice,
)
from ingestion_assets_tests.helpers import SourceDb

UTC = dt.UTC
TARGET = """CREATE TABLE target (id bigint NOT NULL, note text, amount numeric(12,2), seen timestamptz,
    _ingest_position bigint)"""


def _slice(ids: list[int], notes: list[str | None], versions: list[int], amounts: list[str] | None = None) -> pa.Table:
    columns: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.int64()),
        "note": pa.array(notes, pa.string()),
        "seen": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=UTC)] * len(ids), pa.timestamp("us", tz="UTC")),
        POSITION: pa.array(versions, pa.int64()),
    }
    if amounts is not None:
        columns["amount"] = pa.array([Decimal(a) for a in amounts], pa.decimal128(12, 2))
    return pa.table(columns)


def _write(db: SourceDb, table: pa.Table, mode: str = "merge", guard: bool = True) -> int:
    qualified = f'"{db.schema}"."target"'
    write = SliceWrite(table=qualified, key=("id",), mode=mode, guard=guard, keyed=True)
    with db.connect() as conn, conn.cursor() as cur:
        ensure_unique_key(cur, qualified, "target", ("id",))
        taken = write_slice(cur, write, table, target_columns(cur, qualified))
        conn.commit()
    return taken


def test_newest_version_wins_and_empty_text_stays_apart_from_null(source_db: SourceDb) -> None:
    source_db.execute(TARGET)
    assert _write(source_db, _slice([1, 2, 3], ["", None, "a"], [5, 5, 5], ["1.10", "2.20", "3.30"])) == 3
    # 1: older version (skipped by the guard), 2: newer, 4: new key; amount missing from this slice
    assert _write(source_db, _slice([1, 2, 4], ["old", "", "new"], [4, 6, 1])) == 2
    rows = source_db.rows("target", "id")
    seen = dt.datetime(2024, 1, 1, 12, tzinfo=UTC)
    assert rows == [
        (1, "", Decimal("1.10"), seen, 5),
        (2, "", None, seen, 6),  # replaced whole: a column the slice lacks is NULL, as a delete + insert left it
        (3, "a", Decimal("3.30"), seen, 5),
        (4, "new", None, seen, 1),
    ]


def test_without_the_guard_the_slice_overwrites_whatever_its_version(source_db: SourceDb) -> None:
    source_db.execute(TARGET)
    _write(source_db, _slice([1], ["first"], [9]))
    assert _write(source_db, _slice([1], ["reread"], [3]), guard=False) == 1
    assert source_db.rows("target", "id")[0][1] == "reread"


def test_repeated_keys_in_one_slice_keep_the_newest_and_the_later_of_a_tie(source_db: SourceDb) -> None:
    table = _slice([7, 8, 7, 7, 8], ["a", "b", "c", "d", "e"], [1, 2, 3, 3, 1])
    assert newest_per_key(table, ("id",)).select(["id", "note"]).to_pylist() == [
        {"id": 7, "note": "d"},
        {"id": 8, "note": "b"},
    ]
    source_db.execute(TARGET)
    # the target holds no key of the range, so the slice tries COPY straight in; the key it repeats breaks the
    # unique index and the slice goes through the stage instead, whole
    assert _write(source_db, table) == 5  # every row of the slice counts as taken: none was stale
    assert [(r[0], r[1]) for r in source_db.rows("target", "id")] == [(7, "d"), (8, "b")]


def test_a_failing_slice_leaves_the_target_as_it_was(source_db: SourceDb) -> None:
    source_db.execute(TARGET)
    _write(source_db, _slice([1], ["kept"], [1]))
    bad = _slice([1, 2], ["changed", "x"], [2, 2]).set_column(0, "id", pa.array([1, None], pa.int64()))
    with pytest.raises(psycopg2.errors.NotNullViolation):
        _write(source_db, bad)
    assert [(r[0], r[1]) for r in source_db.rows("target", "id")] == [(1, "kept")]


def test_writers_of_different_keys_do_not_wait_for_each_other(source_db: SourceDb) -> None:
    """Key-range partitions of one table merge at once: the second writer commits while the first is open."""
    source_db.execute(TARGET)
    _write(source_db, _slice([1, 2], ["a", "b"], [1, 1]))
    qualified = f'"{source_db.schema}"."target"'
    write = SliceWrite(table=qualified, key=("id",), mode="merge", guard=True, keyed=True)
    with source_db.connect() as first, source_db.connect() as second:
        with first.cursor() as cur:
            write_slice(cur, write, _slice([1, 3], ["a2", "c"], [2, 2]), target_columns(cur, qualified))
        with second.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")  # waiting on the first writer would fail here
            write_slice(cur, write, _slice([2, 4], ["b2", "d"], [2, 2]), target_columns(cur, qualified))
        second.commit()
        first.commit()
    assert [(r[0], r[1]) for r in source_db.rows("target", "id")] == [(1, "a2"), (2, "b2"), (3, "c"), (4, "d")]


def test_the_unique_key_is_made_once_and_found_under_another_name(source_db: SourceDb) -> None:
    source_db.execute(TARGET)
    qualified = f'"{source_db.schema}"."target"'
    with source_db.connect() as conn, conn.cursor() as cur:
        assert ensure_unique_key(cur, qualified, "target", ("id",))
        cur.execute(f'ALTER INDEX "{source_db.schema}"."{_index_name(cur)}" RENAME TO swapped_in')
        assert not ensure_unique_key(cur, qualified, "target", ("id",))  # a refresh's shadow brings its own
        conn.commit()


def _index_name(cur: object) -> str:
    cur.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'target'::regclass")  # type: ignore[attr-defined]
    return str(cur.fetchone()[0]).split(".")[-1].strip('"')  # type: ignore[attr-defined]
