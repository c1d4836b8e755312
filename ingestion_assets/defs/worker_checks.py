"""What a Celery worker checks around a step: that its run is still started, that it was submitted under the
worker's own catalog, and that the worker reached Dagster's storage; each failure is one line the run's
orchestrator (when still there) turns into the step's failure.

A worker builds a step's definitions from its own catalog (INGEST_CATALOG), not the submitter's: a worker
started with another file, or whose file changed since, would run the step with other streams, keys, cursors
or destination. Dagster keeps the job a worker process built last and runs the next step with it, even after
the file changed: the worker builds the step's job from its file before the step, and compares the submitter's
fingerprint with that of the definitions built (not of the file), refusing the step, permanently, on a
difference."""

from __future__ import annotations

from typing import Any

import psycopg2
from celery import Task
from dagster_postgres.utils import DagsterPostgresException

from ingestion_assets.defs.identity import catalog_identity
from ingestion_assets.errors import tls_advice_for
from ingestion_assets.settings import Settings

CATALOG_KWARG = "ingest_catalog"  # the step task's extra argument: {"fingerprint", "path", "step"}


class WorkerRefusal(RuntimeError):
    """A step its worker could not start; retrying on the same worker meets the same cause."""

    transient = False


class CatalogMismatch(WorkerRefusal):
    """A worker's catalog differs from the one its step was submitted with."""


class RunNotStarted(WorkerRefusal):
    """The step's run is no longer started (terminated, failed or ended while the step waited in the broker)."""


class StorageUnreachable(WorkerRefusal):
    """The worker could not connect to Dagster's storage (dagster.yaml resolves its URL on each host)."""


def mismatch(step: str, worker: str, submitted: dict[str, str], own: dict[str, str]) -> str | None:
    """Why this worker must not run the step, if the catalogs differ."""
    if submitted["fingerprint"] == own["fingerprint"]:
        return None
    return (
        f"step {step}: Celery worker {worker} reads catalog {own['path']} (fingerprint {own['fingerprint']}), "
        f"but the run was submitted with catalog {submitted['path']} (fingerprint {submitted['fingerprint']}): a "
        "worker would run the step with its own catalog's definitions. Restart the workers with the submitter's "
        "catalog (INGEST_CATALOG, the same file contents), then launch the run again"
    )


class CheckedStepTask(Task):
    """dagster-celery's step task: it refuses a step submitted under another catalog, and says in one line why
    it could not reach Dagster's storage."""

    throws = (WorkerRefusal,)  # an expected refusal: the worker logs its line, not a traceback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        submitted = kwargs.pop(CATALOG_KWARG, None)
        worker = str(self.request.hostname)
        try:
            if problem := run_not_started(kwargs["execute_step_args_packed"], worker):
                raise RunNotStarted(problem)
            if submitted is not None:
                own = executed_identity(kwargs["executable_dict"])
                problem = mismatch(submitted.get("step", "?"), worker, submitted, own)
                if problem:
                    raise CatalogMismatch(problem)
            return super().__call__(*args, **kwargs)
        except DagsterPostgresException as exc:  # the step's own errors end as its failure events, not here
            raise StorageUnreachable(storage_refusal(worker, exc)) from exc


def run_not_started(execute_step_args_packed: dict[str, Any], worker: str) -> str | None:
    """Why the step must not run: its run is no longer STARTED. Celery's revoke of a waiting step reaches only the
    workers up when the run was terminated, so every worker asks Dagster's storage before it runs a step (it has
    recorded the step as started by then: the run gives up only steps no worker started, see celery_steps.py)."""
    import dagster as dg
    from dagster._grpc.types import ExecuteStepArgs
    from dagster._serdes import unpack_value

    args = unpack_value(execute_step_args_packed, as_type=ExecuteStepArgs)
    run = _instance(args.instance_ref).get_run_by_id(args.run_id)
    if run is not None and run.status == dg.DagsterRunStatus.STARTED:
        return None
    state = run.status.value.lower() if run is not None else "gone from Dagster's storage"
    steps = ", ".join(args.step_keys_to_execute or [])
    return (
        f"step {steps} of run {args.run_id}: not executed by Celery worker {worker}: the run is {state} "
        "(it was terminated or ended while the step waited in the broker)"
    )


_INSTANCES: dict[str, Any] = {}  # per worker process: opening Dagster's storage costs ~0.1 s, a read ~2 ms


def _instance(ref: Any) -> Any:
    import dagster as dg
    from dagster._serdes import serialize_value

    key = serialize_value(ref)
    if key not in _INSTANCES:
        _INSTANCES[key] = dg.DagsterInstance.from_ref(ref)
    return _INSTANCES[key]


def executed_identity(executable_dict: dict[str, Any]) -> dict[str, str]:
    """The catalog identity of the definitions the step will execute: its job is built here, from the file as it
    is now (Dagster's cache of the process's last job dropped), and the step then reuses that job."""
    from dagster._core.definitions.reconstruct import ReconstructableJob

    from ingestion_assets.definitions import built_identity

    ReconstructableJob.get_definition.cache_clear()
    ReconstructableJob.get_repository_definition.cache_clear()
    ReconstructableJob.from_dict(executable_dict).get_definition()
    return built_identity() or catalog_identity(Settings.from_env())


def storage_refusal(worker: str, exc: BaseException) -> str:
    """`Celery worker X: cannot connect to Dagster's storage: <libpq's first line>; <what to fix>`."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, psycopg2.Error):
        cause = getattr(cause, "orig", None) or cause.__cause__
    text = str(cause if cause is not None else exc).strip().splitlines()[0]
    where = "storage.postgres.postgres_url in this worker's dagster.yaml (DAGSTER_HOME, its references resolved here)"
    advice = tls_advice_for(text, f"sslrootcert in {where}", f"sslcert and sslkey in {where}", where)
    advice = advice or f"check that this host reaches the storage server that {where} names"
    return f"Celery worker {worker}: cannot connect to Dagster's storage: {text}; {advice}"
