"""A file stream paused by an incompatible type change, accepted with `ingest schema accept`: the next run loads
the file that paused it with its values exact, into a column of the accepted type, and the rows already there keep
their values (also beside it as text, `<column>__<old type>`), on DuckDB and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import io
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingestion_assets.streams.schema_step import SchemaPaused
from ingestion_assets_tests.files_helpers import Drops, Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL

BASE = 1_700_000_000.0
UTC = dt.UTC


def _accept(drops: Drops) -> None:
    """`ingest schema accept`, on the state store the runs use."""
    latest = drops.store.latest(None)
    assert latest is not None
    drops.store.commit(None, latest.position, **{**latest.details, "schema_accepted": True})


def _parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_an_accepted_bigint_to_double_loads_the_decimal_and_keeps_the_old_values(target: Target) -> None:
    """PostgreSQL emptied the column of the rows already there (USING NULL: it has no TRY_CAST), where DuckDB
    converts them: an integer column becoming double precision converts every value."""
    target_catalog(target, "*.csv")
    target.drops.write("1.csv", "id,qty\n1,3\n", BASE + 1)
    target.drops.run()
    target.drops.write("2.csv", "id,qty\n2,1.05e1\n", BASE + 2)  # a double (2.5 is a decimal: widened)
    with pytest.raises(SchemaPaused, match="'qty' changed type bigint -> double precision"):
        target.drops.run()
    _accept(target.drops)
    target.drops.run()
    target.drops.write("3.csv", "id,qty\n3,-0.25\n", BASE + 3)
    target.drops.run()
    assert target.column_type("qty") in ("double", "double precision")
    rows = target.query("SELECT id, qty, qty__int8 FROM drops.orders ORDER BY id")
    assert rows == [(1, 3.0, "3"), (2, 10.5, None), (3, -0.25, None)]


def test_an_accepted_naive_to_aware_parquet_timestamp_loads_exactly(target: Target) -> None:
    """A naive timestamp column, then a file where it is tz-aware: the stream pauses naming both types and the
    accept path; after it the aware instants load exactly and the naive ones read as UTC, not NULL."""
    target_catalog(target, "*.parquet")
    naive = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 123456)], pa.timestamp("us"))  # noqa: DTZ001 - naive on purpose
    aware = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 654321, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    target.drops.write("1.parquet", _parquet(pa.table({"id": [1], "at": naive})), BASE + 1)
    target.drops.run()
    target.drops.write("2.parquet", _parquet(pa.table({"id": [2], "at": aware})), BASE + 2)
    changed = "'at' changed type timestamp without time zone -> timestamp with time zone (incompatible)"
    with pytest.raises(SchemaPaused, match=re.escape(changed) + ".*`ingest schema accept drops.orders`"):
        target.drops.run()
    _accept(target.drops)
    target.drops.run()
    assert target.column_type("at") == "timestamp with time zone"
    rows = target.query('SELECT id, "at" FROM drops.orders ORDER BY id')
    assert [(i, at.astimezone(UTC)) for i, at in rows] == [
        (1, dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        (2, dt.datetime(2024, 1, 2, 3, 4, 5, 654321, tzinfo=UTC)),
    ]
