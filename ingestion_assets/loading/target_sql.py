"""Our SQL client on a DuckDB or PostgreSQL target: the part of dlt's SQL client our code calls, without dlt.

A run's own statements on its target (binding marker, existence and column checks, reconciliation window, the
COPY path's merge, DuckDB's direct appends) need a connection, quoting and dlt's errors, not dlt: importing dlt
and resolving its configuration cost ~1 s of a run that loads nothing. These clients behave as dlt's
`DuckDbSqlClient` and `Psycopg2SqlClient` (dlt 1.x) do for those calls: the same connection settings (DuckDB: one
shared connection per file, duplicated per client, UTC, `search_path`; PostgreSQL: `search_path` and
`connect_timeout` as startup options, autocommit outside transactions), the same quoting and case folding, and
the same errors: a driver error is translated by dlt's own client class (`DatabaseUndefinedRelation`, terminal
or transient), which imports dlt only then.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import re
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NoReturn

import duckdb
import psycopg2

_ESCAPES = {"'": "''", "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\x00": ""}  # dlt's: NUL is dropped
_ESCAPE = re.compile("|".join(re.escape(k) for k in _ESCAPES), flags=re.DOTALL)


def escape_literal(value: Any, postgres: bool) -> str:
    """dlt's `escape_postgres_literal` / `escape_duckdb_literal`: a value as a SQL literal."""
    if isinstance(value, list | dict):  # dlt's JSON encoding of it (never on a run's own path)
        from dlt.common.data_writers import escape

        return str((escape.escape_postgres_literal if postgres else escape.escape_duckdb_literal)(value))
    if isinstance(value, str):
        return "E'" + _ESCAPE.sub(lambda found: _ESCAPES[found.group(0)], value) + "'"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return f"'{value.isoformat()}'"
    if isinstance(value, bytes):
        return f"'\\x{value.hex()}'" if postgres else f"from_base64('{base64.b64encode(value).decode('ascii')}')"
    if value is None:
        return "NULL"
    return str(value)


def quote_identifier(name: str) -> str:
    """dlt's `escape_postgres_identifier` (DuckDB uses it too)."""
    return '"' + name.replace('"', '""') + '"'


