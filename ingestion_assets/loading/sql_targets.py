"""MariaDB/MySQL through dlt's `sqlalchemy` destination: exact types, byte-exact keys, a lock per table.

MariaDB differs from the targets the loader was first written for in ways that would lose rows quietly if
left alone: its default collation compares `'a'` and `'A '` equal (dlt's delete-insert merge would then
delete another key's row), TEXT holds 64 KiB, and DATETIME spans years 1000-9999 without a time zone.
Each is either fixed here (binary no-pad collation, LONGTEXT/LONGBLOB) or parked with a reason
(loading/sql_fidelity.py)."""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Iterator
from typing import Any, Literal

import dlt
import pyarrow as pa
import sqlalchemy as sa
from dlt.destinations.impl.sqlalchemy.type_mapper import SqlalchemyTypeMapper
from sqlalchemy.dialects import mysql

from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.relations import table_exists

STAGING_SUFFIX = "_staging"  # dlt's staging dataset beside each dataset (a database of its own in MySQL)
COLLATION = "utf8mb4_nopad_bin"  # byte-exact, trailing spaces significant: keys compare as the source's do
MYSQL_IDENTIFIER_LENGTH = 64
LOCK_SECONDS = 300
KEYS_PER_QUERY = 1000  # keys per version-guard query
KEY_INDEX = "ingest_key"
TEXT_PREFIX = 255  # characters of a LONGTEXT/LONGBLOB key column the index holds (4 bytes each: 1020 of 3072)
_UNBOUNDED = {"tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob"}


class JsonText(sa.types.TypeDecorator[Any]):
    """JSON as its exact text: PostgreSQL's JSON arrives as text, which sqlalchemy's JSON type would encode
    a second time (`"{\\"n\\": 1}"`); objects from API records are encoded once."""

    impl = mysql.LONGTEXT
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return value if value is None or isinstance(value, str) else json.dumps(value)


class ExactMysqlTypes(SqlalchemyTypeMapper):
    """Unbounded text and bytes: dlt's TEXT and BLOB would cut (or refuse) values above 64 KiB; timestamps keep
    their microseconds."""

    def db_type_from_text_type(self, column: Any, table: Any = None) -> sa.types.TypeEngine:
        if self.dialect.name in ("mysql", "mariadb") and column.get("precision") is None:
            return mysql.LONGTEXT(collation=COLLATION)
        return super().db_type_from_text_type(column, table)

    def db_type_from_json_type(self, column: Any, table: Any = None) -> sa.types.TypeEngine:
        if self.dialect.name in ("mysql", "mariadb"):
            return JsonText(collation=COLLATION)
        return super().db_type_from_json_type(column, table)

    def db_type_from_binary_type(self, column: Any, table: Any = None) -> sa.types.TypeEngine:
        if self.dialect.name in ("mysql", "mariadb") and column.get("precision") is None:
            return mysql.LONGBLOB()
        return super().db_type_from_binary_type(column, table)

    def db_type_from_timestamp_type(self, column: Any, table: Any = None) -> sa.types.TypeEngine:
        """DATETIME(6): the generic DateTime is MySQL's DATETIME of whole seconds, which cut a file's
        `23:59:59.999999` to `23:59:59` without a word."""
        if self.dialect.name in ("mysql", "mariadb"):
            precision = column.get("precision")
            return mysql.DATETIME(fsp=6 if precision is None else min(int(precision), 6))
        return super().db_type_from_timestamp_type(column, table)


def is_mysql(url: str) -> bool:
    return sa.engine.make_url(url).get_backend_name() in ("mysql", "mariadb")


def sqlalchemy_destination(url: str, naming: str) -> Any:
    return dlt.destinations.sqlalchemy(credentials=url, type_mapper=ExactMysqlTypes, naming_convention=naming)


def prepare_databases(url: str, dataset: str) -> None:
    """Create the dataset's databases (its own and dlt's staging one) with a byte-exact collation before dlt
    creates them with the server's default, which matches keys case- and space-insensitively."""
    if not is_mysql(url):
        return
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            for name in (dataset, dataset + STAGING_SUFFIX):
                quoted = "`" + name.replace("`", "``") + "`"
                create = f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4 COLLATE {COLLATION}"
                conn.execute(sa.text(create))
    finally:
        engine.dispose()


@contextlib.contextmanager
def mysql_lock(url: str, dataset: str, table: str) -> Iterator[None]:
    """A named lock per target table (GET_LOCK), held on its own connection for the load it guards."""
    name = f"ingest:{zlib.crc32(f'{dataset}.{table}'.encode()):08x}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            got = conn.execute(sa.text("SELECT GET_LOCK(:name, :wait)"), {"name": name, "wait": LOCK_SECONDS}).scalar()
            if got != 1:
                raise TimeoutError(f"the writer lock on {dataset}.{table} was held for over {LOCK_SECONDS}s")
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": name})
    finally:
        engine.dispose()


def target_versions(
    client: Any, table: str, key: tuple[str, ...], rows: pa.Table, source: str | None = None
) -> pa.Table | None:
    """The key and `_ingest_position` of the rows the target holds for the slice's keys, typed as the slice's
    (None: no such table). Asked in chunks of keys; compared in DuckDB (lake_sql.keep_newest_in_duckdb), since
    MariaDB's DECIMAL and DATETIME would compare a version text or a timestamp its own way."""
    qualified = client.make_qualified_table_name(table)
    if not table_exists(client, qualified):
        return None
    wanted = (*key, POSITION, *([source] if source else []))
    columns = [client.escape_column_name(name) for name in wanted]
    listed, tuple_of = ", ".join(columns), f"({', '.join(columns[: len(key)])})"
    keys = rows.select(list(key)).to_pylist()
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(keys), KEYS_PER_QUERY):
        chunk = keys[start : start + KEYS_PER_QUERY]
        marks = ", ".join("(" + ", ".join(["%s"] * len(key)) + ")" for _ in chunk)
        values = [row[name] for row in chunk for name in key]
        found += client.execute_sql(f"SELECT {listed} FROM {qualified} WHERE {tuple_of} IN ({marks})", *values) or []
    schema = rows.select(list(wanted)).schema
    return pa.table([pa.array([r[i] for r in found], f.type) for i, f in enumerate(schema)], schema=schema)


