"""The PostgreSQL destination's COPY + ON CONFLICT merge (loading/postgres_merge.py) on a real server."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

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


TYPED = """CREATE TABLE {name} (i2 smallint, i4 int, i8 bigint, f4 real, f8 double precision, b boolean,
    small numeric(12,2), wide numeric(38,9), whole numeric(38,0), d date, tm time, ts timestamp, tz timestamptz,
    s text, vc varchar(5), ch char(3), j json, jb jsonb, raw bytea)"""


def _typed_slice() -> pa.Table:
    """Each type's edges: every value must read back as the CSV path loads it."""
    t = dt.datetime
    return pa.table(
        {
            "i2": pa.array([-32768, 32767, 0, None], pa.int16()),
            "i4": pa.array([-(2**31), 2**31 - 1, 0, None], pa.int32()),
            "i8": pa.array([-(2**63), 2**63 - 1, 0, None], pa.int64()),
            "f4": pa.array([float("nan"), float("-inf"), -0.0, 1.1754944e-38], pa.float32()),
            "f8": pa.array([float("inf"), 0.1, -0.0, 5e-324], pa.float64()),
            "b": pa.array([True, False, None, True]),
            "small": pa.array(
                [Decimal("-9999999999.99"), Decimal("0.00"), Decimal("0.10"), None], pa.decimal128(12, 2)
            ),
            "wide": pa.array(
                [Decimal("99999999999999999999999999999.999999999"), Decimal("-0.000000001"), Decimal("10000"), None],
                pa.decimal128(38, 9),
            ),
            "whole": pa.array(
                [Decimal("-" + "9" * 38), Decimal("10000000000000000"), Decimal(0), None], pa.decimal128(38, 0)
            ),
            "d": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1999, 12, 31), None], pa.date32()),
            "tm": pa.array([dt.time(0), dt.time(23, 59, 59, 999999), dt.time(12, 0, 0, 1), None], pa.time64("us")),
            "ts": pa.array(
                [t(1, 1, 1), t(9999, 12, 31, 23, 59, 59, 999999), t(1969, 12, 31, 23, 59, 59, 1), None],
                pa.timestamp("us"),
            ),
            "tz": pa.array(
                [
                    t(1, 1, 1, tzinfo=UTC),
                    t(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                    t(2000, 1, 1, tzinfo=UTC),
                    None,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "s": pa.array(["", None, 'a\\b,"c"\n\r\t\\N é', "x" * 10000]),
            "vc": pa.array(["", "abcde", None, "é"]),
            "ch": pa.array(["a", "", None, "abc"]),
            "j": pa.array(['{"b": 2, "a": 1, "b": 3}', "[]", None, '"\\u00e9"']),
            "jb": pa.array(['{"b": 2, "a": {"c": [1, 2.50]}}', '""', None, "null"]),
            "raw": pa.array([b"", b"\x00\xff\\x", None, bytes(range(256))], pa.binary()),
        }
    )


def test_binary_copy_loads_every_type_exactly_as_the_csv_path(source_db: SourceDb) -> None:
    from ingestion_assets.loading.postgres_binary import binary_plan, column_types
    from ingestion_assets.loading.postgres_merge import copy_slice

    source_db.execute(TYPED.format(name="by_csv") + ";" + TYPED.format(name="by_binary"))
    table = _typed_slice()
    with source_db.connect() as conn, conn.cursor() as cur:
        types = column_types(cur, "by_binary")
        assert binary_plan(table, types) is not None  # every column travels in binary
        copy_slice(cur, "by_csv", table, {})  # no types known: the CSV path (UTC wall times, as write_slice sets)
        cur.execute("SET TimeZone = 'America/New_York'")  # binary carries instants: the session's zone is no part
        copy_slice(cur, "by_binary", table, types)
        conn.commit()
    read = "SELECT {} FROM {} ORDER BY i8 NULLS LAST"
    columns = ", ".join(f"{name}::text" for name in table.column_names)
    by_csv = _query(source_db, read.format(columns, "by_csv"))
    by_binary = _query(source_db, read.format(columns, "by_binary"))
    for index, name in enumerate(table.column_names):
        assert [row[index] for row in by_binary] == [row[index] for row in by_csv], name
    texts = [row[table.column_names.index("s")] for row in by_binary]  # rows by i8: the 1st, 3rd, 2nd, 4th
    assert texts == ["", 'a\\b,"c"\n\r\t\\N é', None, "x" * 10000]


def test_columns_binary_copy_cannot_carry_exactly_take_the_csv_path(source_db: SourceDb) -> None:
    from ingestion_assets.loading.postgres_binary import binary_plan, column_types
    from ingestion_assets.loading.postgres_merge import copy_slice

    source_db.execute("CREATE TABLE t (id bigint, u uuid, n numeric, ts timestamptz, label text)")
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "u": pa.array(["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None]),
            "n": pa.array(["NaN", "1.50"]),
            "ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
            "label": pa.array(["x", ""]),
        }
    )
    far = table.set_column(  # infinity as the source lands it (temporal.TIMESTAMP_INFINITY)
        3, "ts", pa.array([2**63 - 1, None], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    )
    with source_db.connect() as conn, conn.cursor() as cur:
        types = column_types(cur, "t")
        assert binary_plan(table, types) is None  # uuid and numeric arrive as PostgreSQL's text
        assert binary_plan(table.select(["id", "ts", "label"]), types) is not None
        assert binary_plan(far.select(["id", "ts", "label"]), types) is None  # infinity: CSV sends its text
        cur.execute("SET TimeZone = 'UTC'")
        copy_slice(cur, "t", table, types)
        copy_slice(cur, "t", far.select(["id", "ts", "label"]).slice(0, 1), types)
        conn.commit()
    assert _query(source_db, "SELECT id, u::text, n::text, ts::text, label FROM t ORDER BY id, ts") == [
        (1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "NaN", "2024-01-01 00:00:00+00", "x"),
        (1, None, None, "infinity", "x"),
        (2, None, "1.50", None, ""),
    ]


def test_a_value_the_server_refuses_in_binary_fails_as_it_did_in_csv(source_db: SourceDb) -> None:
    """A NUL in text: binary COPY is refused, the slice goes again as CSV and fails there with today's error."""
    source_db.execute("CREATE TABLE t (id bigint, s text)")
    table = pa.table({"id": pa.array([1], pa.int64()), "s": pa.array(["a\x00b"])})
    from ingestion_assets.loading.postgres_binary import column_types
    from ingestion_assets.loading.postgres_merge import copy_slice

    with source_db.connect() as conn, conn.cursor() as cur:
        with pytest.raises(psycopg2.errors.CharacterNotInRepertoire):
            copy_slice(cur, "t", table, column_types(cur, "t"))
        conn.rollback()
        with pytest.raises(psycopg2.errors.CharacterNotInRepertoire):
            copy_slice(cur, "t", table, {})  # the CSV path alone: the same error


def _query(db: SourceDb, statement: str) -> list[tuple[Any, ...]]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute(statement)
        return list(cur.fetchall())
