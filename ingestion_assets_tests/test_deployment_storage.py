"""The repository's dagster.yaml (a deployment's, and what `dagster` reads in this folder without DAGSTER_HOME):
without INGEST_DAGSTER_PG_URL a `dagster` command says how to set it; with it, a working instance on PostgreSQL
(the embedded server here), whose reference a run's process opens again."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
import yaml
from dagster._serdes import serialize_value

from ingestion_assets.settings import Settings
from ingestion_assets_tests.helpers import REPO


@pytest.fixture
def deployment_home(tmp_path: Path) -> Path:
    """The repository's dagster.yaml, its artifacts under `tmp_path` (not /opt/dagster)."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["local_artifact_storage"]["config"]["base_dir"] = str(tmp_path / "storage")
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.fixture
def storage_url(session_settings: Settings) -> Iterator[str]:
    name = f"dagster_{uuid.uuid4().hex[:8]}"
    session_settings.embedded.ensure_database(name)
    try:
        yield session_settings.embedded.url(name, driver="psycopg2")
    finally:
        with contextlib.closing(psycopg2.connect(session_settings.embedded.url())) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_dagster_command_without_the_storage_url_says_how_to_set_it(deployment_home: Path) -> None:
    """Dagster's own words named the variable only ("... INGEST_DAGSTER_PG_URL which is not set")."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "INGEST_DAGSTER_PG_URL")}
    env["PYTHONPATH"] = str(REPO)
    dagster = Path(sys.executable).parent / "dagster"
    command = [str(dagster), "asset", "materialize", "-m", "ingestion_assets.definitions", "--select", "shop/orders"]
    done = subprocess.run(command, cwd=deployment_home, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    said = done.stderr.strip().splitlines()[-1]
    assert "INGEST_DAGSTER_PG_URL is not set" in said and 'eval "$(.venv/bin/ingest env)"' in said, done.stderr
    assert "export INGEST_DAGSTER_PG_URL=postgresql+psycopg2://" in said, said


def test_with_the_storage_url_the_instance_keeps_events_and_its_reference_opens_again(
    deployment_home: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INGEST_DAGSTER_PG_URL", storage_url)
    key = dg.AssetKey(["shop", "orders"])
    with dg.DagsterInstance.from_config(str(deployment_home)) as instance:
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=key, metadata={"lsn": "0/16B3748"}))
        ref = instance.get_ref()
        assert storage_url not in serialize_value(ref)  # the URL travels by its variable's name
    with dg.DagsterInstance.from_ref(ref) as again:  # as a run's process opens it
        (record,) = again.fetch_observations(key, limit=10).records
        observation = record.asset_observation
        assert observation is not None and observation.metadata["lsn"].value == "0/16B3748"
        assert again.get_runs() == []
