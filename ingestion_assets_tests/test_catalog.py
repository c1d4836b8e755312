"""A broken catalog fails on load with the file, the key path and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingestion_assets.catalog import CatalogError, load_catalog
from ingestion_assets.settings import demo_catalog_path

VALID = """
sources:
  shop:
    type: postgres
    connection: {env: SHOP_URL}
    streams:
      orders: {table: public.orders, primary_key: id, cursor: updated_at}
"""


def _load(tmp_path: Path, text: str) -> CatalogError:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert str(path) in str(caught.value)
    return caught.value


def test_the_demo_catalog_is_valid() -> None:
    catalog = load_catalog(demo_catalog_path())
    assert [(s, t) for s, _, t, _ in catalog.streams()] == [
        ("shop", "orders"),
        ("shop", "customers"),
        ("shop", "products"),
        ("shop", "customer_history"),
        ("shop_cdc", "products"),
        ("demo_api", "orders"),
        ("demo_api", "customers"),
    ]


def test_a_valid_catalog_normalises_single_columns_to_lists(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID)
    stream = load_catalog(path).sources["shop"].streams["orders"]
    assert stream.primary_key == ["id"] and stream.cursor == ["updated_at"]
    assert (stream.schema_name, stream.table_name, stream.write_disposition) == ("public", "orders", "merge")
    assert (stream.reconcile.scope, stream.reconcile.full_every_seconds, stream.reconcile.deletes) == (
        "window",
        None,
        "report",
    )


@pytest.mark.parametrize(
    ("reconcile", "expected"),
    [
        ("full", ("full", None, "report")),  # the shape before deletes could be detected stays valid
        ("off", ("off", None, "report")),
        ("{full_every_seconds: 3600, deletes: soft}", ("window", 3600.0, "soft")),
        ("{scope: full, deletes: hard}", ("full", None, "hard")),
    ],
)
def test_reconcile_takes_a_scope_or_a_cadence_with_deletes(
    tmp_path: Path, reconcile: str, expected: tuple[object, ...]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID.replace("cursor: updated_at", f"cursor: updated_at, reconcile: {reconcile}"))
    settings = load_catalog(path).sources["shop"].streams["orders"].reconcile
    assert (settings.scope, settings.full_every_seconds, settings.deletes) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            VALID.replace("primary_key: id, ", ""),
            "sources.shop.streams.orders.primary_key: required key is missing",
        ),
        (
            VALID.replace("cursor: updated_at", "cursor: updated_at, slice_rows: 0"),
            "sources.shop.streams.orders.slice_rows: Input should be greater than 0",
        ),
        (
            VALID.replace("cursor: updated_at", "cursor: updated_at, write_disposition: upsert"),
            "sources.shop.streams.orders.write_disposition",
        ),
        (
            VALID.replace("primary_key:", "primary_keys:"),
            "sources.shop.streams.orders.primary_keys: unknown key",
        ),
        (VALID.replace("{env: SHOP_URL}", "postgresql://u:p@h/db"), "sources.shop.connection"),
        (
            VALID.replace("{env: SHOP_URL}", "{env: A, file: /b}"),
            "sources.shop.connection: give exactly one of `env`, `file`, `embedded` or `service`",
        ),
        (VALID.replace("orders:", "Orders-2:"), "sources.shop.streams.Orders-2: name 'Orders-2'"),
        (VALID.replace("type: postgres", "type: oracle"), "sources.shop.type"),
        (
            VALID.replace("public.orders", "a.b.c"),
            "sources.shop.streams.orders.table: expected `schema.table`",
        ),
        (  # found by the CDC simulation: DuckDB reads `shop.orders` as file `shop` or schema `shop`
            "destination: {type: duckdb, path: /data/shop.duckdb}\n" + VALID,
            "the DuckDB file is named like the source 'shop'",
        ),
        (  # found by attack19a: PostgreSQL refuses `pg_*` schemas, dlt's `pg_staging` of source `pg` among them
            "destination: {type: postgres, credentials: {env: W}}\n" + VALID.replace("  shop:", "  pg:"),
            "sources.pg: on a PostgreSQL destination the source 'pg' lands in schema 'pg' and dlt's staging schema "
            "'pg_staging', and PostgreSQL refuses the schema name 'pg_staging' (names starting with `pg_` are "
            "reserved for its system schemas). Rename the source (e.g. 'postgres';",
        ),
        (
            "destination: {type: postgres, credentials: {env: W}}\n" + VALID.replace("  shop:", "  pg_shop:"),
            "PostgreSQL refuses the schema name 'pg_shop' (names starting with `pg_` are reserved for its system "
            "schemas). Rename the source (e.g. 'pgshop';",
        ),
        (
            VALID.replace("cursor: updated_at", "cursor: updated_at, reconcile: {deletes: hard}"),
            "sources.shop.streams.orders.reconcile: deletes are found by a full comparison",
        ),
        (
            VALID.replace(
                "cursor: updated_at",
                "cursor: updated_at, write_disposition: append, reconcile: {scope: full, deletes: soft}",
            ),
            "reconcile.deletes: soft needs write_disposition merge",
        ),
        (
            VALID.replace("type: postgres", "type: postgres\n    mode: cdc").replace(
                "cursor: updated_at", "reconcile: {full_every_seconds: 60, deletes: hard}"
            ),
            "cdc streams receive deletes from the log",
        ),
        (VALID.replace("cursor: updated_at", "cursor: updated_at, reconcile: sometimes"), "reconcile.scope"),
        ("sources: [1, 2]", "sources: Input should be a valid dictionary"),
        ("sources:\n  shop: {type: postgres\n", "not valid YAML"),
        ("- just a list", "the top level must be a mapping"),
    ],
)
def test_a_broken_catalog_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    error = _load(tmp_path, text)
    assert expected in str(error), str(error)


def test_a_literal_secret_is_not_echoed_in_the_error(tmp_path: Path) -> None:
    error = _load(tmp_path, VALID.replace("{env: SHOP_URL}", "postgresql://user:hunter2@db/shop"))
    assert "hunter2" not in str(error)


def test_a_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="INGEST_CATALOG"):
        load_catalog(tmp_path / "nope.yaml")


def test_a_table_name_may_be_written_as_sql_quotes_it() -> None:
    """`public."Weird Table"` read the quotes as part of the name; a quoted name may also hold a dot."""
    from ingestion_assets.catalog.postgres import split_table_name

    assert split_table_name('public."Weird Table"') == ("public", "Weird Table")
    assert split_table_name('"my.schema"."a ""b"""') == ("my.schema", 'a "b"')
    assert split_table_name("Mixed Table") == ("public", "Mixed Table")  # unquoted names stay as written
    for bad in ("a.b.c", "a.", '"open', '"a"b'):
        with pytest.raises(ValueError, match=r"schema\.table|unterminated"):
            split_table_name(bad)
