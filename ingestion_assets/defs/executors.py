"""The executor of every job, from the catalog's `execution`: Dagster's default, the run's own process, or Celery
workers on many hosts.

The run process (orchestrator) and every worker build their Celery app from the same function, so a
worker consumes exactly what the runs publish."""

from __future__ import annotations

from typing import Any

import dagster as dg

from ingestion_assets.catalog import Catalog, CeleryExecution
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings

# dagster-celery's own defaults, restated: its config_source replaces the whole transport options mapping.
_PUBLISH_RETRIES = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
_REDIS = ("redis://", "rediss://")


class ExecutionSettingError(ValueError):
    """`execution` asks for something the broker or destination cannot honour; the message names the key."""

    transient = False


def build_executor(settings: Settings, catalog: Catalog) -> dg.ExecutorDefinition | None:
    """None: Dagster's default (a process per step on the run's machine)."""
    if catalog.execution.executor == "in_process":
        return dg.in_process_executor
    celery = catalog.execution.celery
    if catalog.execution.executor != "celery" or celery is None:
        return None
    from ingestion_assets.defs.celery_steps import ingest_celery_executor

    return ingest_celery_executor(settings, catalog).configured(celery_config(settings, celery), name="celery")


def celery_config(settings: Settings, celery: CeleryExecution) -> dict[str, Any]:
    """The `celery` executor's config: broker and backend resolved from their references (never logged)."""
    broker = resolve(celery.broker, settings, "execution.celery.broker")
    if celery.key_prefix and not broker.startswith(_REDIS):
        raise ExecutionSettingError(
            f"execution.celery.key_prefix ({celery.key_prefix!r}) prefixes Redis keys, and the broker "
            f"({celery.broker.describe()}) is not Redis: with RabbitMQ, isolate deployments by a virtual host of "
            "their own in the broker URL (amqp://user:password@host:5672/VHOST) and remove key_prefix"
        )
    if celery.backend is not None:
        backend = resolve(celery.backend, settings, "execution.celery.backend")
    else:
        backend = broker if broker.startswith(_REDIS) else "rpc://"
    return {"broker": broker, "backend": backend, "config_source": celery_settings(celery)}


def celery_settings(celery: CeleryExecution) -> dict[str, Any]:
    """Why each setting: a step is acknowledged only once it ended (`acks_late`), so the broker hands the step
    of a worker that died (SIGKILL, lost host) to another worker; a worker whose pool process died hands its
    step back at once (`reject_on_worker_lost`); one step per worker slot at a time (`prefetch 1`), so a long
    step never holds a second one back while another worker is idle. Redis knows no consumer: a dead
    worker's step comes back after the visibility timeout, looked for every second. A worker records that it
    started a step (`track_started`): a terminated run gives up only the steps no worker started."""
    transport: dict[str, Any] = {
        **_PUBLISH_RETRIES,
        "visibility_timeout": celery.visibility_timeout_seconds,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    settings: dict[str, Any] = {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
    }
    if celery.key_prefix:
        transport["global_keyprefix"] = celery.key_prefix
        settings["result_backend_transport_options"] = {"global_keyprefix": celery.key_prefix}
    return settings


_LOCAL_BACKENDS = ("sqlite", "duckdb")  # sqlalchemy URLs that name a file on one host's disk


def run_time_host_bound(settings: Settings, catalog: Catalog) -> list[str]:
    """What the catalog cannot say before its references resolve: a sqlalchemy destination URL (a reference)
    that names a local file (sqlite, duckdb), which steps on other workers cannot share."""
    destination = catalog.destination
    if not catalog.execution.distributed or destination.type != "sqlalchemy" or destination.credentials is None:
        return []
    url = resolve(destination.credentials, settings, "destination.credentials")
    backend = url.split(":", 1)[0].split("+", 1)[0].lower()
    if backend not in _LOCAL_BACKENDS:
        return []
    return [
        f"destination.credentials ({destination.credentials.describe()}) is a {backend} URL: a file on one host's "
        "disk, and `execution.executor: celery` runs steps on workers that cannot share it: point it at a server "
        "every worker reaches (mysql://, mariadb://, a warehouse), or use `executor: multiprocess`"
    ]
