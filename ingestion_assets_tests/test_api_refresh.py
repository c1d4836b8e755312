"""`ingest refresh` of an HTTP API stream on every destination: the run after the refresh goes on from the refresh's
checkpoint (it reads nothing again when nothing changed, one new record when one came), and the nested tables of the
records' lists (`orders__items`) hold the new generation's children alone, each tied to its order."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets.state.summary import request_refresh
from ingestion_assets_tests.destination_targets import MariaDb, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

__all__ = ["mariadb"]

LAKES = ("delta", "iceberg")


@pytest.fixture
def api() -> Iterator[DemoApi]:
    server = start_demo_api(orders=50, customers=5, tie_group=3)
    try:
        yield server
    finally:
        server.stop()


def _catalog(harness: StreamHarness, api: DemoApi, destination: str, request: pytest.FixtureRequest) -> None:
    write_api_catalog(harness, api, destination="postgres" if destination == "postgres" else "duckdb")
    if destination == "mariadb":
        maria: MariaDb = request.getfixturevalue("mariadb")
        use_destination(harness, maria.destination())
        maria.datasets.append(harness.source_name)
    elif destination in LAKES:
        lake = harness.tmp_path / "lake"
        use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": destination})


def _rows(harness: StreamHarness, destination: str, request: pytest.FixtureRequest, table: str) -> list[dict[str, Any]]:
    """Every row of the stream's table (or a nested one) in the destination, as dicts."""
    schema = harness.source_name
    if destination in LAKES:
        url = harness.tmp_path / "lake" / schema / table
        if destination == "delta":
            from deltalake import DeltaTable

            return list(DeltaTable(str(url)).to_pyarrow_table().to_pylist())
        from pyiceberg.table import StaticTable

        metadata = sorted((url / "metadata").glob("*.metadata.json"))[-1]
        return list(StaticTable.from_metadata(str(metadata)).scan().to_arrow().to_pylist())
    if destination == "mariadb":
        maria: MariaDb = request.getfixturevalue("mariadb")
        with maria.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{schema}`.`{table}`")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    if destination == "postgres":
        with harness.source.connect() as conn, conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{schema}"."{table}"')
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    import duckdb

    with duckdb.connect(str(harness.warehouse), read_only=True) as con:
        cursor = con.execute(f'SELECT * FROM "{schema}"."{table}"')
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _tables(harness: StreamHarness, destination: str, request: pytest.FixtureRequest) -> set[str]:
    schema = harness.source_name
    if destination in LAKES:
        return {p.name for p in (harness.tmp_path / "lake" / schema).iterdir() if not p.name.startswith("_dlt")}
    if destination == "mariadb":
        maria: MariaDb = request.getfixturevalue("mariadb")
        found = maria.query(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'")
    else:
        found = harness.query_target(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'")
    return {str(name) for (name,) in found}


def _instant(value: Any) -> dt.datetime:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _assert_target_equals_server(harness: StreamHarness, api: DemoApi, destination: str, request: Any) -> None:
    """Row by row: each order once with the server's values, and its items (by position) tied to it alone."""
    orders = _rows(harness, destination, request, "orders")
    items = _rows(harness, destination, request, "orders__items")
    keys = [int(r["id"]) for r in orders]
    assert len(set(keys)) == len(keys), "duplicate primary keys in the target"
    by_row = {r["_dlt_id"]: int(r["id"]) for r in orders}
    orphans = [i for i in items if i["_dlt_parent_id"] not in by_row]
    assert not orphans, f"{len(orphans)} item(s) tied to no order, e.g. {orphans[:2]}"
    held_items: dict[int, list[tuple[Any, ...]]] = {}
    for item in sorted(items, key=lambda i: int(i["_dlt_list_idx"])):
        held_items.setdefault(by_row[item["_dlt_parent_id"]], []).append((str(item["sku"]), int(item["qty"])))
    actual = sorted(
        (int(r["id"]), _instant(r["updated_at"]), r["status"], held_items.get(int(r["id"]), [])) for r in orders
    )
    expected = sorted(
        (r["id"], _instant(r["updated_at"]), r["status"], [(str(i["sku"]), int(i["qty"])) for i in r["items"]])
        for r in api.records("orders")
    )
    assert actual == expected


def _run(harness: StreamHarness) -> tuple[int, str | None]:
    """Rows read by one run of the stream, and why it started over (None: it went on from its checkpoint)."""
    result = harness.materialize()
    assert result.success
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata
    started = metadata.get("started over")
    return int(metadata["rows read"].value), None if started is None else str(started.value)


@pytest.mark.parametrize(
    ("destination", "mode"),
    [  # the binding: DuckDB in the default suite; lakes: children added twice (SILENT) before, each tested
        ("duckdb", "remove"),
        ("delta", "remove"),
        ("iceberg", "remove"),
        pytest.param("duckdb", "retain", marks=pytest.mark.slow),
        pytest.param("postgres", "remove", marks=pytest.mark.slow),
        pytest.param("mariadb", "remove", marks=pytest.mark.slow),
        pytest.param("mariadb", "retain", marks=pytest.mark.slow),
        pytest.param("delta", "retain", marks=pytest.mark.slow),
    ],
)
def test_the_run_after_a_refresh_goes_on_from_it_and_nested_tables_follow(
    harness: StreamHarness, api: DemoApi, destination: str, mode: str, request: pytest.FixtureRequest
) -> None:
    """Before, an API stream's shadow loader recorded its binding under the shadow's name: after the swap the
    stream's row in `_ingest_bindings` was still the old generation's, and the next run re-read the whole API
    ("holds another copy of this stream than the one the checkpoint describes"). On a lake, the swap also left
    the old `orders__items` (children of no order) and the new ones in `orders_refresh_g2__items`; and children
    moved as they were kept ids dlt derived from the shadow's name, so the next merge of their order added each
    again under the stream's name."""
    _catalog(harness, api, destination, request)
    first, _ = _run(harness)
    assert first == 50
    quiet, why = _run(harness)  # a run with nothing new reads the last cursor's ties again (inclusive filter)
    assert why is None and quiet == _last_ties(api)
    api.mutate("orders", inserts=3, updates=5)  # updates change status, items and updated_at
    time.sleep(1.1)  # after the changes by the server's clock (in seconds): the refresh re-reads none of them later
    request_refresh(harness.settings, harness.source_name, "orders", mode)
    refreshed, _ = _run(harness)
    assert refreshed == 53
    _assert_target_equals_server(harness, api, destination, request)
    again, why = _run(harness)
    assert why is None, why
    assert again == _last_ties(api)  # nothing new: the boundary's ties alone, not the whole stream
    ties = _last_ties(api)
    api.mutate("orders", inserts=1)
    one, why = _run(harness)
    assert why is None, why
    assert one == ties + 1
    _assert_target_equals_server(harness, api, destination, request)
    assert not [t for t in _tables(harness, destination, request) if "_refresh_g" in t]


def _last_ties(api: DemoApi) -> int:
    """How many records share the newest `updated_at` (what a read from the last position serves again)."""
    stamps = [r["updated_at"] for r in api.records("orders")]
    return stamps.count(max(stamps))
