"""HTTP API streams end to end through the asset: the real demo API on loopback, OAuth, changing data,
faults, a crash mid-read; the target equals the server's data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets.sources.rest.incremental import REREAD_FROM
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog as _catalog


@pytest.fixture
def api() -> Iterator[DemoApi]:
    server = start_demo_api(orders=230, customers=40, tie_group=9, token_ttl=3.0)
    try:
        yield server
    finally:
        server.stop()


def _assert_target_equals_server(harness: StreamHarness, api: DemoApi) -> None:
    expected = sorted((r["id"], r["updated_at"], r["status"], len(r["items"])) for r in api.records("orders"))
    rows = harness.query_target(
        f'SELECT o.id, o.updated_at, o.status, (SELECT count(*) FROM "{harness.source_name}".orders__items i '
        f'WHERE i._dlt_parent_id = o._dlt_id) FROM "{harness.source_name}".orders o ORDER BY o.id'
    )
    actual = sorted((r[0], _iso(r[1]), r[2], r[3]) for r in rows)
    assert len({r[0] for r in actual}) == len(actual), "duplicate primary keys in the target"
    assert actual == expected


def _iso(value: Any) -> str:
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text.replace("+00:00", "Z")


def _rows_read(harness: StreamHarness, result: Any) -> int:
    return int(result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata["rows read"].value)


def test_incremental_api_sync_over_several_rounds_matches_the_server(harness: StreamHarness, api: DemoApi) -> None:
    _catalog(harness, api)
    first = harness.materialize()
    assert _rows_read(harness, first) == 230
    _assert_target_equals_server(harness, api)
    metadata = first.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata
    assert metadata["dagster/row_count"].value == 230 and metadata["http requests"].value >= 230 // 20
    assert metadata["bytes received"].value > 0 and {"http 429s", "http retries"} <= set(metadata)
    for _ in range(3):
        api.mutate("orders", inserts=15, updates=25)  # updates change status, items and updated_at
        result = harness.materialize()
        assert _rows_read(harness, result) < 100  # only what changed (plus ties at the boundary)
        _assert_target_equals_server(harness, api)
    checkpoint = harness.checkpoint("orders")
    assert (
        checkpoint is not None
        and checkpoint.position is not None
        and set(checkpoint.position) - {REREAD_FROM} == {"updated_at", "id"}
    )


def test_a_crash_mid_read_resumes_near_where_it_stopped(
    harness: StreamHarness, api: DemoApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    _catalog(harness, api)
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:2")  # three slices of 3 pages of 20 committed, then death
    assert not harness.materialize(raise_on_error=False).success
    checkpoint = harness.checkpoint("orders")
    assert checkpoint is not None and checkpoint.position is not None
    monkeypatch.delenv(FAULT_ENV)
    resumed = _rows_read(harness, harness.materialize())
    assert resumed < 230 - 150  # resumed near record 180, not from zero
    _assert_target_equals_server(harness, api)


def test_a_crash_mid_read_of_a_newest_first_api_loses_nothing(
    harness: StreamHarness, api: DemoApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.configure(newest_first=True)  # Stripe's and GitHub's default order: the oldest records come last
    _catalog(harness, api)
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:2")  # the 180 newest of 230 committed, then death
    assert not harness.materialize(raise_on_error=False).success
    checkpoint = harness.checkpoint("orders")  # no position claimed: the 50 unread records are older
    assert checkpoint is None or not checkpoint.position
    monkeypatch.delenv(FAULT_ENV)
    assert _rows_read(harness, harness.materialize()) == 230  # read again in full (merge keeps it exact)
    _assert_target_equals_server(harness, api)
    api.mutate("orders", inserts=15, updates=25)
    assert _rows_read(harness, harness.materialize()) < 100  # a finished read claimed its newest record
    _assert_target_equals_server(harness, api)


def test_429_storms_5xx_bursts_and_resets_still_end_exact(harness: StreamHarness, api: DemoApi) -> None:
    _catalog(harness, api)
    api.fail_next("429", 4)
    api.fail_next("5xx", 3)
    api.fail_next("reset", 2)
    harness.materialize()
    _assert_target_equals_server(harness, api)
    statuses = [entry["status"] for entry in api.request_log()]
    assert 429 in statuses and 503 in statuses


def test_a_wrong_path_fails_at_once_with_an_actionable_message(harness: StreamHarness, api: DemoApi) -> None:
    _catalog(harness, api, path="/v1/nope")
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.step_failure_data.error)
    assert "/v1/nope" in message and "404" in message
    assert api.config.client_secret not in message


def test_check_reports_bad_credentials_without_the_secret(
    harness: StreamHarness, api: DemoApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingestion_assets.cli import main

    _catalog(harness, api)
    (harness.tmp_path / "secrets" / "client_secret").write_text("wrong-secret-value")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert "orders" in out and "wrong-secret-value" not in out and api.config.client_secret not in out


def test_a_record_with_a_nul_character_is_parked_not_changed(harness: StreamHarness, api: DemoApi) -> None:
    """dlt drops NUL from text as it loads (neither DuckDB nor PostgreSQL text holds it): the value would
    change without a word. The record is parked with the field named; the rest load."""
    patched = api.patch("orders", 2, {"status": "bad\x00value"})
    _catalog(harness, api)
    harness.materialize()
    loaded = harness.query_target(f'SELECT id FROM "{harness.source_name}".orders')
    assert len(loaded) == 228 and not {row[0] for row in loaded} & set(patched)
    parked = harness.query_target(
        f'SELECT record_key, error FROM "{harness.source_name}"._ingest_dead_letter ORDER BY record_key'
    )
    assert sorted(int(key) for key, _ in parked) == sorted(patched)
    assert all("['status'] hold a NUL character" in error for _, error in parked)


def test_a_record_with_a_nul_character_is_parked_on_postgres_too(harness: StreamHarness, api: DemoApi) -> None:
    """Its dead letter failed on PostgreSQL: the raw record holds the JSON escape `\\u0000`, which jsonb refuses
    ("unsupported Unicode escape sequence"), and dlt retried the load until the run failed. On PostgreSQL a NUL
    in a dead letter reads as the text `\\u0000`; the rest load."""
    api.put("orders", [{"id": 1, "name": "a"}, {"id": 2, "name": "b\x00c"}, {"id": 3, "o": {"x\x00": "y"}}])
    _catalog(harness, api, destination="postgres")
    harness.materialize()
    schema = harness.source_name
    assert harness.query_target(f'SELECT id, name FROM "{schema}".orders WHERE id <= 3') == [(1, "a")]
    parked = harness.query_target(f'SELECT record_key, error, raw_record FROM "{schema}"._ingest_dead_letter')
    found = {key: (error, raw) for key, error, raw in parked}
    assert sorted(found) == ["2", "3"]
    assert "['name'] hold a NUL character" in found["2"][0] and found["2"][1]["name"] == "b\\u0000c"
    assert "hold a NUL character" in found["3"][0]
    assert found["3"][1]["o"] == {"x\\u0000": "y"}


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_record_with_a_lone_surrogate_is_parked_not_fatal(
    harness: StreamHarness, api: DemoApi, destination: str
) -> None:
    """`"\\ud800"` (half a UTF-16 pair, no character) parsed into a string Arrow cannot encode: the run failed
    ("Pipeline execution failed at step=extract", a permanent error naming nothing). The record is parked naming
    the field; its dead letter shows the escape as text (DuckDB's JSON and PostgreSQL's jsonb refuse half a pair);
    a whole pair loads."""
    api.put(
        "orders", [{"id": 1, "name": "a\ud83d\ude00"}, {"id": 2, "name": "b\ud800c"}, {"id": 3, "o": {"k\udc00": 1}}]
    )
    _catalog(harness, api, destination=destination)
    harness.materialize()
    schema = harness.source_name
    assert harness.query_target(f'SELECT id, name FROM "{schema}".orders WHERE id <= 3') == [(1, "a\U0001f600")]
    parked = harness.query_target(f'SELECT record_key, error, raw_record FROM "{schema}"._ingest_dead_letter')
    found = {key: (error, raw if isinstance(raw, dict) else json.loads(raw)) for key, error, raw in parked}
    assert sorted(found) == ["2", "3"]
    assert "invalid text: the value of 'name' holds the escape \\ud800" in found["2"][0]
    assert "invalid text: the key 'o.k\\udc00' holds the escape \\udc00" in found["3"][0]
    assert found["2"][1]["name"] == "b\\ud800c"  # as the escape's text: no target's JSON holds half a pair


def test_a_literal_client_id_authenticates_and_a_literal_secret_is_refused(harness: StreamHarness, api: DemoApi) -> None:
    """The OAuth client id is no secret (errors name it): the catalog may hold it as it is. The secret stays a
    reference: a literal one is refused when the catalog loads, naming the key and not echoing the value."""
    import yaml

    from ingestion_assets.catalog import CatalogError, load_catalog

    _catalog(harness, api)
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    auth = catalog["sources"][harness.source_name]["auth"]
    auth["client_id"] = api.config.client_id
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    harness.materialize()
    _assert_target_equals_server(harness, api)
    auth["client_secret"] = api.config.client_secret
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    with pytest.raises(CatalogError) as raised:
        load_catalog(harness.catalog_path)
    assert "client_secret" in str(raised.value) and api.config.client_secret not in str(raised.value)


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_first_read_that_finds_no_record_succeeds_and_the_next_loads_what_came(
    harness: StreamHarness, destination: str
) -> None:
    """A new, empty account (found by a README-only attack): the first run loaded nothing, so nothing had made the
    target's schema, and recording the target's binding there failed the run as permanent."""
    server = start_demo_api(orders=0, customers=0, tie_group=1, token_ttl=3.0)
    try:
        _catalog(harness, server, destination)
        harness.materialize()
        harness.materialize()
        server.mutate("orders", inserts=12)
        harness.materialize()
        _assert_target_equals_server(harness, server)
    finally:
        server.stop()


def test_a_refresh_swaps_in_the_nested_tables_with_their_root(harness: StreamHarness, api: DemoApi) -> None:
    """Each order's `items` land in the nested table `orders__items`, tied to its order by `_dlt_parent_id`: a
    refresh's new generation brings its own, swapped in with the root (before, the old ones stayed, tied to no
    order, and the new generation's were left in `orders_refresh_g2__items`; recheck25b)."""
    from ingestion_assets.state.summary import request_refresh

    _catalog(harness, api)
    harness.materialize()
    api.mutate("orders", inserts=5, updates=10)
    request_refresh(harness.settings, harness.source_name, "orders", "remove")
    assert harness.materialize().success
    _assert_target_equals_server(harness, api)
    schema = harness.source_name
    ((orphans,),) = harness.query_target(
        f'SELECT count(*) FROM "{schema}".orders__items i WHERE NOT EXISTS '
        f'(SELECT 1 FROM "{schema}".orders o WHERE o._dlt_id = i._dlt_parent_id)'
    )
    ((held,),) = harness.query_target(f'SELECT count(*) FROM "{schema}".orders__items')
    assert orphans == 0 and held == sum(len(r["items"]) for r in api.records("orders"))
    tables = {
        t
        for (t,) in harness.query_target(
            f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'"
        )
    }
    assert not [t for t in tables if "_refresh_g" in t], tables
