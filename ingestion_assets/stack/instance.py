"""The Dagster instance on the embedded stack: storage database, dagster.yaml, environment."""

from __future__ import annotations

from typing import Any

import yaml

from ingestion_assets.settings import Settings

DAGSTER_DATABASE = "dagster"


def bring_up(settings: Settings) -> dict[str, str]:
    """Start the embedded server, create Dagster's database, write the instance's dagster.yaml.

    Returns the environment under which `dagster` commands use this instance.
    """
    server = settings.embedded.ensure_running()
    server.ensure_database(DAGSTER_DATABASE)
    settings.dagster_home.mkdir(parents=True, exist_ok=True)
    config = instance_config(server.url(DAGSTER_DATABASE, driver="psycopg2"), settings)
    target = settings.dagster_home / "dagster.yaml"
    text = "# written by `ingest up`; the embedded PostgreSQL under INGEST_HOME holds all storage\n"
    text += yaml.safe_dump(config, sort_keys=False)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return instance_env(settings)


def instance_env(settings: Settings) -> dict[str, str]:
    return {
        "INGEST_HOME": str(settings.home),
        "INGEST_CATALOG": str(settings.catalog_path),
        "DAGSTER_HOME": str(settings.dagster_home),
    }


def instance_config(storage_url: str, settings: Settings) -> dict[str, Any]:
    """The same shape as the repository's dagster.yaml, with the embedded server's URL filled in."""
    return {
        "storage": {"postgres": {"postgres_url": storage_url}},
        "local_artifact_storage": {
            "module": "dagster._core.storage.root",
            "class": "LocalArtifactStorage",
            "config": {"base_dir": str(settings.dagster_home / "storage")},
        },
        "concurrency": {
            "runs": {"max_concurrent_runs": 8},
            "pools": {"default_limit": 4, "granularity": "op"},
        },
        # with the daemon: runs that ended without freeing their pool slots (terminated, crashed) free them
        "run_monitoring": {"enabled": True, "poll_interval_seconds": 30, "free_slots_after_run_end_seconds": 10},
        "telemetry": {"enabled": False},
    }
