"""Which catalog a step runs with: a Celery worker refuses a step submitted under another catalog than its own.

A worker builds a step's definitions from its own catalog (INGEST_CATALOG), not the submitter's: a worker
started before a catalog change, or with another file, would run the step with other streams, keys, cursors
or destination. The submitter sends its catalog's fingerprint with every step; the worker compares it with
its own before it loads anything and refuses the step, permanently, on a difference."""

from __future__ import annotations

import hashlib
from typing import Any

from celery import Task

from ingestion_assets.catalog import Catalog, load_catalog
from ingestion_assets.settings import Settings

CATALOG_KWARG = "ingest_catalog"  # the step task's extra argument: {"fingerprint", "path", "step"}


class CatalogMismatch(RuntimeError):
    """A worker's catalog differs from the one its step was submitted with; retrying meets the same worker."""

    transient = False


def catalog_identity(settings: Settings, catalog: Catalog | None = None) -> dict[str, str]:
    """The catalog file's path and the fingerprint of what it says (comments and layout aside): what the
    definitions are built from."""
    said = (catalog or load_catalog(settings.catalog_path)).model_dump_json()
    return {"fingerprint": hashlib.sha256(said.encode()).hexdigest()[:16], "path": str(settings.catalog_path)}


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


class CatalogCheckedTask(Task):
    """dagster-celery's step task, refusing a step whose submitter's catalog is not the worker's own."""

    throws = (CatalogMismatch,)  # an expected refusal: the worker logs its line, not a traceback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        submitted = kwargs.pop(CATALOG_KWARG, None)
        if submitted is not None:
            own = catalog_identity(Settings.from_env())
            problem = mismatch(submitted.get("step", "?"), str(self.request.hostname), submitted, own)
            if problem:
                raise CatalogMismatch(problem)
        return super().__call__(*args, **kwargs)
