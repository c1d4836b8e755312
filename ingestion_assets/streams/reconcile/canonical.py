"""The canonical text of a key or version value, identical in PostgreSQL and DuckDB, and the hash over it.

Source and target compare rows by a checksum computed on each side in its own SQL, so each type gets a
text both dialects print the same way: integers and exact decimals as their digits, timestamps as epoch
microseconds, dates as epoch days, text as itself (char(n) with its padding, as COPY sent it), bytes as
hex. Floats have no such text (PostgreSQL and DuckDB print them differently), so a float key or cursor
is refused with a reason rather than compared wrongly.

A key is compared by the identity its target gives it. A `numeric` without limits lands as PostgreSQL's text
in DuckDB, MariaDB and lakes, where `1.0` and `1.00` are two keys (a change of scale is a changed key), and as
`numeric` in a PostgreSQL destination, where they are one: there such a key's text is its value's, trailing
zeros of the fraction dropped, on both sides. A row's version keeps its exact text: a cursor updated from 1.0
to 1.00 is a change of the value the target stores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from ingestion_assets.sources.postgres.introspect import Column

Dialect = Literal["postgres", "duckdb", "mysql"]
NULL_MARK = "'\\N'"  # what a NULL part of a row's text reads as (COPY's own marker)
HASH_HEX_DIGITS = 15  # 60 bits of the md5: a non-negative bigint on both sides


class NotComparable(ValueError):
    """A key or cursor column whose values have no text both dialects print alike."""


@dataclass(frozen=True)
class Kind:
    """How one column's values are written as canonical text, and cast to on the target."""

    name: str  # int | timestamp | timestamptz | date | decimal | bool | text | bpchar | binary | number
    precision: int = 0
    scale: int = 0

    def text(self, dialect: Dialect, expr: str) -> str:
        """SQL for the value's canonical text (NULL stays NULL)."""
        if dialect == "mysql":
            return _mysql_text(self.name, expr)
        if self.name in ("timestamp", "timestamptz"):
            if dialect == "duckdb":
                return f"CAST(epoch_us({expr}) AS VARCHAR)"
            micros = f"(extract(epoch FROM {expr}) * 1000000)::bigint::text"
            return f"(CASE WHEN isfinite({expr}) THEN {micros} ELSE ({expr})::text END)"
        if self.name == "date":
            if dialect == "duckdb":
                return f"CAST(({expr} - DATE '1970-01-01') AS VARCHAR)"
            return f"(CASE WHEN isfinite({expr}) THEN ({expr} - DATE '1970-01-01')::text ELSE ({expr})::text END)"
        if self.name == "binary":
            return f"lower(hex({expr}))" if dialect == "duckdb" else f"encode({expr}, 'hex')"
        if self.name == "number":
            return _number_text(f"CAST({expr} AS VARCHAR)" if dialect == "duckdb" else f"({expr})::text")
        if self.name == "bpchar" and dialect == "postgres":
            # `::text` trims char(n)'s padding; COPY (and so the target) keeps it: concat() prints it as COPY does
            return f"(CASE WHEN {expr} IS NULL THEN NULL ELSE concat({expr}) END)"
        return f"CAST({expr} AS VARCHAR)" if dialect == "duckdb" else f"({expr})::text"

    def identity(self, dialect: Dialect, expr: str) -> str:
        """SQL for a key as the comparison joins and looks it up: the value itself, or for a number its text,
        so 1.0 and 1.00 (one key to PostgreSQL) meet in the diff."""
        return self.text(dialect, expr) if self.name == "number" else expr

    @property
    def target_type(self) -> str:
        """The type a literal is cast to on the target (a name DuckDB and PostgreSQL both know)."""
        names = {
            "int": "BIGINT",
            "timestamp": "TIMESTAMP",
            "timestamptz": "TIMESTAMPTZ",
            "date": "DATE",
            "bool": "BOOLEAN",
            "number": "NUMERIC",
        }
        if self.name == "decimal":
            return f"DECIMAL({self.precision},{self.scale})"
        return names.get(self.name, "TEXT")


def kind_of(column: Column) -> Kind:
    """The kind follows the Arrow type the value travels as, which is what the target stores."""
    arrow = column.arrow_type
    if pa.types.is_integer(arrow):
        return Kind("int")
    if pa.types.is_timestamp(arrow):
        return Kind("timestamptz" if arrow.tz else "timestamp")
    if pa.types.is_date(arrow):
        return Kind("date")
    if pa.types.is_decimal(arrow):
        return Kind("decimal", arrow.precision, arrow.scale)
    if pa.types.is_boolean(arrow):
        return Kind("bool")
    if pa.types.is_binary(arrow):
        return Kind("binary")
    if pa.types.is_string(arrow):
        return Kind("bpchar" if column.type_name == "bpchar" else "text")
    raise NotComparable(
        f"column {column.name!r} ({column.sql_type}) has no text PostgreSQL and DuckDB print alike: "
        "a key or cursor of this type cannot be reconciled by checksum"
    )


