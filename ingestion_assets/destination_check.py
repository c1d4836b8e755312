"""`ingest check` for the destination and the executor: reach the destination as a load would (the same URL and
TLS rules), but read only; resolve the broker settings a run resolves at its start.

Nothing is created: a PostgreSQL session is read only, a MariaDB/MySQL one runs `SELECT 1`, a DuckDB file is
not opened (a running load may hold its lock): its folder must let us create or write it, and a lake's
bucket is listed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ingestion_assets.catalog import Catalog, Destination
from ingestion_assets.defs.broker_check import broker_problem
from ingestion_assets.defs.executors import ExecutionSettingError, celery_config, run_time_host_bound
from ingestion_assets.errors import DestinationUnavailable
from ingestion_assets.loading.destinations import connect_postgres, describe_destination, destination_url, duckdb_path
from ingestion_assets.references import UnresolvedReference
from ingestion_assets.settings import Settings
from ingestion_assets.sources.tls import TlsError


def check_destination(settings: Settings, catalog: Catalog) -> list[str]:
    """Every problem with the destination (and the executor settings), each naming the catalog key."""
    destination = catalog.destination
    try:
        celery = catalog.execution.celery if catalog.execution.distributed else None
        if celery is not None:
            celery_config(settings, celery)
        if problems := run_time_host_bound(settings, catalog):
            return problems
        if celery is not None and (problem := broker_problem(settings, celery)):  # the settings first
            return [problem.message]
        if destination.type == "duckdb":
            return _writable("destination.path", duckdb_path(settings, destination))
        if destination.type == "postgres":
            return _postgres(settings, destination)
        if destination.type == "sqlalchemy":
            return _sqlalchemy(settings, destination)
        if destination.type == "filesystem":
            return _lake(settings, destination)
    except (UnresolvedReference, TlsError, ExecutionSettingError) as exc:
        return [str(exc)]
    return []  # a `dlt` destination: dlt reads its own configuration when it loads


def _writable(key: str, path: Path) -> list[str]:
    """`path` can be written, or created (the nearest folder that exists lets us)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return [f"{key}: {path} cannot be created: {existing} is a file, not a folder"]
    if not os.access(existing, os.W_OK):
        return [f"{key}: {existing} is not writable by this user (uid {os.geteuid()}): the load could not write {path}"]
    return []


def _postgres(settings: Settings, destination: Destination) -> list[str]:
    import psycopg2

    try:  # verify-full and the catalog's files, as the load
        with (
            contextlib.closing(
                connect_postgres(
                    settings, destination, connect_timeout=10, options="-c default_transaction_read_only=on"
                )
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT 1")
    except DestinationUnavailable as exc:
        return [str(exc)]
    except psycopg2.Error as exc:
        return [
            f"destination.credentials ({describe_destination(settings, destination)}): cannot connect: {_first(exc)}"
        ]
    return []


def _sqlalchemy(settings: Settings, destination: Destination) -> list[str]:
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    url = destination_url(settings, destination)
    where = f"destination.credentials ({describe_destination(settings, destination)})"
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except ArgumentError:  # its message quotes the URL, a secret
        return [f"{where}: is not a SQLAlchemy URL (dialect+driver://user:password@host:port/database)"]
    if parsed.get_backend_name() == "sqlite":
        return _writable(where, Path(parsed.database or ""))  # connecting would create the file
    try:
        timeout = {"connect_timeout": 10} if parsed.get_backend_name() in ("mysql", "mariadb") else {}
        engine = sqlalchemy.create_engine(parsed, connect_args=timeout)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        finally:
            engine.dispose()
    except (SQLAlchemyError, ImportError) as exc:  # ImportError: the dialect's driver is not installed
        return [f"{where}: cannot connect: {_first(getattr(exc, 'orig', None) or exc)}"]
    return []


def _lake(settings: Settings, destination: Destination) -> list[str]:
    from ingestion_assets.loading.destinations import make_destination

    if destination.is_local_path:
        assert destination.bucket_url is not None
        return _writable("destination.bucket_url", Path(destination.bucket_url.removeprefix("file://")))
    from dlt.common.storages.fsspec_filesystem import fsspec_from_config

    factory = make_destination(settings, destination)
    try:
        fs, root = fsspec_from_config(factory.configuration(factory.spec(), accept_partial=True))
        fs.ls(root.split("/", 1)[0])
    except (OSError, ValueError) as exc:  # s3fs, gcsfs and adlfs report a missing bucket or a refusal as these
        return [f"destination.bucket_url ({destination.bucket_url}): cannot list the bucket: {_first(exc)}"]
    return []


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
