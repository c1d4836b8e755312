"""Read a table's columns from the PostgreSQL catalog and map each to the Arrow type that keeps its meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
from psycopg2.extensions import connection as PgConnection

from ingestion_assets.sources.postgres.landing import DUCKDB_TYPE, POSTGRES_TYPE, PgType, land

JSON_TYPES = frozenset({"json", "jsonb"})

# The lowest value of a type: a NULL cursor sorts and compares as this, so NULL rows are neither skipped
# nor stuck (a row comparison with NULL is never true).
_LOWEST: dict[str, str] = {
    "timestamptz": "-infinity",
    "timestamp": "-infinity",
    "date": "-infinity",
    "int2": "-32768",
    "int4": "-2147483648",
    "int8": "-9223372036854775808",
    "numeric": "-Infinity",
    "float4": "-Infinity",
    "float8": "-Infinity",
    # types with no '' value: each type's own lowest (a NULL in an ordering column orders as it)
    "bool": "false",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "inet": "0.0.0.0/0",
    "cidr": "0.0.0.0/0",
    "macaddr": "00:00:00:00:00:00",
    "macaddr8": "00:00:00:00:00:00:00:00",
    "time": "00:00:00",
    "timetz": "00:00:00+15:59",
    "interval": "-178000000 years",
    "money": "-92233720368547758.08",
    "oid": "0",
    "jsonb": "null",  # jsonb orders null below strings, numbers, booleans, arrays and objects
}


class TableNotReadable(LookupError):
    """The table or a named column is missing; the message names the stream and what to fix."""

    transient = False


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str  # pg_type.typname as declared (a domain's own name), e.g. int8, _text: what schema diffs compare
    sql_type: str  # format_type(): what a literal is cast to, e.g. numeric(38,9)
    nullable: bool
    arrow_type: pa.DataType  # the column's type in a slice
    base_type: str = ""  # typname with domains resolved, when it differs from type_name
    decode: str = ""  # how a slice value is made from COPY's text: "" Arrow's CSV reader; else values.py
    duckdb_type: str | None = None  # the destination's own type where dlt has none (REAL, UUID, INTEGER[] ...)
    postgres_type: str | None = None
    element: Column | None = None  # an array's elements, for decoding
    lowest: str = ""  # the lowest value of a type the catalog tells (enum, range), else _LOWEST's by kind

    @property
    def kind(self) -> str:
        """What the values are: the type name with domains resolved."""
        return self.base_type or self.type_name

    @property
    def is_json(self) -> bool:
        return self.kind in JSON_TYPES

    @property
    def is_numeric_text(self) -> bool:
        """A `numeric` without limits (or past 38 digits): it travels as PostgreSQL's text, ordered by its value
        (loading/number_order.py)."""
        return self.kind == "numeric" and pa.types.is_string(self.arrow_type)

    @property
    def wire_type(self) -> pa.DataType:
        """What Arrow's CSV reader parses COPY's text into."""
        return pa.string() if self.decode else self.arrow_type

    def dlt_hint(self) -> dict[str, object] | None:
        """What dlt cannot infer from the Arrow type: JSON stays JSON, a local timestamp stays local, and the
        destination's own type for what dlt has no name for."""
        hint: dict[str, object] = {}
        if self.is_json:
            hint = {"data_type": "json"}
        elif self.kind == "timestamp":
            hint = {"data_type": "timestamp", "timezone": False, "precision": 6}
        elif pa.types.is_timestamp(self.arrow_type):  # named, since a PostgreSQL destination may get text
            hint = {"data_type": "timestamp", "timezone": True, "precision": 6}  # (infinity, BC: for_postgres)
        elif pa.types.is_date32(self.arrow_type):
            hint = {"data_type": "date"}
        elif pa.types.is_time64(self.arrow_type):
            hint = {"data_type": "time", "precision": 6}
        elif pa.types.is_binary(self.arrow_type):
            hint = {"data_type": "binary"}  # a PostgreSQL destination gets bytea's hex text (for_postgres)
        if self.duckdb_type or self.postgres_type:
            hint.setdefault("data_type", _DLT_TYPE.get(str(self.arrow_type), "json"))
            hint.update({DUCKDB_TYPE: self.duckdb_type, POSTGRES_TYPE: self.postgres_type})
        return hint or None

    def as_text(self) -> Column:
        """This column landing as PostgreSQL's exact text, as versions before native types landed it (they knew
        no domains either)."""
        return Column(self.name, self.type_name, self.sql_type, self.nullable, pa.string())

    @property
    def lowest_literal(self) -> str:
        """The value a NULL of this column orders as (text types: the empty string)."""
        return self.lowest or _LOWEST.get(self.kind, "")


