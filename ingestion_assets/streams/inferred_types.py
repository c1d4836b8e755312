"""The types of columns inferred from their values (file columns, API fields) as the schema policy knows them: from
Arrow types, from what the target holds, which one of two holds both, and how values are cast into the target's
type exactly."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.schema.changes import ColumnType, classify
from ingestion_assets.sources.files.infer import infer
from ingestion_assets.sources.json_numbers import DECIMAL_DIGITS, DOUBLE_DIGITS


def column_type(kind: pa.DataType) -> ColumnType | None:
    """A file column's type as the schema policy knows types; None for a column of nulls only (no type)."""
    if pa.types.is_null(kind):
        return None
    if pa.types.is_boolean(kind):
        return ColumnType("bool", "boolean")
    if pa.types.is_integer(kind):
        return ColumnType("int8", "bigint")
    if pa.types.is_floating(kind):
        return ColumnType("float8", "double precision")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ColumnType("text", "text")
    if pa.types.is_timestamp(kind):
        if kind.tz is not None:
            return ColumnType("timestamptz", "timestamp with time zone")
        return ColumnType("timestamp", "timestamp without time zone")
    if pa.types.is_date(kind):
        return ColumnType("date", "date")
    if pa.types.is_time(kind):
        return ColumnType("time", "time without time zone")
    if pa.types.is_decimal(kind):
        return ColumnType("numeric", f"numeric({kind.precision},{kind.scale})")
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return ColumnType("bytea", "bytea")
    return ColumnType("json", "json")  # structs, lists, maps: dlt stores them as JSON


def arrow_type(column: ColumnType) -> pa.DataType | None:
    """The Arrow type a column of the stored schema loads as (None: leave the values as they are)."""
    if column.type_name == "numeric":
        digits = column.sql_type.split("(")[-1].rstrip(")").split(",")
        return pa.decimal128(int(digits[0]), int(digits[1]))
    return _ARROW.get(column.type_name)


_HELD = {  # a target's name of a column type (DuckDB's, PostgreSQL's format_type) -> the type a file column has
    "bigint": ColumnType("int8", "bigint"),
    "double": ColumnType("float8", "double precision"),
    "double precision": ColumnType("float8", "double precision"),
    "boolean": ColumnType("bool", "boolean"),
    "varchar": ColumnType("text", "text"),
    "text": ColumnType("text", "text"),
    "character varying": ColumnType("text", "text"),
    "date": ColumnType("date", "date"),
    "time": ColumnType("time", "time without time zone"),
    "time without time zone": ColumnType("time", "time without time zone"),
    "timestamp": ColumnType("timestamp", "timestamp without time zone"),
    "timestamp without time zone": ColumnType("timestamp", "timestamp without time zone"),
    "timestamp with time zone": ColumnType("timestamptz", "timestamp with time zone"),
    "blob": ColumnType("bytea", "bytea"),
    "bytea": ColumnType("bytea", "bytea"),
    # MariaDB/MySQL (information_schema's column_type); its DATETIME holds both kinds of timestamp: not judged
    "bigint(20)": ColumnType("int8", "bigint"),
    "tinyint(1)": ColumnType("bool", "boolean"),
    "longtext": ColumnType("text", "text"),
    "time(6)": ColumnType("time", "time without time zone"),
    "longblob": ColumnType("bytea", "bytea"),
}
_DECIMAL = re.compile(r"(?:decimal|numeric)\((\d+),(\d+)\)")


def held_column_type(sql_type: str) -> ColumnType | None:
    """The type of a column as a target holds it (`DECIMAL(3,1)`, `double precision`); None when a file column
    never has that type (JSON, lists) or the target has no such column."""
    spelled = sql_type.strip().lower()
    decimal = _DECIMAL.fullmatch(spelled.replace(" ", ""))
    if decimal is not None:
        return ColumnType("numeric", f"numeric({decimal.group(1)},{decimal.group(2)})")
    return _HELD.get(spelled)


