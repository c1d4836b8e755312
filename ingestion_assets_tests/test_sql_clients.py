"""The SQL client a loader makes without a dlt pipeline (DuckDB, PostgreSQL) names the datasets exactly as the
pipeline's own clients do, so every statement of a run lands where dlt loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dlt
import pytest
from dlt.destinations.exceptions import DatabaseException

from ingestion_assets.catalog import load_catalog
from ingestion_assets.loading.destinations import make_destination, target_names
from ingestion_assets.loading.sql_clients import direct_sql_client
from ingestion_assets.settings import Settings
from ingestion_assets_tests.helpers import SourceDb

DATASETS = ["shop", "Shop Data", "select", "a" * 70]


def _settings(tmp_path: Path, destination: str) -> Settings:
    catalog = tmp_path / "catalog.yaml"
    source = "{type: postgres, connection: {env: UNUSED}, streams: {t: {table: t, primary_key: id}}}"
    catalog.write_text(f"destination: {destination}\nsources: {{s: {source}}}\n")
    return Settings(home=tmp_path / "home", catalog_path=catalog)


@pytest.mark.parametrize("naming", ["snake_case", "direct"])
@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_direct_clients_name_datasets_as_the_pipeline_does(
    tmp_path: Path, source_db: SourceDb, kind: str, naming: str
) -> None:
    if kind == "postgres":
        (tmp_path / "url").write_text(source_db.url)
        spec = f"{{type: postgres, credentials: {{file: {tmp_path / 'url'}}}, naming: {naming}}}"
    else:
        spec = f"{{type: duckdb, path: {tmp_path / 'w.duckdb'}, naming: {naming}}}"
    settings = _settings(tmp_path, spec)
    destination = load_catalog(settings.catalog_path).destination
    for i, dataset in enumerate(DATASETS):
        pipeline = dlt.pipeline(
            pipeline_name=f"names_{i}",
            pipelines_dir=str(tmp_path / "dlt"),
            destination=make_destination(settings, destination),
            dataset_name=dataset,
        )
        theirs = pipeline.sql_client()
        ours = direct_sql_client(settings, destination, target_names(destination), dataset)
        assert (ours.dataset_name, ours.staging_dataset_name) == (theirs.dataset_name, theirs.staging_dataset_name)
        for name in ("Orders", 'we"ird Name'):
            assert ours.make_qualified_table_name(name) == theirs.make_qualified_table_name(name)
            assert ours.escape_column_name(name) == theirs.escape_column_name(name)
            assert ours.make_qualified_table_name(name, quote=False) == theirs.make_qualified_table_name(name, False)
        assert ours.fully_qualified_dataset_name() == theirs.fully_qualified_dataset_name()
        with ours.with_staging_dataset(), theirs.with_staging_dataset():
            assert ours.make_qualified_table_name("Orders") == theirs.make_qualified_table_name("Orders")
    with direct_sql_client(settings, destination, target_names(destination), DATASETS[0]) as client:
        assert client.execute_sql("SELECT 1") == [(1,)]


def _scenario(client: Any) -> list[object]:
    """Statements that succeed, fail and roll back; what each returned or raised (class, the cause's class)."""
    outcomes: list[object] = []

    def run(statement: str, *args: object) -> None:
        try:
            outcomes.append(client.execute_sql(statement, *args))
        except DatabaseException as exc:
            outcomes.append((type(exc).__name__, type(exc.__cause__).__name__))

    table = client.make_qualified_table_name("t")
    run(f"CREATE SCHEMA IF NOT EXISTS {client.fully_qualified_dataset_name()}")
    run(f"DROP TABLE IF EXISTS {table}")
    run(f"SELECT 1 FROM {table}")  # no such table
    run("SELEC 1")
    run(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    run(f"INSERT INTO {table} VALUES (%s, %s)", 1, "a")
    run(f"INSERT INTO {table} VALUES (%s, %s)", 1, "b")  # a duplicate key
    try:
        with client.begin_transaction():
            run(f"INSERT INTO {table} VALUES (2, 'c')")
            client.execute_sql(f"INSERT INTO {table} VALUES (1, 'd')")
    except DatabaseException as exc:
        outcomes.append(("transaction", type(exc).__name__))
    with client.begin_transaction():
        run(f"INSERT INTO {table} VALUES (3, 'e')")
    run(f"SELECT id, v FROM {table} ORDER BY id")
    run(f"DELETE FROM {table} WHERE id = 3")
    run(f"SELECT id FROM {table} WHERE v = %s", "a")
    run(f"DROP SCHEMA {client.fully_qualified_dataset_name()} CASCADE")
    return outcomes


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_direct_clients_answer_and_fail_as_dlts_own(tmp_path: Path, source_db: SourceDb, kind: str) -> None:
    """Our code catches dlt's exceptions (a missing table, terminal and transient errors): the client made without
    dlt raises the same classes, with the driver's error as the cause, and keeps dlt's transactions."""
    if kind == "postgres":
        (tmp_path / "url").write_text(source_db.url)
        spec = f"{{type: postgres, credentials: {{file: {tmp_path / 'url'}}}}}"
    else:
        spec = f"{{type: duckdb, path: {tmp_path / 'w.duckdb'}}}"
    settings = _settings(tmp_path, spec)
    destination = load_catalog(settings.catalog_path).destination
    dataset = f"errors_{kind}"
    pipeline = dlt.pipeline(
        pipeline_name="errors",
        pipelines_dir=str(tmp_path / "dlt"),
        destination=make_destination(settings, destination),
        dataset_name=dataset,
    )
    with pipeline.sql_client() as theirs:
        expected = _scenario(theirs)
    with direct_sql_client(settings, destination, target_names(destination), dataset) as ours:
        assert _scenario(ours) == expected
        assert not ours.has_table("t")  # the scenario dropped its schema: asked without a failing statement
        ours.execute_sql(f"CREATE SCHEMA {ours.fully_qualified_dataset_name()}")
        ours.execute_sql(f"CREATE TABLE {ours.make_qualified_table_name('t')} (id int)")
        assert ours.has_table("t") and not ours.has_table("u")
        ours.execute_sql(f"DROP SCHEMA {ours.fully_qualified_dataset_name()} CASCADE")
    assert ("DatabaseUndefinedRelation", "UndefinedTable" if kind == "postgres" else "CatalogException") in expected


@pytest.mark.parametrize("postgres", [True, False])
def test_literals_are_escaped_as_dlt_escapes_them(postgres: bool) -> None:
    """Reconciliation quotes its bounds with the client's `capabilities.escape_literal`, once dlt's own."""
    import datetime as dt
    from decimal import Decimal

    from dlt.common.data_writers import escape

    from ingestion_assets.loading.target_sql import escape_literal

    theirs = escape.escape_postgres_literal if postgres else escape.escape_duckdb_literal
    values: list[object] = [
        "plain",
        "it's",
        "back\\slash",
        "line\nbreak\r",
        "nul\x00byte",
        "",
        "é😀",
        b"\x00\xffbytes",
        None,
        0,
        -12,
        3.5,
        Decimal("12345678901234567890.123456789"),
        True,
        dt.date(2024, 1, 2),
        dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        dt.datetime(2024, 1, 2, 3, 4, 5),  # noqa: DTZ001 - a naive value is quoted as such
        dt.time(1, 2, 3),
        {"a": [1, "x"]},
        [1, 2],
    ]
    for value in values:
        assert escape_literal(value, postgres) == theirs(value), value
