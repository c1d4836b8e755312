"""Schema drift in an API's records, through the asset: a new field and a widened type are applied, an
incompatible type pauses the stream until `ingest schema accept`; the target is compared with the server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog


@pytest.fixture
def api() -> Iterator[DemoApi]:
    server = start_demo_api(orders=90, customers=10, tie_group=9)
    try:
        yield server
    finally:
        server.stop()


def _columns(harness: StreamHarness) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in harness.query_target(f'DESCRIBE "{harness.source_name}".orders')}


def _failed_checks(harness: StreamHarness, result: dg.ExecuteInProcessResult) -> list[str]:
    events = [r.dagster_event for r in harness.instance.all_logs(result.run_id) if r.dagster_event is not None]
    evaluations = [e.asset_check_evaluation_data for e in events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return [e.check_name for e in evaluations if not e.passed]


def _cli(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(list(argv)) == 0


def test_a_new_field_and_a_widened_type_are_applied(
    harness: StreamHarness, api: DemoApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_api_catalog(harness, api)
    harness.materialize()
    api.patch("orders", 10, {"score": 1})  # a new field
    harness.materialize()
    api.patch("orders", 10, {"score": "A+"})  # the same field, now text: widened (text holds any value)
    result = harness.materialize()
    assert _columns(harness)["score"] == "VARCHAR"
    server = {r["id"]: None if r.get("score") is None else str(r["score"]) for r in api.records("orders")}
    target = dict(harness.query_target(f'SELECT id, score FROM "{harness.source_name}".orders'))
    assert target == server and "A+" in target.values() and "1" in target.values()
    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "schema")
    assert check.passed and any("score" in c and "widened" in c for c in check.metadata["changes applied"].value)
    capsys.readouterr()
    _cli(harness, monkeypatch, "schema", "show", f"{harness.source_name}.orders")  # it used to crash
    shown = capsys.readouterr().out
    assert "score" in shown and "text" in shown and "timestamp with time zone" in shown


def test_an_incompatible_type_pauses_until_accepted(
    harness: StreamHarness, api: DemoApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Doubles (1E+3, whole) meeting an integer no double holds: bigint, which a double column cannot take without
    rounding. Accepted, the column becomes bigint, every double already there converted exactly."""
    write_api_catalog(harness, api)
    api.patch("orders", 10, {"rate": Decimal("1E+3")})
    time.sleep(1.1)  # the next read starts at the newest record's whole second (its re-read margin): not this one
    api.put("orders", [{"id": 1000, "number": "00001000"}])  # the newest: the next read, from it, has no double
    harness.materialize()
    before = harness.checkpoint("orders")
    changed = api.patch("orders", 5, {"rate": 2**60 + 1})
    result = harness.materialize(raise_on_error=False)
    assert not result.success and _failed_checks(harness, result) == ["schema"]
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = str(failure.step_failure_data.error)
    assert (
        "'rate'" in message
        and "double precision -> bigint (incompatible)" in message
        and f"ingest schema accept {harness.source_name}.orders" in message
    )
    after = harness.checkpoint("orders")
    assert before is not None and after is not None and after.position == before.position  # nothing loaded
    capsys.readouterr()
    _cli(harness, monkeypatch, "schema", "show", f"{harness.source_name}.orders")
    assert "paused" in capsys.readouterr().out

    _cli(harness, monkeypatch, "schema", "accept", f"{harness.source_name}.orders")
    harness.materialize()
    columns = _columns(harness)
    assert columns["rate"] == "BIGINT" and "rate__float8" in columns  # the old values are kept beside it
    target = dict(harness.query_target(f'SELECT id, rate FROM "{harness.source_name}".orders'))
    assert {k: target[k] for k in changed} == dict.fromkeys(changed, 2**60 + 1)
    assert target == {r["id"]: None if r.get("rate") is None else int(r["rate"]) for r in api.records("orders")}


def test_a_first_run_under_pause_adopts_the_records_fields(harness: StreamHarness, api: DemoApi) -> None:
    """The first run paused on every field as 'added' (no schema was stored: nothing had changed yet); a field
    that comes later still pauses."""
    write_api_catalog(harness, api, schema_policy="pause")
    harness.materialize()
    target = dict(harness.query_target(f'SELECT id, number FROM "{harness.source_name}".orders'))
    assert target == {r["id"]: r["number"] for r in api.records("orders")}
    api.patch("orders", 5, {"score": 1})
    result = harness.materialize(raise_on_error=False)
    assert not result.success and _failed_checks(harness, result) == ["schema"]