class RetypeRefused(RuntimeError):
    """A schema change needs a column type changed where the loader does not alter types."""

    transient = False


def refuse_retype(kind: str, table: str, changes: list[Any]) -> None:
    """DuckDB and PostgreSQL columns are altered in place (loading/migrate.py), MariaDB/MySQL ones widened
    (`mysql_retype`); elsewhere a type change stops the stream with what to do, instead of loading values into a
    column of the old type."""
    if kind in ("duckdb", "postgres") or not changes:
        return
    listed = "; ".join(change.describe() for change in changes)
    raise RetypeRefused(
        f"target {table} ({kind}): the loader does not change these column types there ({listed}). "
        "A refresh (`ingest refresh <source>.<stream>`) reads the stream again into a new table, created in the "
        "new types"
    )


MYSQL_DECIMAL_DIGITS = 65  # DECIMAL(65, s): MariaDB's and MySQL's widest exact number
_MYSQL_TEXT = f"LONGTEXT CHARACTER SET utf8mb4 COLLATE {COLLATION}"  # as ExactMysqlTypes creates text columns
_MYSQL_TYPES = {"string": _MYSQL_TEXT, "large_string": _MYSQL_TEXT, "int64": "BIGINT", "double": "DOUBLE"}


def mysql_type(arrow_type: pa.DataType) -> str | None:
    """The MariaDB/MySQL column type a widened column takes, as a new table would have it; None: none here."""
    if pa.types.is_decimal(arrow_type):
        precision, scale = arrow_type.precision, arrow_type.scale
        return f"DECIMAL({precision},{scale})" if precision <= MYSQL_DECIMAL_DIGITS else None
    if pa.types.is_timestamp(arrow_type):
        return "DATETIME(6)"  # UTC without a zone, microseconds (loading/sql_fidelity.py)
    return _MYSQL_TYPES.get(str(arrow_type))


def mysql_retype(client: Any, table: str, changes: list[tuple[Any, str, pa.DataType]]) -> list[str]:
    """`ALTER TABLE ... MODIFY COLUMN` for each widened column of `table` (qualified), in place: MariaDB converts
    every value exactly (a bigint to DECIMAL(23,0), a number to its text in LONGTEXT). Any other change, or a
    type with no column here, raises RetypeRefused naming what to do, before anything changed. dlt never alters
    a type, and a new column keeps dlt's nullability (MODIFY makes it NULL, as dlt creates it)."""
    mysql = client.dialect_name in ("mysql", "mariadb")
    refused = [c for c, _, arrow in changes if not mysql or c.kind != "widened" or mysql_type(arrow) is None]
    refuse_retype(f"sqlalchemy, {client.dialect_name}", table, refused)
    return [
        f"ALTER TABLE {table} MODIFY COLUMN {client.escape_column_name(change.column)} {mysql_type(arrow)}"
        for change, _, arrow in changes
    ]


def index_keys(client: Any, database: str, table: str, key: tuple[str, ...]) -> bool:
    """An index on the key of the target table and of dlt's staging copy of it (made LIKE the target when dlt has
    not made it yet). dlt creates neither, and its merge deletes `WHERE EXISTS (SELECT 1 FROM staging WHERE key
    = key)` row by row: without an index, target rows times slice rows (a 20k-row merge into 60k rows ran for
    over 11 minutes). False while the target table does not exist yet."""
    if not _columns(client, database, table):
        return False
    staging = database + STAGING_SUFFIX
    if not _columns(client, staging, table):
        client.execute_sql(f"CREATE TABLE IF NOT EXISTS {_name(staging, table)} LIKE {_name(database, table)}")
    for schema in (database, staging):
        found = client.execute_sql(
            "SELECT 1 FROM information_schema.statistics WHERE table_schema = %s AND table_name = %s "
            "AND index_name = %s",
            schema,
            table,
            KEY_INDEX,
        )
        if found:
            continue
        types = _columns(client, schema, table)
        parts = [f"{_quote(c)}({TEXT_PREFIX})" if types.get(c) in _UNBOUNDED else _quote(c) for c in key]
        client.execute_sql(f"CREATE INDEX {_quote(KEY_INDEX)} ON {_name(schema, table)} ({', '.join(parts)})")
    return True


def table_columns(client: Any, schema: str, table: str) -> dict[str, str]:
    """Column name -> data type of `schema`.`table` (empty when it does not exist)."""
    return _columns(client, schema, table)


def column_types(client: Any, schema: str, table: str) -> dict[str, str]:
    """Column name -> full column type of `schema`.`table` (`bigint(20)`, `decimal(23,0)`; empty: no such table)."""
    return _columns(client, schema, table, "column_type")


def _columns(
    client: Any, schema: str, table: str, kind: Literal["data_type", "column_type"] = "data_type"
) -> dict[str, str]:
    rows = client.execute_sql(
        f"SELECT column_name, {kind} FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        schema,
        table,
    )
    return {str(name): str(found).lower() for name, found in rows or []}


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _name(schema: str, table: str) -> str:
    return f"{_quote(schema)}.{_quote(table)}"
