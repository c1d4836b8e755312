"""The ordered, keyset-bounded SELECT a table stream reads, and the position a slice ends at."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from ingestion_assets.sources.postgres.bad_values import RAW, fits, raw_when_unfit
from ingestion_assets.sources.postgres.introspect import Column, TableShape
from ingestion_assets.sources.postgres.values import plain

Position = dict[str, str | None]  # ordering column -> exact text of its value (None: NULL)


@dataclass(frozen=True)
class Window:
    """The rows of one partition: `lower <= column < upper` (either bound may be open)."""

    column: str
    lower: str | None = None
    upper: str | None = None


SETTLED = "_ingest_settled"


@dataclass(frozen=True)
class Settled:
    """Rows up to `position` are settled: no open transaction can still commit a row at or below it."""

    position: Position | None  # None: nothing is settled yet
    floor: Position | None = None  # the checkpoint the run started from: a slice's position never falls below


class PositionMismatch(ValueError):
    """A stored position does not fit the stream's ordering columns (the catalog changed)."""

    transient = False


@dataclass(frozen=True)
class ReadPlan:
    """What one stream reads: all columns, ordered by cursor then primary key (the tie-breaker)."""

    shape: TableShape
    cursor: tuple[str, ...]
    primary_key: tuple[str, ...]
    max_value_bytes: int = 16 << 20

    @property
    def checks(self) -> list[tuple[Column, sql.Composable]]:
        found = [(c, fits(c)) for c in self.shape.columns]
        return [(c, condition) for c, condition in found if condition is not None]

    @property
    def wire_shape(self) -> TableShape:
        """The columns COPY sends: the table's, then the raw record of a row with a value that does not fit."""
        extra = (Column(RAW, "text", "text", True, pa.string()),)
        return TableShape(self.shape.schema, self.shape.table, self.shape.columns + extra)

    @property
    def settled_wire_shape(self) -> TableShape:
        """The wire shape plus, per row, whether it is at or below the settled position (see horizon.py)."""
        extra = (Column(SETTLED, "bool", "boolean", False, pa.bool_()),)
        return TableShape(self.shape.schema, self.shape.table, self.wire_shape.columns + extra)

    def order_expressions(self) -> list[sql.Composable]:
        """The keyset's sort keys, as the read orders and compares them (NULL as the type's lowest value)."""
        return [_order_expr(c) for c in self.ordering]

    @property
    def ordering(self) -> tuple[Column, ...]:
        names = list(self.cursor) + [k for k in self.primary_key if k not in self.cursor]
        return tuple(self.shape.column(name) for name in names)

    def copy_statement(
        self,
        conn: PgConnection,
        after: Position | None,
        window: Window | None = None,
        keys_in: Sequence[Sequence[str | None]] | None = None,
        settled: Settled | None = None,
        limit: int | None = None,
    ) -> str:
        """COPY of every row of `window` strictly after `after` in (cursor, primary key) order (the first `limit`).

        COPY takes no bind parameters, so literals are quoted by psycopg2 and cast to the column type.
        `settled`: each row also says whether it is at or below that position, compared as the keyset is.
        """
        query = self._select(after, window, keys_in, settled)
        if limit is not None:  # the planner walks the key's index for the next rows instead of sorting the rest
            query += sql.SQL(" LIMIT {n}").format(n=sql.Literal(int(limit)))
        copy = sql.SQL("COPY ({query}) TO STDOUT WITH (FORMAT csv)").format(query=query)
        return copy.as_string(conn)

    def dry_run_statement(self, conn: PgConnection) -> str:
        """The very read a run starts with, returning no row: `ingest check` proves the server can run it."""
        # A resumed read's keyset comparison with typed NULLs: the casts and comparison operators of every ordering
        # column are resolved, and no literal is invented that the type may reject ('' is no uuid, inet or enum).
        return (self._select(None, None, None, probe=True) + sql.SQL(" LIMIT 0")).as_string(conn)

    def _select(
        self,
        after: Position | None,
        window: Window | None,
        keys_in: Sequence[Sequence[str | None]] | None,
        settled: Settled | None = None,
        probe: bool = False,
    ) -> sql.Composed:
        keys = [_order_expr(c) for c in self.ordering]
        query = sql.SQL("SELECT {cols}, {raw}{settled} FROM {table} t").format(
            cols=sql.SQL(", ").join(self._output(c) for c in self.shape.columns),
            raw=raw_when_unfit(self.checks),
            settled=sql.SQL("") if settled is None else sql.SQL(", ") + self._settled_flag(settled),
            table=sql.Identifier(self.shape.schema, self.shape.table),
        )
        conditions = self.window_conditions(window) if window is not None else []
        if after is not None or probe:
            values = [_typed_null(c) if probe else _literal(c, self._value(after or {}, c)) for c in self.ordering]
            conditions.append(
                sql.SQL("({keys}) > ({values})").format(
                    keys=sql.SQL(", ").join(keys), values=sql.SQL(", ").join(values)
                )
            )
        if keys_in is not None:
            conditions.append(self._key_condition(keys_in))
        if conditions:
            query += sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)
        query += sql.SQL(" ORDER BY {keys}").format(keys=sql.SQL(", ").join(keys))
        return query

    @property
    def key_shape(self) -> TableShape:
        return TableShape(self.shape.schema, self.shape.table, self.ordering)

    def keys_statement(
        self, conn: PgConnection, after: Position | None, upto: Position, window: Window | None = None
    ) -> str:
        """COPY of the ordering columns (cursor, primary key) of the rows in (after, upto] of `window`."""
        keys = [_order_expr(c) for c in self.ordering]
        conditions = self.window_conditions(window) if window is not None else []
        if after is not None:
            values = [_literal(c, self._value(after, c)) for c in self.ordering]
            conditions.append(sql.SQL("({}) > ({})").format(sql.SQL(", ").join(keys), sql.SQL(", ").join(values)))
        values = [_literal(c, self._value(upto, c)) for c in self.ordering]
        conditions.append(sql.SQL("({}) <= ({})").format(sql.SQL(", ").join(keys), sql.SQL(", ").join(values)))
        query = sql.SQL("SELECT {cols} FROM {table} t WHERE {where}").format(
            cols=sql.SQL(", ").join(self._output(c) for c in self.ordering),
            table=sql.Identifier(self.shape.schema, self.shape.table),
            where=sql.SQL(" AND ").join(conditions),
        )
        return sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(query).as_string(conn)

    def _settled_flag(self, settled: Settled) -> sql.Composable:
        """True for a row a checkpoint may end at: settled, and past the floor (compared as the keyset is)."""
        if settled.position is None:
            return sql.SQL("false")
        keys = sql.SQL(", ").join(_order_expr(c) for c in self.ordering)
        flag = sql.SQL("({}) <= ({})").format(keys, self._literals(settled.position))
        if settled.floor is not None:
            flag = sql.SQL("{} AND ({}) > ({})").format(flag, keys, self._literals(settled.floor))
        return flag

    def at_or_before(self, position: Position) -> sql.Composable:
        """Rows the keyset read has passed once its checkpoint is `position` (alias `t`)."""
        keys = sql.SQL(", ").join(self.order_expressions())
        return sql.SQL("({keys}) <= ({values})").format(keys=keys, values=self._literals(position))

    def _literals(self, position: Position) -> sql.Composable:
        return sql.SQL(", ").join(_literal(c, self._value(position, c)) for c in self.ordering)

    def _key_condition(self, keys: Sequence[Sequence[str | None]]) -> sql.Composable:
        """Rows whose primary key is one of `keys` (each the key's values as text; None: a NULL, which only a
        parked row's key holds, matched with IS NULL)."""
        columns = [self.shape.column(name) for name in self.primary_key]
        idents = sql.SQL(", ").join(sql.SQL("t.") + sql.Identifier(c.name) for c in columns)
        rows = [
            sql.SQL("({})").format(sql.SQL(", ").join(_literal(c, v) for c, v in zip(columns, key, strict=True)))
            for key in keys
            if None not in key
        ]
        condition = sql.SQL("({}) IN ({})").format(idents, sql.SQL(", ").join(rows)) if rows else sql.SQL("false")
        keyless = [
            sql.SQL("({})").format(sql.SQL(" AND ").join(_key_equals(c, v) for c, v in zip(columns, key, strict=True)))
            for key in keys
            if None in key
        ]
        return sql.SQL("({})").format(sql.SQL(" OR ").join([condition, *keyless])) if keyless else condition

    def _output(self, column: Column) -> sql.Composable:
        ident = sql.SQL("t.") + sql.Identifier(column.name)
        condition = dict((c.name, cond) for c, cond in self.checks).get(column.name)
        if condition is None:
            return ident
        return sql.SQL("CASE WHEN {ok} THEN {c} END").format(ok=condition, c=ident)

    def window_conditions(self, window: Window) -> list[sql.Composable]:
        column = self.shape.column(window.column)
        ident = sql.SQL("t.") + sql.Identifier(column.name)
        conditions: list[sql.Composable] = []
        if window.lower is not None:
            conditions.append(sql.SQL("{} >= {}").format(ident, _literal(column, window.lower)))
        if window.upper is not None:
            conditions.append(sql.SQL("{} < {}").format(ident, _literal(column, window.upper)))
        return conditions

    def position_of_last_row(self, table: pa.Table, last: int | None = None) -> Position:
        """Exact text of the last row's ordering values; a value nulled as unloadable comes from its raw JSON."""
        last = table.num_rows - 1 if last is None else last
        position = {c.name: exact_text(plain(table.column(c.name)[last])) for c in self.ordering}
        raw = table.column(RAW)[last].as_py() if RAW in table.column_names else None
        if raw is not None:
            record = json.loads(raw)
            for name, value in position.items():
                if value is None and record.get(name) is not None:
                    position[name] = str(record[name])
        return position

    def _value(self, position: Mapping[str, Any], column: Column) -> str | None:
        if column.name not in position:
            raise PositionMismatch(
                f"the stored position has no value for ordering column {column.name!r} "
                f"(it holds {sorted(position)}); the cursor or primary key changed: "
                "reset the stream's state with `ingest state reset`"
            )
        value = position[column.name]
        return None if value is None else str(value)


def _order_expr(column: Column) -> sql.Composable:
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    if not column.nullable:
        return ident
    return sql.SQL("COALESCE({ident}, {lowest})").format(ident=ident, lowest=_literal(column, None))


def _literal(column: Column, value: str | None) -> sql.Composable:
    text = column.lowest_literal if value is None else value
    return sql.SQL("{value}::{type}").format(value=sql.Literal(text), type=sql.SQL(column.sql_type))


def _key_equals(column: Column, value: str | None) -> sql.Composable:
    ident = sql.SQL("t.") + sql.Identifier(column.name)
    if value is None:
        return sql.SQL("{} IS NULL").format(ident)
    return sql.SQL("{} = {}").format(ident, _literal(column, value))


def _typed_null(column: Column) -> sql.Composable:
    return sql.SQL("NULL::{type}").format(type=sql.SQL(column.sql_type))


def exact_text(value: Any) -> str | None:
    """Text PostgreSQL parses back to the identical value (isoformat keeps microseconds and the zone)."""
    if value is None:
        return None
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return str(value)
