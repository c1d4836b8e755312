"""The SQL client a loader makes without a dlt pipeline (DuckDB, PostgreSQL) names the datasets exactly as the
pipeline's own clients do, so every statement of a run lands where dlt loads."""

from __future__ import annotations

from pathlib import Path

import dlt
import pytest

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
        assert ours.make_qualified_table_name("Orders") == theirs.make_qualified_table_name("Orders")
    with direct_sql_client(settings, destination, target_names(destination), DATASETS[0]) as client:
        assert client.execute_sql("SELECT 1") == [(1,)]
