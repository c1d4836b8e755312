"""How each PostgreSQL type lands: its Arrow type in a slice, how that is made from COPY's text, and the
destination's own type where dlt has no name for it (REAL, UUID, INTERVAL, LIST, PostgreSQL's types).

Values the destination can hold arrive as values. Where no native type fits, the text is PostgreSQL's own
output (DateStyle ISO, TimeZone UTC, IntervalStyle iso_8601, extra_float_digits 3, bytea hex), which
PostgreSQL reads back to the identical value.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

MAX_DECIMAL_PRECISION = 38  # what Arrow decimal128, DuckDB and most warehouses hold exactly
DUCKDB_TYPE = "x-ingest-duckdb-type"  # dlt column hints read by loading/native_types.py
POSTGRES_TYPE = "x-ingest-postgres-type"

_FIXED: dict[str, pa.DataType] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "oid": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "bytea": pa.binary(),
}
_DUCKDB_OF_ARROW = {
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float": "REAL",
    "double": "DOUBLE",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "date32[day]": "DATE",
    "time64[us]": "TIME",
    "timestamp[us]": "TIMESTAMP",
    "timestamp[us, tz=UTC]": "TIMESTAMP WITH TIME ZONE",
    "binary": "BLOB",
}
_POSTGRES_OF_ARROW = {
    **_DUCKDB_OF_ARROW,
    "double": "DOUBLE PRECISION",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
    "binary": "BYTEA",
}
# Built-in types a PostgreSQL destination holds as themselves (their text is exact and locale-free; money's
# is not, reg* types name objects of the source).
_POSTGRES_NATIVE = frozenset(
    {
        *("numeric", "interval", "uuid", "inet", "cidr", "macaddr", "macaddr8", "bit", "varbit", "timetz", "xml"),
        "json",  # dlt's json is jsonb there, which drops duplicate keys and reorders: json keeps the text
        *("tsvector", "tsquery", "pg_lsn", "point", "line", "lseg", "box", "path", "polygon", "circle"),
        *("int4range", "int8range", "numrange", "daterange", "tsrange", "tstzrange"),
        *("int4multirange", "int8multirange", "nummultirange", "datemultirange", "tsmultirange", "tstzmultirange"),
    }
)
_TEXTUAL = frozenset({"text", "varchar", "bpchar", "name", "char", "json", "jsonb"})
_POSTGRES_ELEMENTS = frozenset(_FIXED) | _POSTGRES_NATIVE | _TEXTUAL


@dataclass(frozen=True)
class PgType:
    """A column's type with domains resolved to what their values are."""

    name: str  # pg_type.typname of the base type, e.g. int4, _text
    typmod: int = -1
    builtin: bool = True  # declared as a pg_catalog type (not a domain): a PostgreSQL destination has it too
    element: PgType | None = None  # for arrays
    delimiter: str = ","
    dims: int = 1  # attndims: the declared dimensions (0 when unknown), never enforced by PostgreSQL
    lowest: str = ""  # the type's lowest value where the catalog knows it: an enum's first label, an empty range


@dataclass(frozen=True)
class Landing:
    arrow_type: pa.DataType
    decode: str = ""  # "": Arrow's CSV reader parses it; binary, interval, array: values.py does
    duckdb_type: str | None = None
    postgres_type: str | None = None
    element: Landing | None = None


def land(pg: PgType, sql_type: str, destination: str) -> Landing:
    if pg.name == "float4":
        return Landing(pa.float32(), duckdb_type="REAL", postgres_type="real")
    if pg.name in _FIXED:
        return Landing(_FIXED[pg.name], decode="binary" if pg.name == "bytea" else "")
    if pg.name == "numeric" and (decimal := _decimal(pg.typmod)) is not None:
        return Landing(decimal)
    if pg.element is not None:
        return _array(pg, sql_type, destination)
    native = sql_type if pg.builtin and pg.name in _POSTGRES_NATIVE else None
    if destination == "postgres":
        return Landing(pa.string(), postgres_type=native)  # interval, uuid, ranges ...: PostgreSQL's own text
    if pg.name == "uuid":
        return Landing(pa.string(), duckdb_type="UUID", postgres_type=native)
    if pg.name == "interval":
        return Landing(pa.string(), decode="interval", duckdb_type="INTERVAL", postgres_type=native)
    return Landing(pa.string(), postgres_type=native)  # text, json, enums, ranges, inet ...: exact text


def sql_type_of(landing: Landing, destination: str, is_json: bool = False) -> str:
    """The destination's SQL type for a landing (for migrations and list elements)."""
    native = landing.duckdb_type if destination == "duckdb" else landing.postgres_type
    return native or sql_type_of_arrow(landing.arrow_type, destination, is_json)


def sql_type_of_arrow(kind: pa.DataType, destination: str, is_json: bool = False) -> str:
    if is_json:
        return "JSON" if destination == "duckdb" else "JSONB"
    if pa.types.is_decimal(kind):
        return f"{'DECIMAL' if destination == 'duckdb' else 'NUMERIC'}({kind.precision},{kind.scale})"
    return (_DUCKDB_OF_ARROW if destination == "duckdb" else _POSTGRES_OF_ARROW)[str(kind)]


def _array(pg: PgType, sql_type: str, destination: str) -> Landing:
    """One-dimensional arrays become LISTs in DuckDB; declared multi-dimensional ones stay exact text, since
    PostgreSQL lets one column mix dimensions and bounds that no fixed nesting of LISTs can hold."""
    assert pg.element is not None
    element = land(pg.element, "", destination)
    if destination == "postgres":
        exists = pg.builtin and pg.element.builtin and pg.element.name in _POSTGRES_ELEMENTS
        return Landing(pa.string(), postgres_type=sql_type if exists else None)
    if pg.dims > 1 or pg.element.delimiter != "," or element.element is not None:
        return Landing(pa.string())
    element_sql = sql_type_of(element, "duckdb", is_json=pg.element.name in ("json", "jsonb"))
    return Landing(pa.list_(element.arrow_type), decode="array", duckdb_type=f"{element_sql}[]", element=element)


def _decimal(typmod: int) -> pa.DataType | None:
    """numeric(p,s) up to 38 digits as an exact decimal; PostgreSQL 15 allows a negative scale or one above the
    precision, which Arrow's (p, s) still holds exactly as (p - s, 0) or (s, s)."""
    if typmod < 4:
        return None
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024
    if scale < 0:
        precision, scale = precision - scale, 0
    precision = max(precision, scale)
    return pa.decimal128(precision, scale) if precision <= MAX_DECIMAL_PRECISION else None
