"""Standalone use with dlt: the endpoint's records merged into a DuckDB file."""

from __future__ import annotations

from pathlib import Path

import dlt
import duckdb

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import BucketRegistry, rest_endpoint
from ingestion_assets_tests.rest.helpers import ORDERS, client, oauth


def test_rest_endpoint_merges_into_duckdb(api: DemoApi, buckets: BucketRegistry, tmp_path: Path) -> None:
    database = tmp_path / "warehouse.duckdb"
    pipeline = dlt.pipeline(
        "rest_test",
        destination=dlt.destinations.duckdb(str(database)),
        dataset_name="demo",
        pipelines_dir=str(tmp_path / "pipelines"),
    )
    with client(api, oauth(api), buckets) as rest:
        pipeline.run(rest_endpoint(rest, ORDERS))
        api.mutate("orders", inserts=3, updates=8)
        pipeline.run(rest_endpoint(rest, ORDERS))  # a full read again, merged on id
    expected = sorted((r["id"], r["number"], r["status"], r["customer"]["name"]) for r in api.records("orders"))
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.sql("select id, number, status, customer__name from demo.v1_orders order by id").fetchall()
    assert sorted(rows) == expected
