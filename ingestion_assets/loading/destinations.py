"""The dlt destination from the catalog, and the writer lock that serialises loads into one target."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg2

from ingestion_assets.catalog import Destination
from ingestion_assets.errors import DestinationUnavailable
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.tls_probe import explain_verify_failure

log = logging.getLogger(__name__)


DUCKDB_BUSY_SECONDS = 300.0
POSTGRES_MAX_COLUMNS = 1600  # MaxHeapAttributeNumber: CREATE/ALTER TABLE refuses more (54011)
POSTGRES_IDENTIFIER_LENGTH = 63  # NAMEDATALEN - 1: dlt shortens longer names with a hash suffix


def duckdb_path(settings: Settings, destination: Destination) -> Path:
    return Path(destination.path).expanduser() if destination.path else settings.warehouse_path


def destination_url(settings: Settings, destination: Destination) -> str:
    assert destination.credentials is not None
    return postgres_url(destination.credentials, destination.tls, settings, "destination.credentials")


def connect_postgres(settings: Settings, destination: Destination, **options: Any) -> Any:
    """A psycopg2 connection to the PostgreSQL destination; a refused or failed connection (a certificate that
    does not verify, a wrong host) as DestinationUnavailable naming the destination and the setting to fix."""
    url = destination_url(settings, destination)
    try:
        return psycopg2.connect(url, **options)
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
        if exc.pgcode is not None:
            raise
        password = psycopg2.extensions.parse_dsn(url).get("password")
        reference = describe_destination(settings, destination)
        explained = explain_verify_failure(exc, url)  # libpq does not say why a certificate failed; we ask
        if explained is not None:
            raise DestinationUnavailable(
                "destination.credentials", reference, explained, password, explained.advice
            ) from exc
        raise DestinationUnavailable("destination.credentials", reference, exc, password) from exc


def make_destination(settings: Settings, destination: Destination) -> Any:
    """dlt's destination (imports dlt: only a dlt load, dlt's schema or a dlt-only destination needs it)."""
    import dlt

    if destination.type == "duckdb":
        from dlt.destinations.impl.duckdb.configuration import DuckDbCredentials

        from ingestion_assets.loading.type_mappers import DuckDbNativeTypes

        path = duckdb_path(settings, destination)
        path.parent.mkdir(parents=True, exist_ok=True)
        # DuckDB caches up to 80% of RAM by default: a loader's memory would then grow with the table.
        duckdb_credentials = DuckDbCredentials(str(path), global_config={"memory_limit": destination.memory_limit})
        return dlt.destinations.duckdb(
            duckdb_credentials, type_mapper=DuckDbNativeTypes, naming_convention=destination.naming
        )
    if destination.type == "sqlalchemy":
        from ingestion_assets.loading.sql_targets import sqlalchemy_destination

        return sqlalchemy_destination(destination_url(settings, destination), destination.naming)
    if destination.type == "filesystem":
        from ingestion_assets.loading.lake import lake_destination  # the lake's packages load only when used

        return lake_destination(destination, dlt_credentials(settings, destination))
    if destination.type == "dlt":
        assert destination.name is not None
        extra: dict[str, Any] = dict(destination.options)
        if (referenced := dlt_credentials(settings, destination)) is not None:
            extra["credentials"] = referenced
        return dlt.destination(destination.name, naming_convention=destination.naming, **extra)
    from dlt.destinations.impl.postgres.configuration import PostgresCredentials

    from ingestion_assets.loading.postgres_copy import ExactPostgres
    from ingestion_assets.loading.type_mappers import PostgresNativeTypes

    credentials = PostgresCredentials(destination_url(settings, destination))
    credentials.password = credentials.password or ""  # trust or peer auth: dlt insists on a password field
    return ExactPostgres(credentials=credentials, type_mapper=PostgresNativeTypes, naming_convention=destination.naming)


def dlt_credentials(settings: Settings, destination: Destination) -> str | dict[str, Any] | None:
    """The referenced credentials as dlt takes them: a connection URL, or a JSON object's fields. Without a
    reference dlt reads its own configuration (environment, secrets.toml): also never a catalog literal."""
    if destination.credentials is None:
        return None
    value = destination_url(settings, destination)
    if not value.lstrip().startswith("{"):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:  # the message must not echo the secret
        raise ValueError(
            f"destination.credentials ({destination.credentials.describe()}) is not a JSON object: line {exc.lineno}"
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(f"destination.credentials ({destination.credentials.describe()}) is not a JSON object")
    return parsed


def describe_destination(settings: Settings, destination: Destination) -> str:
    """The destination, for messages and checkpoints (never a secret)."""
    if destination.type == "duckdb":
        return f"duckdb:{duckdb_path(settings, destination)}"
    if destination.type == "filesystem":
        return f"{destination.table_format}:{destination.bucket_url}"
    if destination.type == "dlt":
        return f"dlt:{destination.name}"
    assert destination.credentials is not None
    return f"{destination.type}:{destination.credentials.describe()}"


_LABELS = {"duckdb": "DuckDB", "postgres": "PostgreSQL", "sqlalchemy": "MariaDB/MySQL (sqlalchemy)"}


def destination_label(destination: Destination) -> str:
    """The destination's kind as a user names it, for reasons and messages (never a secret)."""
    if destination.type == "filesystem":
        return f"{destination.table_format} files"
    if destination.type == "dlt":
        return f"dlt's {destination.name}"
    return _LABELS.get(destination.type, destination.type)


