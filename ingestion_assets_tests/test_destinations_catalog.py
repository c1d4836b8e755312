"""The catalog's destinations: each type asks for what it needs, and passes credentials only by reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dlt.common.destination.reference import DestinationReference

from ingestion_assets.catalog import CatalogError, Destination, load_catalog
from ingestion_assets.loading.destinations import describe_destination, dlt_credentials, make_destination
from ingestion_assets.settings import Settings

SOURCES = """
sources:
  shop:
    type: postgres
    connection: {env: SHOP_URL}
    streams:
      orders: {table: public.orders, primary_key: id, cursor: updated_at}
"""


def _problems(tmp_path: Path, destination: str) -> str:
    path = tmp_path / "catalog.yaml"
    path.write_text(f"destination: {destination}\n{SOURCES}")
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    return str(caught.value)


@pytest.mark.parametrize(
    ("destination", "problem"),
    [
        ("{type: sqlalchemy}", "a sqlalchemy destination needs `credentials`"),
        ("{type: filesystem}", "a filesystem destination needs `bucket_url`"),
        ("{type: dlt}", "a dlt destination needs `name`"),
        ("{type: dlt, name: duckdb}", "use `type: duckdb`"),
        ("{type: dlt, name: ducklake}", "dlt's `ducklake` destination does not work with the DuckDB installed"),
        ("{type: duckdb, bucket_url: /x}", "bucket_url do not apply to a duckdb destination"),
        ("{type: filesystem, bucket_url: /x, options: {a: 1}}", "options do not apply"),
        ("{type: filesystem, bucket_url: /x, table_format: hudi}", "destination.table_format"),
        ("{type: dlt, name: snowflake, credentials: 'snowflake://u:p@x'}", "destination.credentials"),
    ],
)
def test_each_destination_type_names_what_it_lacks(tmp_path: Path, destination: str, problem: str) -> None:
    assert problem in _problems(tmp_path, destination)


def test_credentials_resolve_from_their_reference_and_never_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path, catalog_path=tmp_path / "catalog.yaml")
    monkeypatch.setenv("LAKE_KEYS", json.dumps({"aws_access_key_id": "id", "aws_secret_access_key": "s3cr3t"}))
    lake = Destination(type="filesystem", bucket_url="s3://bucket/raw", credentials={"env": "LAKE_KEYS"})
    assert dlt_credentials(settings, lake) == {"aws_access_key_id": "id", "aws_secret_access_key": "s3cr3t"}
    assert describe_destination(settings, lake) == "delta:s3://bucket/raw"
    monkeypatch.setenv("LAKE_KEYS", "{not json s3cr3t")
    with pytest.raises(ValueError, match="env:LAKE_KEYS") as caught:
        dlt_credentials(settings, lake)
    assert "s3cr3t" not in str(caught.value)


def test_a_passed_through_destination_is_dlts_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(home=tmp_path, catalog_path=tmp_path / "catalog.yaml")
    monkeypatch.setenv("WAREHOUSE_URL", "clickhouse://user:pw@localhost:9000/db")
    destination = Destination(type="dlt", name="clickhouse", credentials={"env": "WAREHOUSE_URL"})
    made = make_destination(settings, destination)
    assert made.destination_name == "clickhouse" or isinstance(made, DestinationReference)
    assert describe_destination(settings, destination) == "dlt:clickhouse"


def test_a_merging_stream_into_plain_parquet_is_refused_with_what_to_do(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "{type: filesystem, bucket_url: /x, table_format: parquet}")
    assert "stream shop.orders merges on its primary key" in problems
    assert "`table_format: delta` or `iceberg`" in problems and "`write_disposition: append`" in problems
    path = tmp_path / "catalog.yaml"  # appended versions are a choice the stream states: accepted
    path.write_text(
        "destination: {type: filesystem, bucket_url: /x, table_format: parquet}\n"
        + SOURCES.replace("cursor: updated_at}", "cursor: updated_at, write_disposition: append}")
    )
    assert load_catalog(path).destination.table_format == "parquet"


def test_files_deletes_into_plain_parquet_are_refused_naming_the_stream_and_the_choices(tmp_path: Path) -> None:
    table_format = "parquet"
    path = tmp_path / "catalog.yaml"
    files = "sources:\n  drops:\n    type: files\n    url: /x\n    streams:\n      orders: {path: '*.csv', %s}\n"
    lake = f"destination: {{type: filesystem, bucket_url: /x, table_format: {table_format}}}\n"
    path.write_text(lake + files % "write_disposition: append, deletes: soft")
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert "stream drops.orders has `deletes: hard|soft`" in str(caught.value)
    assert "`table_format: delta` or `iceberg`" in str(caught.value) and "`deletes: keep`" in str(caught.value)
    path.write_text(lake + files % "write_disposition: append, deletes: keep")
    assert load_catalog(path).destination.table_format == table_format
