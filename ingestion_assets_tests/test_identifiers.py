"""Any identifier works: keywords, the aliases our SQL uses, mixed case, spaces, quotes and unicode, in table,
key, cursor and ordinary column names. Generated SQL must never bind a user name to something of its own."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2 import sql

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.loading.naming import NameCollision, TargetNames
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets_tests.helpers import SourceDb, StreamHarness

HOSTILE = ["t", "select", "Order", "row", "Mixed Case", "with space", 'quo"te', "ümlaut_é", "i", "t.x", "_dlt_id2"]


def _create(harness: StreamHarness, table: str, key: str, cursor: str, others: list[str]) -> None:
    columns = [
        sql.SQL("{} bigint PRIMARY KEY").format(sql.Identifier(key)),
        sql.SQL("{} timestamptz NOT NULL").format(sql.Identifier(cursor)),
        *(sql.SQL("{} text").format(sql.Identifier(c)) for c in others),
        sql.SQL("amount numeric(12,2)"),
    ]
    with harness.source.connect() as conn, conn.cursor() as cur:
        cur.execute(
            sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(harness.source.schema, table), sql.SQL(", ").join(columns))
        )
        names = sql.SQL(", ").join(sql.Identifier(c) for c in [key, cursor, *others, "amount"])
        values = sql.SQL(", ").join(
            [
                sql.SQL("g"),
                sql.SQL("timestamptz '2024-01-01+00' + g * interval '1 minute'"),
                *(sql.SQL("{} || g").format(sql.Literal(c + ":")) for c in others),
                sql.SQL("g * 1.25"),
            ]
        )
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM generate_series(1, 500) g").format(
                sql.Identifier(harness.source.schema, table), names, values
            )
        )
        conn.commit()


@pytest.mark.parametrize(
    ("table", "key", "cursor"),
    [("t", "t", "select"), ("Order Lines", "Order ID", "Updated At"), ("row", "i", "t")],
)
def test_hostile_names_load_exactly_and_incrementally(harness: StreamHarness, table: str, key: str, cursor: str) -> None:
    others = [c for c in HOSTILE if c not in (key, cursor)]
    _create(harness, table, key, cursor, others)
    harness.write_catalog(
        {"s": {"table": table, "primary_key": key, "cursor": cursor, "slice_rows": 120}}
    )
    harness.materialize()
    assert harness.target_count("s") == 500
    with harness.source.connect() as conn, conn.cursor() as cur:
        cur.execute(
            sql.SQL("UPDATE {} SET amount = -1, {} = {} + interval '1 day' WHERE {} % 7 = 0").format(
                sql.Identifier(harness.source.schema, table), sql.Identifier(cursor), sql.Identifier(cursor), sql.Identifier(key)
            )
        )
        conn.commit()
    harness.materialize()
    assert harness.target_count("s") == 500
    changed = harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".s WHERE amount = -1')
    assert changed == [(71,)]


def test_hostile_key_names_under_partitions_and_reconciliation(harness: StreamHarness) -> None:
    others = [c for c in HOSTILE if c not in ("Order ID", "t")]
    _create(harness, "Order Lines", "Order ID", "t", others)
    harness.write_catalog(
        {
            "s": {
                "table": "Order Lines",
                "primary_key": "Order ID",
                "cursor": "t",
                "slice_rows": 120,
                "partitions": {"by": "key", "chunk": 200},
                "reconcile": "full",
                "retries": {"max_attempts": 1},
            }
        }
    )
    partitions = harness.plan_partitions("s")
    for partition in partitions:
        result = harness.materialize("s", partition=partition)
        assert result.success
    assert harness.target_count("s") == 500


def test_columns_landing_under_one_name_are_refused_and_direct_naming_keeps_them(harness: StreamHarness) -> None:
    harness.source.execute(
        'CREATE TABLE clash (id int PRIMARY KEY, "Order ID" text, "order_id" text, updated_at timestamptz NOT NULL);'
        "INSERT INTO clash VALUES (1, 'upper', 'lower', now())"
    )
    harness.write_catalog(
        {"clash": {"table": "clash", "primary_key": "id", "cursor": "updated_at", "retries": {"max_attempts": 1}}}
    )
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    message = str(result.all_events)
    assert "'Order ID' and 'order_id' both land as column 'order_id'" in message
    assert "destination.naming: direct" in message
    assert not harness.warehouse.exists() or harness.query_target_if_exists(f'SELECT * FROM "{harness.source_name}".clash') == []

    catalog = yaml.safe_load(harness.catalog_path.read_text())  # type: ignore[union-attr]
    catalog["destination"]["naming"] = "direct"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))  # type: ignore[union-attr]
    harness.materialize()
    assert harness.query_target(f'SELECT "Order ID", "order_id" FROM "{harness.source_name}".clash') == [("upper", "lower")]


def test_names_apart_only_by_case_are_refused_on_duckdb_without_advising_direct_naming() -> None:
    names = TargetNames("snake_case", None, case_sensitive=False)
    with pytest.raises(NameCollision) as refused:
        names.check("stream s.t", ["Name", "name"])
    assert "does not tell names apart by case" in str(refused.value) and "naming: direct" not in str(refused.value)
    with pytest.raises(NameCollision) as advised:
        TargetNames("snake_case", 63, case_sensitive=True).check("stream s.t", ["Name", "name"])
    assert "naming: direct" in str(advised.value)


def test_a_source_column_named_like_a_metadata_column_is_refused(harness: StreamHarness) -> None:
    """That stream alone fails, at once and naming the column; the others load; one added later by DDL too."""
    harness.source.execute(
        "CREATE TABLE meta (id int PRIMARY KEY, _ingest_position text); INSERT INTO meta VALUES (1, 'x');"
        "CREATE TABLE good (id int PRIMARY KEY, v text); INSERT INTO good VALUES (1, 'a'), (2, 'b')"
    )
    spec = {"primary_key": "id", "retries": {"max_attempts": 2, "delay_seconds": 0.1}}
    harness.write_catalog({"meta": {"table": "meta", **spec}, "good": {"table": "good", **spec}})
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert len(failures) == 1 and not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
    message = str(failures[0].step_failure_data.error)
    assert f"{harness.source_name}.meta" in message and "source column '_ingest_position'" in message
    assert "a column the product writes itself" in message
    harness.assert_target_equals_source("good", "good", "id")

    harness.source.execute("ALTER TABLE good ADD COLUMN _ingest_meta text; UPDATE good SET v = 'c' WHERE id = 1")
    result = harness.materialize("good", raise_on_error=False)
    message = str(next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error)
    assert f"{harness.source_name}.good" in message and "source column '_ingest_meta'" in message


@pytest.mark.parametrize("column", ["_ingest_cdc_op", "_ingest_lsn", "_Ingest_Lsn"])
def test_any_column_under_the_products_prefix_is_refused(harness: StreamHarness, column: str) -> None:
    """`_ingest_cdc_op` and `_ingest_lsn` loaded: only the names the product writes today were refused, not
    the prefix the README reserves. Now `ingest check` and the run refuse them with the message the others get."""
    for names in (TargetNames("snake_case", 63), TargetNames("direct", None, case_sensitive=False)):
        with pytest.raises(NameCollision, match="a column the product writes itself"):
            names.check("stream s.t", ["id", column])
    names.check("stream s.t", ["id", "_dlt_id2", "ingest_lsn", "x_ingest_lsn"])  # not under a reserved name
    harness.source.execute(
        f'CREATE TABLE meta (id int PRIMARY KEY, "{column}" text); INSERT INTO meta VALUES (1, \'x\')'
    )
    harness.write_catalog({"meta": {"table": "meta", "primary_key": "id", "retries": {"max_attempts": 1}}})
    (problem,) = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    assert f"{harness.source_name}.meta" in problem and f"source column {column!r}" in problem
    result = harness.materialize(raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.step_failure_data.error)
    assert f"source column {column!r}" in message and "a column the product writes itself" in message


_NAME_PARTS = st.sampled_from(["t", "i", "select", "row", "from", "Order", "a b", 'q"t', "ü", "é", "x.y", "_", "1", "Z"])
_names = st.lists(_NAME_PARTS, min_size=1, max_size=3).map("".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(_names, min_size=2, max_size=6, unique_by=str.lower))
def test_generated_names_read_and_load_exactly(source_db: SourceDb, tmp_path: Path, names: list[str]) -> None:
    """Any column names (our aliases, keywords, quotes, unicode): the keyset read and the load see each value
    under its own column; the first name is the key, the second the cursor."""
    table = f"g{uuid.uuid4().hex[:8]}"
    key, cursor, *others = names
    columns = [
        sql.SQL("{} int PRIMARY KEY").format(sql.Identifier(key)),
        sql.SQL("{} timestamptz").format(sql.Identifier(cursor)),
        *(sql.SQL("{} text").format(sql.Identifier(c)) for c in others),
    ]
    with source_db.connect() as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(source_db.schema, table), sql.SQL(", ").join(columns)))
        for row in range(1, 6):
            cur.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s{})").format(
                    sql.Identifier(source_db.schema, table), sql.SQL("".join(", %s" for _ in others))
                ),
                [row, None if row == 3 else f"2024-01-0{row}T00:00:00+00:00", *(f"{c}={row}" for c in others)],
            )
        conn.commit()
    plan = plan_table_read(source_db.url, source_db.schema, table, (cursor,), (key,))
    first = list(table_slices(source_db.url, plan, None, 2, table))
    read = pa.concat_tables(s.table for s in first)
    assert sorted(read.column(key).to_pylist()) == [1, 2, 3, 4, 5]
    for name in others:
        assert sorted(read.column(name).to_pylist()) == sorted(f"{name}={r}" for r in range(1, 6))
    again = list(table_slices(source_db.url, plan, first[0].position, 2, table))  # resume after the first slice
    assert sum(s.rows for s in again) == 3


def test_columns_meeting_under_direct_naming_are_refused_by_check_and_run(harness: StreamHarness) -> None:
    """`direct` rewrites a quote to `_`: `quo"te` and `quo_te` would share one target column; found by a
    README-only attack on a PostgreSQL destination. Both are named, the pair is not blamed on case."""
    harness.source.execute(
        'CREATE TABLE quotes (id int PRIMARY KEY, "quo""te" text, quo_te text, updated_at timestamptz NOT NULL);'
        "INSERT INTO quotes VALUES (1, 'quoted', 'plain', now())"
    )
    spec = {"table": "quotes", "primary_key": "id", "cursor": "updated_at", "retries": {"max_attempts": 1}}
    harness.write_catalog({"quotes": spec}, destination="postgres")
    catalog = yaml.safe_load(harness.catalog_path.read_text())  # type: ignore[union-attr]
    catalog["destination"]["naming"] = "direct"
    harness.catalog_path.write_text(yaml.safe_dump(catalog))  # type: ignore[union-attr]
    said = "source columns 'quo\"te' and 'quo_te' both land as column 'quo_te' under the destination's naming"
    problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    assert len(problems) == 1 and said in problems[0]
    result = harness.materialize(raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert not result.success and said in failure.step_failure_data.error.message
    assert harness.query_target(f"SELECT to_regclass('\"{harness.source_name}\".quotes')") == [(None,)]
    duckdb_names = TargetNames("direct", None, case_sensitive=False)
    with pytest.raises(NameCollision) as refused:
        duckdb_names.check("stream s.t", ["quo\"te", "quo_te"])
    assert "by case" not in str(refused.value)