def key_kind(column: Column, target: Dialect) -> Kind:
    """A key column's kind on a comparison with `target`: a `numeric` without limits the target holds as
    `numeric` (a PostgreSQL destination, unless the table predates native types) is keyed by its value."""
    if column.is_numeric_text and target == "postgres" and column.postgres_type:
        return Kind("number")
    return kind_of(column)


def number_text(text: str) -> str:
    """_number_text in Python: a numeric's text as a `number` key compares it (the dead-letter table keeps the
    source's spelling)."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def _number_text(text: str) -> str:
    """A numeric's text without the fraction's trailing zeros (`1.50` -> `1.5`, `2.00` -> `2`): PostgreSQL's
    `trim_scale` (13+), spelled so any version and DuckDB print it alike; NaN and ±Infinity stay themselves."""
    return f"(CASE WHEN strpos({text}, '.') > 0 THEN rtrim(rtrim({text}, '0'), '.') ELSE {text} END)"


@dataclass(frozen=True)
class Expr:
    """A column of one side as SQL: its quoted expression, kind, nullability and the type literals take."""

    sql: str
    kind: Kind
    nullable: bool
    cast: str  # the type a literal compared with it is cast to on its side


def _mysql_text(kind: str, expr: str) -> str:
    """MariaDB/MySQL: DATETIME(6) holds UTC (loading/sql_targets.py), DATE, DECIMAL and integers print as elsewhere."""
    if kind in ("timestamp", "timestamptz"):
        return f"CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {expr}) AS CHAR)"
    if kind == "date":
        return f"CAST(DATEDIFF({expr}, '1970-01-01') AS CHAR)"
    if kind == "binary":
        return f"LOWER(HEX({expr}))"
    if kind == "bool":
        return f"(CASE WHEN {expr} IS NULL THEN NULL WHEN {expr} THEN 'true' ELSE 'false' END)"
    return f"CAST({expr} AS CHAR)"


def mysql_cast(kind: Kind) -> str:
    """The type a literal is cast to on MariaDB/MySQL (its CAST knows no BIGINT, TEXT or TIMESTAMPTZ)."""
    if kind.name == "decimal":
        return kind.target_type
    return {"int": "SIGNED", "timestamp": "DATETIME(6)", "timestamptz": "DATETIME(6)", "date": "DATE"}.get(
        kind.name, "CHAR"
    )


def mysql_datetime(text: str) -> str:
    """A timestamp's text as UTC without an offset: MySQL's CAST to DATETIME drops an offset rather than apply it."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return text  # infinity and the like: left to MySQL, which refuses them
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ")


def row_text(dialect: Dialect, keys: Sequence[Expr], versions: Sequence[Expr]) -> str:
    """key parts joined by chr(31), then chr(30), then the version parts: one text per row."""
    if dialect == "mysql":  # `||` is OR there, and a backslash in a literal escapes
        mark, unit, record = "CONCAT(CHAR(92 USING utf8mb4), 'N')", "CHAR(31 USING utf8mb4)", "CHAR(30 USING utf8mb4)"
        key_parts = [f"COALESCE({e.kind.text(dialect, e.sql)}, {mark})" for e in keys] or ["''"]
        version_parts = [f"COALESCE({e.kind.text(dialect, e.sql)}, {mark})" for e in versions] or ["''"]
        joined = [f"CONCAT_WS({unit}, {', '.join(parts)})" for parts in (key_parts, version_parts)]
        return f"CONCAT_WS({record}, {', '.join(joined)})"

    def parts(exprs: Sequence[Expr]) -> str:
        texts = [f"COALESCE({e.kind.text(dialect, e.sql)}, {NULL_MARK})" for e in exprs]
        return " || chr(31) || ".join(texts) if texts else "''"

    return f"{parts(keys)} || chr(30) || {parts(versions)}"


def row_hash(dialect: Dialect, keys: Sequence[Expr], versions: Sequence[Expr]) -> str:
    """60 bits of md5(row text) as a non-negative bigint: the same number on both sides."""
    digits = f"substr(md5({row_text(dialect, keys, versions)}), 1, {HASH_HEX_DIGITS})"
    if dialect == "mysql":
        return f"CAST(CONV({digits}, 16, 10) AS SIGNED)"
    if dialect == "duckdb":
        return f"CAST('0x' || {digits} AS BIGINT)"
    return f"('x' || {digits})::bit({HASH_HEX_DIGITS * 4})::bigint"