class TargetSqlClient:
    """What both clients share: names, the `with` protocol, the staging dataset, the native connection."""

    dlt_class = ""  # dlt's client class this one stands for: its name in messages, its error translation
    owns_connection = True  # False: `with` reuses the open connection instead of opening and closing one

    def __init__(self, dataset_name: str, staging_dataset_name: str, fold_case: bool) -> None:
        self._conn: Any = None
        self.dataset_name = dataset_name
        self.staging_dataset_name = staging_dataset_name
        self._fold = str.lower if fold_case else str

    def open_connection(self) -> Any:
        raise NotImplementedError

    def close_connection(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> TargetSqlClient:
        if self.owns_connection:
            self.open_connection()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owns_connection:
            self.close_connection()

    def __getattr__(self, name: str) -> Any:  # as dlt's: the rest is the native connection's
        if name.startswith("_") or not self.__dict__.get("_conn"):
            raise AttributeError(name)
        return getattr(self._conn, name)

    @property
    def native_connection(self) -> Any:
        return self._conn

    def escape_column_name(self, name: str, quote: bool = True, casefold: bool = True) -> str:
        name = self._fold(name) if casefold else name
        return quote_identifier(name) if quote else name

    def fully_qualified_dataset_name(self, quote: bool = True, staging: bool = False, casefold: bool = True) -> str:
        dataset = self.staging_dataset_name if staging else self.dataset_name
        return self.escape_column_name(dataset, quote, casefold)

    def make_qualified_table_name(self, table_name: str, quote: bool = True, casefold: bool = True) -> str:
        dataset = self.fully_qualified_dataset_name(quote, casefold=casefold)
        return f"{dataset}.{self.escape_column_name(table_name, quote, casefold)}"

    @contextlib.contextmanager
    def with_alternative_dataset_name(self, dataset_name: str) -> Iterator[TargetSqlClient]:
        current = self.dataset_name
        try:
            self.dataset_name = dataset_name
            yield self
        finally:
            self.dataset_name = current

    def with_staging_dataset(self) -> contextlib.AbstractContextManager[TargetSqlClient]:
        return self.with_alternative_dataset_name(self.staging_dataset_name)

    def has_table(self, table_name: str) -> bool:
        """Whether the dataset holds the table, asked of the catalog: a statement on a missing table would fail
        with dlt's `DatabaseUndefinedRelation`, whose translation imports dlt."""
        raise NotImplementedError

    @property
    def capabilities(self) -> SimpleNamespace:
        """The part of dlt's destination capabilities our SQL uses (reconciliation quotes its bounds)."""
        postgres = self.dlt_class == "Psycopg2SqlClient"
        return SimpleNamespace(
            escape_literal=functools.partial(escape_literal, postgres=postgres),
            escape_identifier=quote_identifier,
            casefold_identifier=self._fold,
        )

    def _is_driver_error(self, error: Exception) -> bool:
        raise NotImplementedError

    def _raise_translated(self, error: Exception) -> NoReturn:
        """dlt's `raise_database_error`: a driver error becomes dlt's (the driver's as its cause)."""
        if not self._is_driver_error(error):
            raise error
        translated = self._dlt_client_class()._make_database_exception(error)
        if translated is error:
            raise error
        raise translated.with_traceback(error.__traceback__) from error

    def _raise_open_failed(self, error: Exception) -> NoReturn:
        """dlt's `raise_open_connection_error`: a missing database as such, anything else a connection error."""
        from dlt.common.destination.exceptions import DestinationUndefinedEntity
        from dlt.destinations.exceptions import DestinationConnectionError

        translated = self._dlt_client_class()._make_database_exception(error)
        if isinstance(translated, DestinationUndefinedEntity):
            if translated is error:
                raise error
            raise translated.with_traceback(error.__traceback__) from error
        raise DestinationConnectionError(self.dlt_class, self.dataset_name, str(error), error)

    def _dlt_client_class(self) -> Any:
        if self.dlt_class == "DuckDbSqlClient":
            from dlt.destinations.impl.duckdb.sql_client import DuckDbSqlClient

            return DuckDbSqlClient
        from dlt.destinations.impl.postgres.sql_client import Psycopg2SqlClient

        return Psycopg2SqlClient


class DuckDbConnections:
    """dlt's `DuckDbConnectionPool` for one database file: one connection per process while any client holds
    one, each client a duplicate of it with its own session settings."""

    def __init__(self, database: str, global_config: dict[str, Any]) -> None:
        self.database = database
        # dlt's DuckDB client adds these to the credentials' global configuration
        self.global_config = {**global_config, "checkpoint_threshold": "1gb", "TimeZone": "UTC"}
        self._lock = threading.RLock()
        self._borrows = 0
        self._conn: duckdb.DuckDBPyConnection | None = None

    def borrow(self, search_path: str) -> duckdb.DuckDBPyConnection:
        with self._lock:
            conn = self._conn if self._conn is not None else duckdb.connect(database=self.database, config={})
            if self._borrows == 0 or conn is not self._conn:
                try:
                    _apply(conn, "GLOBAL", self.global_config)
                    _apply_session(conn, search_path)
                except Exception:
                    conn.close()
                    raise
            self._conn = conn
            borrowed = conn.duplicate()
            self._borrows += 1
            try:
                _apply_session(borrowed, search_path)
            except Exception:
                self.give_back(borrowed)
                raise
            return borrowed

    def give_back(self, borrowed: duckdb.DuckDBPyConnection) -> None:
        borrowed.close()
        with self._lock:
            self._borrows -= 1
            if self._borrows == 0 and self._conn is not None:
                self._conn.close()
                self._conn = None


def _apply_session(conn: duckdb.DuckDBPyConnection, search_path: str) -> None:
    conn.sql("PRAGMA enable_checkpoint_on_shutdown")
    _apply(conn, "SESSION", {"search_path": search_path})


def _apply(conn: duckdb.DuckDBPyConnection, scope: str, config: dict[str, Any]) -> None:
    for key, value in config.items():
        try:
            try:
                conn.execute(f"SET {scope} {key} = ?", (value,))
            except (duckdb.BinderException, duckdb.ParserException, duckdb.InvalidInputException):
                conn.execute(f"SET {scope} {key} = " + (f"'{value}'" if isinstance(value, str) else str(value)))
        except duckdb.CatalogException:
            if key != "search_path":  # a dataset not made yet: dlt allows that too
                raise


class DuckDbClient(TargetSqlClient):
    dlt_class = "DuckDbSqlClient"

    def __init__(self, dataset_name: str, staging_dataset_name: str, connections: DuckDbConnections) -> None:
        super().__init__(dataset_name, staging_dataset_name, fold_case=False)
        self._connections = connections

    def open_connection(self) -> duckdb.DuckDBPyConnection:
        try:
            self._conn = self._connections.borrow(self.fully_qualified_dataset_name())
        except Exception as error:  # noqa: BLE001 - as dlt's: any failure to open is the connection's
            self._raise_open_failed(error)
        return self._conn

    def close_connection(self) -> None:
        if self._conn is not None:
            self._connections.give_back(self._conn)
            self._conn = None

    @contextlib.contextmanager
    def begin_transaction(self) -> Iterator[DuckDbClient]:
        try:
            try:
                self._conn.begin()
                yield self
            except Exception:
                self._rollback_quietly()
                raise
            try:
                self._conn.commit()
            except duckdb.Error as error:
                self._rollback_quietly()
                self._raise_translated(error)
        except duckdb.Error as error:  # dlt translates the body's driver errors too
            self._raise_translated(error)

    def _rollback_quietly(self) -> None:
        """As dlt: a failed rollback is ignored when it is transient (DuckDB may have rolled back already)."""
        try:
            self._conn.rollback()
        except duckdb.Error as error:
            from dlt.destinations.exceptions import DatabaseTransientException  # an error: translated by dlt

            if not isinstance(self._dlt_client_class()._make_database_exception(error), DatabaseTransientException):
                self._raise_translated(error)

    def execute_sql(self, sql: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]] | None:
        assert isinstance(sql, str)
        params = args if args else kwargs if kwargs else None
        if params:
            sql = sql.replace("%s", "?")
        try:
            try:
                cursor = self._conn.execute(sql, params)
                return None if cursor.description is None else cursor.fetchall()
            except duckdb.Error:
                with contextlib.suppress(Exception):
                    self._conn.rollback()
                raise
        except duckdb.Error as error:
            self._raise_translated(error)

    def has_table(self, table_name: str) -> bool:
        found = self.execute_sql(
            "SELECT 1 FROM information_schema.tables WHERE table_catalog = current_database() "
            "AND lower(table_schema) = lower(%s) AND lower(table_name) = lower(%s)",  # DuckDB's names ignore case
            self.dataset_name,
            table_name,
        )
        return bool(found)

    def _is_driver_error(self, error: Exception) -> bool:
        return isinstance(error, duckdb.Error)