def column_of(name: str, type_name: str, sql_type: str, nullable: bool, pg: PgType, destination: str) -> Column:
    """A column as it lands in `destination` (duckdb or postgres)."""
    landing = land(pg, sql_type, destination)
    element = None
    if landing.element is not None and pg.element is not None:
        element = column_of("", pg.element.name, "", True, pg.element, destination)
    return Column(
        name,
        type_name,
        sql_type,
        nullable,
        landing.arrow_type,
        pg.name if pg.name != type_name else "",
        landing.decode,
        landing.duckdb_type,
        landing.postgres_type,
        element,
        pg.lowest,
    )


def type_hints(shape: TableShape) -> tuple[tuple[str, dict[str, object]], ...]:
    """(column, dlt hint) for the columns whose hint says more than their Arrow type."""
    return tuple((c.name, hint) for c in shape.columns if (hint := c.dlt_hint()) is not None)


_DLT_TYPE = {"float": "double", "string": "text"}


@dataclass(frozen=True)
class TableShape:
    schema: str
    table: str
    columns: tuple[Column, ...]

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns])


_COLUMNS_SQL = """
SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, a.atttypid, a.atttypmod,
       a.attndims
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# Every type a column's type leads to: a domain's base type, an array's element type, recursively.
_TYPES_SQL = """
WITH RECURSIVE reached(oid) AS (
    SELECT unnest(%s::oid[])
  UNION
    SELECT next.oid FROM reached JOIN pg_type t ON t.oid = reached.oid,
           LATERAL (VALUES (t.typbasetype), (CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END)) next(oid)
    WHERE next.oid <> 0
)
SELECT t.oid, t.typname, t.typtype = 'd', t.typbasetype, t.typtypmod,
       CASE WHEN t.typcategory = 'A' THEN t.typelem END, t.typdelim, t.typnamespace = 'pg_catalog'::regnamespace,
       CASE t.typtype  -- the lowest value of an enum (its first label), a range or a multirange (the empty one)
           WHEN 'e' THEN (SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder LIMIT 1)
           WHEN 'r' THEN 'empty' WHEN 'm' THEN '{}' ELSE '' END
FROM reached JOIN pg_type t ON t.oid = reached.oid
"""


def discover_table(conn: PgConnection, schema: str, table: str, destination: str = "duckdb") -> TableShape:
    """The table's columns as they land in `destination` (duckdb, or postgres: PostgreSQL's own types)."""
    with conn.cursor() as cur:
        cur.execute(_COLUMNS_SQL, (schema, table))
        rows = cur.fetchall()
        if not rows:
            raise TableNotReadable(f"table {schema}.{table} does not exist or has no columns visible to this user")
        cur.execute(_TYPES_SQL, ([row[4] for row in rows],))
        types = {row[0]: _TypeRow(*row[1:]) for row in cur.fetchall()}
    columns = tuple(
        column_of(name, type_name, sql_type, nullable, _resolve(types, oid, typmod, dims), destination)
        for name, type_name, sql_type, nullable, oid, typmod, dims in rows
    )
    return TableShape(schema=schema, table=table, columns=columns)


class _TypeRow(NamedTuple):
    name: str
    is_domain: bool
    base: int
    base_typmod: int
    element: int | None
    delimiter: str
    in_catalog: bool
    lowest: str | None  # None: an enum without labels


def _resolve(types: dict[int, _TypeRow], oid: int, typmod: int, dims: int, builtin: bool = True) -> PgType:
    """Domains resolve to their base type (and its typmod); a domain is not a type the destination has."""
    row = types[oid]
    if row.is_domain:
        return _resolve(types, row.base, row.base_typmod, dims, builtin=False)
    element = None if row.element is None else _resolve(types, row.element, typmod, 0, builtin)
    return PgType(row.name, typmod, builtin and row.in_catalog, element, row.delimiter, dims, row.lowest or "")
