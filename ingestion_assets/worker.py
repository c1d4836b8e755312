"""A Celery worker that runs the steps of ingestion runs: `python -m ingestion_assets.worker [celery options]`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from celery import Celery

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.broker_check import broker_tls_problem
from ingestion_assets.defs.executors import celery_config
from ingestion_assets.settings import Settings
from ingestion_assets.sources.tls import remove_stale_pem_files

QUEUE = "dagster"  # dagster-celery's queue: the executor publishes every step there unless a step's tag says other


def worker_app(settings: Settings) -> Celery:
    """The same Celery app as the runs' executor (broker, backend, acks), with dagster-celery's step task.

    The worker must read the same catalog (INGEST_CATALOG) as the runs: its steps load the definitions from it,
    and it refuses a step whose submitter's catalog has another fingerprint."""
    from dagster_celery.executor import CeleryExecutor
    from dagster_celery.make_app import make_app

    from ingestion_assets.defs.celery_steps import step_task

    catalog = load_catalog(settings.catalog_path)
    celery = catalog.execution.celery
    if catalog.execution.executor != "celery" or celery is None:
        raise SystemExit(
            f"{settings.catalog_path}: `execution.executor` is {catalog.execution.executor}, so no run publishes "
            "steps for a worker: set `execution: {executor: celery, celery: {broker: {env: ...}}}`"
        )
    if problem := broker_tls_problem(settings, celery):  # Celery would retry it for ever
        raise SystemExit(f"{settings.catalog_path}: {problem}")
    app = make_app(CeleryExecutor.for_cli(**celery_config(settings, celery)).app_args())
    step_task(app)  # refuses a step submitted under another catalog than this worker's
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Extra arguments go to `celery worker` (`--concurrency 2`, `-n name@%h`, `--loglevel INFO`)."""
    settings = Settings.from_env()
    app = worker_app(settings)
    if (settings.home / "tls").is_dir():  # files of the pool processes of a worker killed here before
        remove_stale_pem_files(settings.home / "tls")
    _warm_up()
    app.worker_main(["worker", "--queues", QUEUE, *(sys.argv[1:] if argv is None else argv)])


def _warm_up() -> None:
    """Import what every step imports before the pool processes fork: each step then starts seconds sooner."""
    import dagster_postgres  # noqa: F401  the instance storage every step opens

    import ingestion_assets.definitions  # noqa: F401  the code location each step reconstructs its job from


if __name__ == "__main__":
    main()