def target_names(destination: Destination) -> TargetNames:
    """How source column names land in this destination (see loading/naming.py)."""
    if destination.type == "postgres":
        return TargetNames(
            destination.naming, POSTGRES_IDENTIFIER_LENGTH, True, POSTGRES_MAX_COLUMNS, "a PostgreSQL destination"
        )
    if destination.type == "sqlalchemy":  # MySQL column names are case-insensitive, 64 characters at most
        from ingestion_assets.loading.sql_targets import MYSQL_IDENTIFIER_LENGTH

        return TargetNames(destination.naming, MYSQL_IDENTIFIER_LENGTH, case_sensitive=False)
    return TargetNames(destination.naming, None, case_sensitive=False)


@contextlib.contextmanager
def writer_lock(settings: Settings, destination: Destination, dataset: str, table: str) -> Iterator[None]:
    """One writer at a time per target: the version check and the load it guards are then atomic.

    DuckDB admits one writing process per file: a file lock. PostgreSQL: an advisory lock per table,
    so different tables still load in parallel; MySQL: a named lock per table. Lakes and passed-through
    destinations: a file lock per table on this machine (writers on other machines are not held off: run
    one code location per lake table). Reading from sources never waits on this lock.
    """
    started = time.monotonic()
    if destination.type == "sqlalchemy":
        from ingestion_assets.loading.sql_targets import is_mysql, mysql_lock  # dlt's sqlalchemy destination

        if is_mysql(url := destination_url(settings, destination)):
            with mysql_lock(url, dataset, table):
                _note_wait(started, f"{dataset}.{table}")
                yield
            return
    if destination.type != "postgres" and destination.type != "duckdb":
        with _file_lock(settings.home / "locks" / _lock_name(settings, destination, dataset, table)):
            _note_wait(started, f"{dataset}.{table}")
            yield
        return
    if destination.type == "duckdb":
        path = duckdb_path(settings, destination)
        path.parent.mkdir(parents=True, exist_ok=True)
        with Path(f"{path}.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            # The probe's connection stays open while the lock is held: the connections opened under it (dlt's,
            # ours) then share DuckDB's open database instead of opening the file again (~20 ms CPU each).
            probe = _wait_until_writable(path)
            _note_wait(started, str(path))
            try:
                yield
            finally:
                probe.close()
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    key = writer_lock_key(dataset, table)
    with contextlib.closing(connect_postgres(settings, destination)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
            _note_wait(started, f"{dataset}.{table}")
            try:
                yield
            finally:
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))


def writer_lock_key(dataset: str, table: str) -> int:
    """The PostgreSQL advisory lock key of one target table (a slice's transaction may hold it instead)."""
    return zlib.crc32(f"ingest:{dataset}.{table}".encode())


def _wait_until_writable(path: Path, patience: float = DUCKDB_BUSY_SECONDS) -> duckdb.DuckDBPyConnection:
    """Another process holding the DuckDB file (a notebook, a BI tool: even a read-only connection) keeps
    writers out; wait for it rather than fail the slice, and say who holds it if it does not let go.
    Returns the connection that got in (opened with DuckDB's defaults, as dlt's and ours are)."""
    deadline, pause = time.monotonic() + patience, 0.05
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            if time.monotonic() > deadline:
                holder = str(exc).split("Conflicting lock is held in", 1)[-1].split(".")[0].strip()
                raise TimeoutError(
                    f"the warehouse {path} has been held by another process ({holder}) for over {patience:.0f}s; "
                    "close that connection (a read-only one also keeps loads out)"
                ) from exc
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def _note_wait(started: float, what: str) -> None:
    waited = time.monotonic() - started
    if waited > 1:
        log.info("waited %.1fs for the writer lock on %s", waited, what)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_name(settings: Settings, destination: Destination, dataset: str, table: str) -> str:
    where = describe_destination(settings, destination)
    return hashlib.sha256(f"{where}|{dataset}.{table}".encode()).hexdigest()[:24] + ".lock"
