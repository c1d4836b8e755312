"""Dagster's storage as a deployment's dagster.yaml names it: PostgreSQL at the URL an environment variable holds.

Dagster's own `postgres_url: {env: ...}` fails with "the environment variable ... is not set" and nothing more:
what a `dagster` command run without `eval "$(ingest env)"` shows first. This one says how to set it."""

from __future__ import annotations

import os
from typing import Any

from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage

URL_ENV = "url_env"  # the config key: the name of the environment variable holding the storage URL


class StorageUrlMissing(RuntimeError):
    """The variable the dagster.yaml names is not set in this environment."""


class PostgresStorageFromEnv(DagsterPostgresStorage):
    """DagsterPostgresStorage whose URL comes from the environment variable `url_env` names."""

    @classmethod
    def config_type(cls) -> Any:
        return {URL_ENV: str}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> PostgresStorageFromEnv:
        name = str(config_value[URL_ENV])
        url = os.environ.get(name)
        if not url:
            raise StorageUrlMissing(missing_url(name))
        return cls(postgres_url=url, inst_data=inst_data)


def missing_url(name: str) -> str:
    return (
        f"{name} is not set: the dagster.yaml Dagster reads here (DAGSTER_HOME's, or without it the current "
        f"folder's) keeps its storage in the PostgreSQL it names. For the embedded stack run `eval \"$(.venv/bin/"
        f"ingest env)\"` first: it points DAGSTER_HOME at INGEST_HOME/dagster, whose dagster.yaml names the "
        f"embedded server (`ingest up` starts it). For a deployment, export {name}=postgresql+psycopg2://USER:"
        f"PASSWORD@HOST:5432/dagster (docker-compose.yml sets it)"
    )
