"""A numeric's text ordered by value: number_order in Python and number_order_sql in DuckDB and PostgreSQL
make the same bytes, and their byte order is PostgreSQL's order of the values (the version guard's)."""

from __future__ import annotations

import random
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

from ingestion_assets.loading.lake_sql import keep_newest_in_duckdb
from ingestion_assets.loading.metadata_columns import POSITION, sortable_text, version_text
from ingestion_assets.loading.number_order import number_order, number_order_sql
from ingestion_assets.loading.versions import newest_per_key
from ingestion_assets_tests.helpers import SourceDb

SPECIAL = ["NaN", "Infinity", "-Infinity"]
TEXTS = [
    *("0", "0.000", "1", "1.0", "1.00", "10", "9.5", "9.50", "-9.5", "-10", "-1", "0.5", "0.55", "0.05", "-0.05"),
    *("-0.5", "-0.55", "100", "99", "1.5", "1.51", "-1.5", "-1.51", "-1.502", "1000", "0.000000000000000000001"),
    *("-0.000000000000000000001", "123456789012345678901234567890123456789012.123456789", "-" + "9" * 60),
    *SPECIAL,
]


def _texts() -> list[str]:
    rng = random.Random(7)
    drawn = []
    for _ in range(300):
        digits = rng.randint(-(10 ** rng.randint(0, 40)), 10 ** rng.randint(0, 40))
        drawn.append(format(Decimal(digits).scaleb(-rng.randint(0, 30)), "f"))
    return TEXTS + drawn


def _value(text: str) -> tuple[int, Decimal]:
    """PostgreSQL's order: -Infinity, the numbers, Infinity, NaN."""
    rank = {"-Infinity": -1, "Infinity": 1, "NaN": 2}.get(text, 0)
    return rank, Decimal(0) if rank else Decimal(text)


def test_the_byte_order_of_number_order_is_the_value_order() -> None:
    texts = _texts()
    ordered = sorted(texts, key=number_order)
    assert ordered == sorted(texts, key=_value)
    assert number_order("1.0") == number_order("1.00") and number_order("9.5") < number_order("10")


def test_duckdb_makes_the_same_text() -> None:
    texts = _texts()
    with duckdb.connect() as con:
        con.execute("CREATE TABLE n (x VARCHAR)")
        con.executemany("INSERT INTO n VALUES (?)", [[t] for t in [*texts, None]])
        made = dict(con.sql(f"SELECT x, {number_order_sql('x')} FROM n").fetchall())
    assert made == {**{t: number_order(t) for t in texts}, None: None}


@pytest.mark.parametrize("kind", ["text", "numeric"])
def test_postgres_makes_the_same_text_and_orders_it_bytewise(source_db: SourceDb, kind: str) -> None:
    """`numeric`: a PostgreSQL destination's own column prints the text the source sent."""
    texts = _texts()
    source_db.execute(f"CREATE TABLE n (x {kind})")
    with source_db.connect() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO n VALUES (%s)", [(t,) for t in [*texts, None]])
        cur.execute(f"SELECT x::text, {number_order_sql('x')} FROM n")
        made = dict(cur.fetchall())
        cur.execute(f'SELECT x::text FROM n WHERE x IS NOT NULL ORDER BY {number_order_sql("x")} COLLATE "C"')
        ordered = [row[0] for row in cur.fetchall()]
    assert made == {**{t: number_order(t) for t in texts}, None: None}
    assert [_value(t) for t in ordered] == sorted(_value(t) for t in texts)


def _versions(ids: list[int], positions: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), POSITION: pa.array(positions, pa.string())})


def test_the_newest_version_of_a_key_in_a_slice_is_its_highest_value() -> None:
    table = _versions([1, 1, 2, 2, 3, 3], ["10", "9.5", "-1", "-9.5", "Infinity", "NaN"])
    assert newest_per_key(table, ("id",), numeric=True)[POSITION].to_pylist() == ["10", "-1", "NaN"]


def test_the_guard_on_a_lake_or_mariadb_compares_numeric_versions_by_value() -> None:
    """keep_newest_in_duckdb: the target's versions as read back, joined with the slice's in DuckDB."""
    target = _versions([1, 2, 3, 4], ["9.5", "-9.5", "99", "1.0"])
    rows = _versions([1, 2, 3, 4, 5], ["10", "-1", "98", "1.00", "7"])
    kept = keep_newest_in_duckdb(target, rows, ("id",), numeric=True)
    assert kept.rows["id"].to_pylist() == [1, 2, 4, 5] and kept.existing == 4  # 98 is older than 99


def test_a_numeric_among_several_cursor_columns_orders_by_value() -> None:
    """1.5 before 1.51 whatever follows it: the part ends below its digits, NULL below every number."""
    texts = [*_texts(), None]
    seconds = [(9, 0)[i % 2] for i in range(len(texts))]
    versions = sortable_text([pa.array(texts, pa.string()), pa.array(seconds, pa.int64())], [True, False])

    def value(text: str | None, second: int) -> tuple[tuple[int, Decimal], int]:
        return ((-2, Decimal(0)) if text is None else _value(text)), second

    in_byte_order = [value(t, n) for _, t, n in sorted(zip(versions.to_pylist(), texts, seconds, strict=True))]
    assert in_byte_order == sorted(value(t, n) for t, n in zip(texts, seconds, strict=True))


def test_an_api_version_with_a_point_orders_by_value_among_integers() -> None:
    """An API's numbers with a point arrive as exact Decimals (rest/payload.py): 9.5 below 10, between 9 and 10
    (the highest of a key's versions in a slice is kept: the text '9.5' sorted above '10')."""
    values = [-(2**63), Decimal("-1.5"), -1, Decimal("-0.25"), 0, Decimal("0.5"), 9, Decimal("9.5"), Decimal("9.55")]
    values += [10, Decimal("10.25"), Decimal("10.3"), 2**63 - 1]
    texts = [version_text(v) for v in values]
    assert texts == sorted(texts)  # type: ignore[type-var]
    assert version_text(Decimal("10.0")) == version_text(Decimal("10.000")) == version_text(10)
    two = _versions([1, 1], [version_text(Decimal("10")), version_text(Decimal("9.5"))])
    assert newest_per_key(two, ("id",))[POSITION].to_pylist() == [version_text(10)]  # the slice keeps 10