_ARROW = {
    "bool": pa.bool_(),
    "int8": pa.int64(),
    "float8": pa.float64(),
    "text": pa.string(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "bytea": pa.binary(),
}


_EXACT_IN_DOUBLE = 2**53  # every integer up to this magnitude is a double exactly
_TEXT = ColumnType("text", "text")


def fits(values: pa.ChunkedArray, new: ColumnType, old: ColumnType) -> bool:
    """Whether a file's column of type `new` loads into the target's `old` type with every value as it is."""
    if new.type_name == old.type_name != "numeric" or classify(new, old) == "widened":
        return True
    if old.type_name == "float8":  # decimals of up to 15 digits, integers up to 2**53: a double holds them
        return (new.type_name == "numeric" and _digits(new)[0] <= DOUBLE_DIGITS) or _doubles_hold(values)
    decimal = arrow_type(old)
    if decimal is not None and pa.types.is_decimal(decimal) and new.type_name in ("int8", "float8"):
        return cast_exactly(values, decimal) is not None  # whole numbers, or doubles such as 1.25, that it holds
    return False


def _doubles_hold(values: pa.ChunkedArray) -> bool:
    """Integers that a double column holds exactly (a file of whole amounts after one with decimals): they fit
    the target's type, while a bigint column as such does not (past 2**53 a double rounds)."""
    if not pa.types.is_integer(values.type):
        return False
    low, high = pc.min_max(values).values()
    return low.as_py() is None or (low.as_py() >= -_EXACT_IN_DOUBLE and high.as_py() <= _EXACT_IN_DOUBLE)


def wider(old: ColumnType, new: ColumnType, values: pa.ChunkedArray) -> ColumnType:
    """The type a column of `old` values meeting `new` ones (`values`) becomes: integers and decimals the decimal
    holding both (bigint and 2.5: numeric(20,1)); doubles in a decimal column count as the decimals they read
    as (1.125); text past 38 digits or where a double is not a decimal (NaN, 1e300) or a decimal not a double (a
    double column meeting more than 15 digits); otherwise `new`, which the schema policy judges."""
    if old.type_name == "numeric" and new.type_name == "float8":
        decimals = infer(pc.cast(values, pa.string()))
        read = column_type(decimals.type)
        return wider(old, read, decimals) if read is not None and read.type_name in ("numeric", "int8") else _TEXT
    exact = {"int8", "numeric"}
    if {old.type_name, new.type_name} <= exact and "numeric" in (old.type_name, new.type_name):
        (old_p, old_s), (new_p, new_s) = _digits(old), _digits(new)
        scale = max(old_s, new_s)
        precision = max(old_p - old_s, new_p - new_s) + scale
        return ColumnType("numeric", f"numeric({precision},{scale})") if precision <= DECIMAL_DIGITS else _TEXT
    if {old.type_name, new.type_name} == {"float8", "numeric"}:
        return _TEXT
    return new


def _digits(column: ColumnType) -> tuple[int, int]:
    """(precision, scale) of an integer or decimal column (bigint: 19 digits)."""
    kind = arrow_type(column)
    return (kind.precision, kind.scale) if kind is not None and pa.types.is_decimal(kind) else (19, 0)


def cast_exactly(values: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray | None:
    """`values` in `kind`, or None when one of them does not fit. Integers reach a decimal through a decimal that
    holds any of them (Arrow asks that of the type, not of the values); a double through its shortest text, which
    a decimal holds exactly or not at all (Arrow's own cast rounds 1.125 to 1.12 in a decimal of scale 2)."""
    try:
        if pa.types.is_integer(values.type) and pa.types.is_decimal(kind):
            values = pc.cast(values, pa.decimal128(DECIMAL_DIGITS, kind.scale))
        elif pa.types.is_floating(values.type) and pa.types.is_decimal(kind):
            values = pc.cast(values, pa.string())
        return pc.cast(values, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
