"""Where a run's steps execute: in processes on the run's own machine, or on Celery workers on many hosts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from ingestion_assets.catalog.base import Reference, _Model


class CeleryExecution(_Model):
    """Dagster's Celery executor (dagster-celery): each step is a task on a broker, run by any worker."""

    broker: Reference = Field(description="redis://host:6379/0, rediss://... or amqp://user:password@host:5672//")
    backend: Reference | None = Field(None, description="result backend; default: the broker (Redis) or rpc://")
    key_prefix: str = Field(
        "",
        description="Redis: a prefix for every key, broker and results (a shared Redis); refused with another "
        "broker (RabbitMQ: give the deployment a virtual host of its own in the broker URL)",
    )
    visibility_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        3600.0,
        description="Redis: a step whose worker died is handed to another worker after this; it must be longer "
        "than the longest step, or a step still running is handed out a second time",
    )


class Execution(_Model):
    executor: Literal["multiprocess", "in_process", "celery"] = Field(
        "multiprocess",
        description="multiprocess: a process per step on the run's machine; in_process: every step in the run's "
        "own process (a second or two less per run; a step killed takes the run with it, retried by the next run "
        "from its checkpoint, not within the run); celery: on workers",
    )
    celery: CeleryExecution | None = None

    @model_validator(mode="after")
    def _celery_settings(self) -> Execution:
        if self.executor == "celery" and self.celery is None:
            raise ValueError("execution.celery: required with `executor: celery` (at least `broker`, a reference)")
        return self

    @property
    def distributed(self) -> bool:
        return self.executor == "celery"


_REMOTE = re.compile(r"^(?!file://)[a-z][a-z0-9+.-]*://")  # fsspec URLs other than file://


def host_bound(catalog: Any) -> list[str]:
    """What a deployment whose steps run on several hosts cannot use, each with what to do instead.

    A DuckDB file admits one writing process and lives on one host's disk; the embedded server and the demo
    API listen on one host's loopback. A step on another worker would load into a file of its own, or fail."""
    problems = []
    if catalog.destination.type == "duckdb":
        problems.append(
            "destination.type: duckdb is a local file (one host's disk, one writer at a time through its file lock) "
            "and `execution.executor: celery` runs steps on workers that cannot share it: load into a warehouse "
            "every worker reaches (`type: postgres` with `credentials`), or use `executor: multiprocess`"
        )
    if catalog.destination.type == "filesystem" and catalog.destination.is_local_path:
        problems.append(
            f"destination.bucket_url: {catalog.destination.bucket_url} is a folder on one host's disk (its writer "
            "lock is per host) and `execution.executor: celery` runs steps on other workers: use an object store "
            "URL (s3://, gs://, az://) every worker reaches, or `executor: multiprocess`"
        )
    for name, source in catalog.sources.items():
        url = getattr(source, "url", None)  # a files source
        if getattr(source, "type", None) == "files" and isinstance(url, str) and not _REMOTE.match(url):
            problems.append(
                f"sources.{name}.url: {url} is a folder on one host's disk, which Celery workers on other hosts "
                "do not see: use an object store URL (s3://, gs://, az://) or `executor: multiprocess`"
            )
    for where, ref in _references(catalog, ()):
        if ref.embedded or ref.service:
            problems.append(
                f"{where}: {ref.describe()} is a server on one host's loopback, which Celery workers on other hosts "
                "do not reach: give an `env` or `file` reference to a URL every worker reaches"
            )
    return problems


def _references(model: BaseModel, path: tuple[str, ...]) -> Iterator[tuple[str, Reference]]:
    """Every reference in the catalog with its key path."""
    for name in type(model).model_fields:
        yield from _references_in(getattr(model, name), (*path, name))


def _references_in(value: object, path: tuple[str, ...]) -> Iterator[tuple[str, Reference]]:
    if isinstance(value, Reference):
        yield ".".join(path), value
    elif isinstance(value, BaseModel):
        yield from _references(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _references_in(item, (*path, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _references_in(item, (*path, str(index)))
