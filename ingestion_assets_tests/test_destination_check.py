"""`ingest check` reaches the destination read only: MariaDB (sqlalchemy), a DuckDB file's folder, a lake's
folder, and the run-time refusals of a Celery deployment (a sqlite URL, key_prefix with RabbitMQ)."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from ingestion_assets.catalog import Catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.destination_check import check_destination
from ingestion_assets.settings import Settings
from ingestion_assets_tests.destination_targets import MARIADB
from ingestion_assets_tests.test_destinations_s3 import KEYS, s3_endpoint

__all__ = ["s3_endpoint"]  # the fixture

API = {"type": "rest", "base_url": "https://api.test", "streams": {"s": {"path": "/s", "primary_key": "id"}}}


def _destination_problems(tmp_path: Path, destination: dict[str, object], **catalog: object) -> list[str]:
    settings = Settings(home=tmp_path / "home", catalog_path=tmp_path / "catalog.yaml")
    return check_destination(
        settings, Catalog.model_validate({"destination": destination, "sources": {"api": API}, **catalog})
    )


def test_check_connects_to_a_mariadb_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pymysql.connect(**MARIADB).close()  # MariaDB runs here (root, no password)
    destination = {"type": "sqlalchemy", "credentials": {"env": "TEST_WAREHOUSE_URL"}}
    monkeypatch.setenv("TEST_WAREHOUSE_URL", "mysql+pymysql://root:@127.0.0.1:3306/mysql")
    assert _destination_problems(tmp_path, destination) == []
    monkeypatch.setenv("TEST_WAREHOUSE_URL", "mysql+pymysql://root:s3cret@127.0.0.1:3306/no_such_database")
    problems = _destination_problems(tmp_path, destination)
    assert len(problems) == 1 and "cannot connect" in problems[0] and "s3cret" not in problems[0], problems
    monkeypatch.setenv("TEST_WAREHOUSE_URL", "not a url s3cret")
    assert "is not a SQLAlchemy URL" in _destination_problems(tmp_path, destination)[0]


def test_check_refuses_local_paths_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert _destination_problems(tmp_path, {"type": "duckdb", "path": str(tmp_path / "w.duckdb")}) == []
    duck = _destination_problems(tmp_path, {"type": "duckdb", "path": str(blocker / "w.duckdb")})
    assert duck == [f"destination.path: {blocker / 'w.duckdb'} cannot be created: {blocker} is a file, not a folder"]
    lake = _destination_problems(tmp_path, {"type": "filesystem", "bucket_url": str(blocker / "lake")})
    assert len(lake) == 1 and lake[0].startswith("destination.bucket_url") and "is a file" in lake[0]
    drops = tmp_path / "drops"
    drops.mkdir()
    files = {"type": "files", "url": str(drops), "streams": {"d": {"path": "*.csv"}}}
    catalog = Catalog.model_validate(
        {"destination": {"type": "duckdb", "path": str(blocker / "w.duckdb")}, "sources": {"f": files}}
    )
    settings = Settings(home=tmp_path / "home", catalog_path=tmp_path / "catalog.yaml")
    assert check_catalog(settings, catalog) == duck  # `ingest check` reports it


def test_check_refuses_what_a_celery_run_would_refuse_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'w.sqlite'}")
    monkeypatch.setenv("TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
    sqlite = {"type": "sqlalchemy", "credentials": {"env": "TEST_WAREHOUSE_URL"}}
    celery = {"executor": "celery", "celery": {"broker": {"env": "TEST_BROKER"}}}
    assert _destination_problems(tmp_path, sqlite) == []  # one process: a sqlite file is fine
    problems = _destination_problems(tmp_path, sqlite, execution=celery)
    assert len(problems) == 1 and "is a sqlite URL" in problems[0]
    prefixed = {"executor": "celery", "celery": {"broker": {"env": "TEST_BROKER"}, "key_prefix": "a:"}}
    mariadb = {"type": "sqlalchemy", "credentials": {"env": "TEST_WAREHOUSE_URL"}}
    monkeypatch.setenv("TEST_WAREHOUSE_URL", "mysql+pymysql://root:@127.0.0.1:3306/mysql")
    problems = _destination_problems(tmp_path, mariadb, execution=prefixed)
    assert len(problems) == 1 and "key_prefix" in problems[0] and "virtual host" in problems[0]


@pytest.mark.slow  # moto's S3 server starts in its own process
def test_check_lists_the_lakes_bucket(tmp_path: Path, s3_endpoint: str) -> None:
    import json

    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint, **KEYS).create_bucket(Bucket="lake-here")
    secret = tmp_path / "lake_credentials.json"
    secret.write_text(json.dumps({**KEYS, "endpoint_url": s3_endpoint}))
    lake = {"type": "filesystem", "bucket_url": "s3://lake-here/tables", "credentials": {"file": str(secret)}}
    assert _destination_problems(tmp_path, lake) == []
    missing = _destination_problems(tmp_path, {**lake, "bucket_url": "s3://no-such-bucket/tables"})
    assert len(missing) == 1 and "cannot list the bucket" in missing[0], missing
