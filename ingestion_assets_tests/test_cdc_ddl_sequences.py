"""CDC through sequences of DDL on one column, between runs and inside one live run: the target's columns and
every row's values end equal to the source's (found by a README-only attack: a rename and a type change left the
target's column of the old type, and every run failed on it, retried as if transient)."""

from __future__ import annotations

import threading
import time

import dagster as dg
import pytest

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import _catalog, _drain, _failure
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]

TABLE = """
CREATE TABLE t (id int PRIMARY KEY, s text, a int);
INSERT INTO t SELECT g, 's' || g, g FROM generate_series(1, 200) g;
"""
BEFORE = "UPDATE t SET a = a + 1000 WHERE id <= 5"
# Each list is what the source does before one run; the values after need the new type (bigint)
SEQUENCES = {
    "drop, then add again as bigint": [
        [BEFORE, "ALTER TABLE t DROP COLUMN a", "UPDATE t SET s = 'between' WHERE id <= 8"],
        [
            "ALTER TABLE t ADD COLUMN a bigint",
            "UPDATE t SET a = 5000000000 + id WHERE id BETWEEN 4 AND 12",
            "INSERT INTO t (id, s, a) VALUES (500, 'after', 6000000000)",
        ],
    ],
    "drop, then add again as the same type": [  # the log never touches most rows: the copy gives them NULL
        [BEFORE, "ALTER TABLE t DROP COLUMN a", "UPDATE t SET s = 'between' WHERE id <= 8"],
        ["ALTER TABLE t ADD COLUMN a int", "UPDATE t SET a = -id WHERE id BETWEEN 4 AND 6"],
    ],
    "rename, then rename back and retype": [
        [BEFORE, "ALTER TABLE t RENAME COLUMN a TO b", "UPDATE t SET b = -b WHERE id <= 8"],
        [
            "ALTER TABLE t RENAME COLUMN b TO a",
            "ALTER TABLE t ALTER COLUMN a TYPE bigint",
            "UPDATE t SET a = 5000000000 + id WHERE id BETWEEN 4 AND 12",
            "INSERT INTO t (id, s, a) VALUES (500, 'after', 6000000000)",
        ],
    ],
    "add, drop, then rename onto that name and retype": [
        [BEFORE, "ALTER TABLE t ADD COLUMN c text", "UPDATE t SET c = 'c' || id WHERE id <= 8"],
        ["ALTER TABLE t DROP COLUMN c", "DELETE FROM t WHERE id = 2"],
        [
            "ALTER TABLE t RENAME COLUMN a TO c",
            "ALTER TABLE t ALTER COLUMN c TYPE bigint",
            "UPDATE t SET c = 5000000000 + id WHERE id BETWEEN 4 AND 12",
            "INSERT INTO t (id, s, c) VALUES (500, 'after', 6000000000)",
        ],
    ],
    "rename and retype, in either order": [
        [BEFORE, "ALTER TABLE t RENAME COLUMN a TO b", "UPDATE t SET b = -b WHERE id <= 8"],
        ["ALTER TABLE t ALTER COLUMN b TYPE bigint", "UPDATE t SET b = 5000000000 + id WHERE id BETWEEN 4 AND 12"],
        [
            "ALTER TABLE t ALTER COLUMN s TYPE int USING length(s)",
            "ALTER TABLE t RENAME COLUMN s TO a",
            "INSERT INTO t (id, a, b) VALUES (500, 7, 6000000000)",
        ],
    ],
}


_LANDS_AS = {"integer": "INTEGER", "bigint": "BIGINT", "text": "VARCHAR"}


def _assert_types(harness: StreamHarness, table: str) -> None:
    """Each source column lands in a target column of its own type."""
    source = harness.query_source(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        f"WHERE attrelid = '{harness.source.schema}.{table}'::regclass AND attnum > 0 AND NOT attisdropped"
    )
    target = dict(
        harness.query_target(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{harness.source_name}' AND table_name = '{table}'"
        )
    )
    assert {name: target.get(name) for name, _ in source} == {name: _LANDS_AS[kind] for name, kind in source}


def _assert_exact(harness: StreamHarness, table: str) -> None:
    columns = harness.source.columns(table)
    target = harness.target_rows_where(table, columns, "id", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows(table, "id")


@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_ddl_between_runs_ends_with_the_sources_columns_and_rows(cdc: StreamHarness, sequence: str) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, {"t": {}})
    harness.materialize()
    for statements in SEQUENCES[sequence]:
        harness.source.execute(";".join(statements))
        result = harness.materialize(raise_on_error=False)
        assert result.success, _failure(result)
    _drain(harness)
    _assert_exact(harness, "t")
    _assert_types(harness, "t")


def test_drop_and_add_as_bigint_inside_one_live_run(cdc: StreamHarness) -> None:
    """The log shows the column without its name, then with it as bigint, while one live run reads it: the
    stream is copied again from the next run, which compares the columns with the schema the target holds."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, {"t": {}})
    harness.materialize()
    _catalog(harness, {"t": {}}, live_seconds=6, batch_seconds=0.2)
    results = []
    live = threading.Thread(target=lambda: results.append(harness.materialize(raise_on_error=False)))
    live.start()
    time.sleep(2.5)  # the run holds its session (no assertion on timing: every order of events must end exact)
    for statement in [
        BEFORE,
        "ALTER TABLE t DROP COLUMN a",
        "UPDATE t SET s = 'between' WHERE id <= 8",
        "ALTER TABLE t ADD COLUMN a bigint",
        "UPDATE t SET a = 5000000000 + id WHERE id BETWEEN 4 AND 12",
        "INSERT INTO t (id, s, a) VALUES (500, 'after', 6000000000)",
    ]:
        harness.source.execute(statement)
        time.sleep(0.3)
    live.join()
    assert results[0].success, _failure(results[0])
    _catalog(harness, {"t": {}})
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    _drain(harness)
    _assert_exact(harness, "t")
    _assert_types(harness, "t")


def test_a_value_the_target_column_cannot_hold_fails_at_once_naming_stream_and_column(cdc: StreamHarness) -> None:
    """A target column changed behind the product's back to a type the schema step does not read (unsigned): the
    load fails on every attempt the same way, so it fails at once, naming the stream, the column and what to do."""
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, {"t": {}}, retries={"max_attempts": 3, "delay_seconds": 1})
    harness.materialize()
    harness.execute_target(f'ALTER TABLE "{harness.source_name}".t ALTER COLUMN a TYPE UTINYINT')
    harness.source.execute("UPDATE t SET a = 1000 WHERE id = 1")
    result = harness.materialize(raise_on_error=False)
    message = _failure(result)
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert f"stream(s) {harness.source_name}.t" in message and "column a" in message, message
    assert "a permanent error" in message and "ingest refresh" in message, message
