"""An API field whose later slices hold a narrower type than its target column (integers after the column became
text, integers in a double column, booleans in a text column) loads them in the column's type: no schema change,
no pause, every value present in the target as the API wrote it, on DuckDB and PostgreSQL."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

SLICES = [  # each loads in a run of its own; `code` becomes text in the second, `rate` double in the first
    [{"id": 1, "code": 7, "rate": 1.5, "flag": "yes"}, {"id": 2, "code": 8, "rate": 2, "flag": "no"}],
    [{"id": 3, "code": "A-3", "rate": 3, "flag": True}, {"id": 4, "code": 9, "rate": 4.25, "flag": "maybe"}],
    [{"id": 5, "code": 10, "rate": 5, "flag": False}, {"id": 6, "code": 11, "rate": 6, "flag": True}],
    [{"id": 1, "code": 12, "rate": 7, "flag": "yes"}],  # an update of a record loaded before
]


def _as_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_narrower_values_load_in_the_columns_type(harness: StreamHarness, empty_api: DemoApi, destination: str) -> None:
    write_api_catalog(harness, empty_api, destination=destination)
    for records in SLICES:
        empty_api.put("orders", [dict(r) for r in records])
        result = harness.materialize(raise_on_error=False)
        assert result.success, f"slice {records} did not load"
    expected: dict[int, dict[str, Any]] = {}
    for records in SLICES:
        for record in records:
            expected[record["id"]] = record
    rows = harness.query_target(f'SELECT id, code, rate, flag FROM "{harness.source_name}".orders ORDER BY id')
    assert [int(r[0]) for r in rows] == sorted(expected)
    for id_, code, rate, flag in rows:
        record = expected[int(id_)]
        assert code == str(record["code"]), (id_, code)  # every value present, none NULL
        assert rate is not None and Decimal(str(rate)) == Decimal(str(record["rate"])), (id_, rate)
        assert flag == _as_text(record["flag"]), (id_, flag)
    columns = harness.query_target(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders' "
        f"AND table_schema = '{harness.source_name}'"
    )
    assert not [c for (c,) in columns if "__" in str(c) and not str(c).startswith("_")]  # no history column


def _cli(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(list(argv)) == 0


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_an_accepted_change_that_would_lose_values_changes_nothing(
    harness: StreamHarness, empty_api: DemoApi, monkeypatch: pytest.MonkeyPatch, destination: str
) -> None:
    """A double column (1.25E-7) meeting an integer past 2**53 pauses as incompatible; accepted, bigint would round
    1.25E-7 to 0: the run refuses, naming stream, column and value, and the target keeps every value as it was."""
    write_api_catalog(harness, empty_api, destination=destination)
    empty_api.put("orders", [{"id": 1, "rate": Decimal("1.25E-7")}, {"id": 2, "rate": Decimal("1E+3")}])
    time.sleep(1.1)  # the next read starts at the newest record's whole second (its re-read margin): not theirs
    empty_api.put("orders", [{"id": 9}])  # the newest: the next read, from it, has no double
    harness.materialize()
    empty_api.put("orders", [{"id": 3, "rate": 2**60 + 1}])
    assert not harness.materialize(raise_on_error=False).success  # paused: incompatible
    _cli(harness, monkeypatch, "schema", "accept", f"{harness.source_name}.orders")
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = str(failure.step_failure_data.error)
    name = f"{harness.source_name}.orders"
    assert f"stream {name} is paused" in message and "'rate'" in message and "Nothing was changed" in message
    assert "e-07" in message and f"ingest refresh {name}" in message, message  # a value it would lose
    rows = harness.query_target(f'SELECT id, rate FROM "{harness.source_name}".orders ORDER BY id')
    assert [(int(i), None if r is None else float(r)) for i, r in rows] == [(1, 1.25e-7), (2, 1000.0), (9, None)]
    columns = harness.query_target(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders' "
        f"AND table_schema = '{harness.source_name}'"
    )
    assert "rate__float8" not in {str(c) for (c,) in columns}