class PostgresClient(TargetSqlClient):
    dlt_class = "Psycopg2SqlClient"

    def __init__(self, dataset_name: str, staging_dataset_name: str, dsn: str, fold_case: bool) -> None:
        super().__init__(dataset_name, staging_dataset_name, fold_case)
        self._dsn = dsn

    def open_connection(self) -> Any:
        parsed = psycopg2.extensions.parse_dsn(self._dsn)
        options = parsed.get("options", "")
        self._conn = psycopg2.connect(
            dsn=self._dsn,
            connect_timeout=int(parsed.get("connect_timeout", 15)),  # dlt's default
            options=f"{options} -csearch_path={self.fully_qualified_dataset_name()},public",
        )
        self._reset_connection()
        return self._conn

    def close_connection(self) -> None:
        try:
            if self._conn:
                self._conn.close()
                self._conn = None
        except Exception as error:  # noqa: BLE001 - as dlt's: a failure to close is the connection's
            self._raise_open_failed(error)

    @contextlib.contextmanager
    def begin_transaction(self) -> Iterator[PostgresClient]:
        try:
            self._conn.autocommit = False
            yield self
            self._commit()
        except Exception:
            self._rollback()
            raise

    def _commit(self) -> None:
        try:
            self._conn.commit()
            self._conn.autocommit = True
        except (psycopg2.Error, TypeError) as error:
            self._raise_translated(error)

    def _rollback(self) -> None:
        try:
            self._conn.rollback()
            self._conn.autocommit = True
        except (psycopg2.Error, TypeError) as error:
            self._raise_translated(error)

    def execute_sql(self, sql: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]] | None:
        params = args if args else kwargs if kwargs else None
        try:
            with self._conn.cursor() as cursor:
                try:
                    cursor.execute(sql, params)
                    return None if cursor.description is None else cursor.fetchall()
                except psycopg2.Error:
                    try:
                        self._reset_connection()
                    except psycopg2.Error:
                        self.close_connection()
                        self.open_connection()
                    raise
        except (psycopg2.Error, TypeError) as error:  # psycopg2 raises TypeError on malformed parameters
            self._raise_translated(error)

    def has_table(self, table_name: str) -> bool:
        found = self.execute_sql("SELECT to_regclass(%s) IS NOT NULL", self.make_qualified_table_name(table_name))
        return bool(found and found[0][0])

    def _reset_connection(self) -> None:
        self._conn.reset()
        self._conn.autocommit = True

    def _is_driver_error(self, error: Exception) -> bool:
        return isinstance(error, psycopg2.Error | TypeError)  # psycopg2 raises TypeError on malformed parameters


def undefined_relation() -> type[Exception]:
    """dlt's `DatabaseUndefinedRelation`, for an `except` clause (`except undefined_relation():`): Python evaluates
    the clause only while an error is being handled, so a run that meets none does not import dlt for it."""
    from dlt.destinations.exceptions import DatabaseUndefinedRelation

    return DatabaseUndefinedRelation


def is_postgres_client(client: Any) -> bool:
    """Ours, or dlt's own PostgreSQL client (which can only exist when dlt is imported)."""
    if isinstance(client, PostgresClient):
        return True
    dlt_clients = sys.modules.get("dlt.destinations.impl.postgres.sql_client")
    return dlt_clients is not None and isinstance(client, dlt_clients.Psycopg2SqlClient)


def database_exception() -> type[Exception]:
    """dlt's `DatabaseException` (any translated database error), for an `except` clause as `undefined_relation`."""
    from dlt.destinations.exceptions import DatabaseException

    return DatabaseException
