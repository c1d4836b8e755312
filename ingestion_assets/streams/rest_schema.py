"""Schema handling for API streams: each slice's field types are compared with the stored schema before it
loads, and the stream's policy applies (the same policies and change kinds as for tables).

An API has no catalog to discover, so the schema is learnt from the records: a field's type is that of
its values (JSON null says nothing). A field absent from a slice is not a dropped one (APIs leave out
optional fields), so drops are never reported; dlt keeps the column and fills it with nulls.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.schema.changes import ColumnType, SchemaChange, classify, parse_stored
from ingestion_assets.sources.iso_times import to_microseconds
from ingestion_assets.sources.json_numbers import Number, is_number, json_text, number_array, value_text
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow
from ingestion_assets.streams.inferred_types import arrow_type, fits, wider
from ingestion_assets.streams.inferred_types import column_type as arrow_column_type
from ingestion_assets.streams.schema_step import InferredSchemaStep, SchemaPaused

_TYPES = {  # JSON value kind -> (type name as `classify` knows it, SQL spelling); numbers are typed by their column
    "bool": ("bool", "boolean"),
    "text": ("text", "text"),
    "timestamptz": ("timestamptz", "timestamp with time zone"),
    "json": ("json", "json"),  # an object: dlt flattens it into `field__key` columns
    "array": ("array", "array"),  # a list: a child table
}
_TEXT = ColumnType("text", "text")
_NESTED = ("json", "array")  # no column of their own: no Arrow type
_NUMBERS = ("int8", "numeric", "float8")


def column_type(kind: str) -> ColumnType:
    name, sql = _TYPES[kind]
    return ColumnType(name, sql)


def value_kind(value: Any, stored: ColumnType | None) -> str | None:
    """The kind of one JSON value (`number` for every number: a field's numbers are typed together, see
    `number_types`); a string is a timestamp only where the field is one (or is new and looks like one), as dlt
    detects ISO timestamps in a new column and keeps a text column text."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if is_number(value):
        return "number"
    if isinstance(value, dict):
        return "json"
    if isinstance(value, list):
        return "array"
    if stored is not None and stored.type_name != "timestamptz":
        return "text"
    return "timestamptz" if _is_timestamp(str(value)) else "text"


def number_types(records: list[dict[str, Any]]) -> dict[str, tuple[ColumnType, pa.Array | None]]:
    """Each field's numbers in a slice as one column holding each as written (the files' rules: integers bigint,
    numbers with a point or past int64 exact decimals, exponents doubles when a double holds them; else text),
    with the values in that type (None: text)."""
    found: dict[str, list[Any]] = {}
    for record in records:
        for field, value in record.items():
            if is_number(value) and not field.startswith("_ingest_"):
                found.setdefault(field, []).append(value)
    typed: dict[str, tuple[ColumnType, pa.Array | None]] = {}
    for field, values in found.items():
        array = number_array(values)
        kind = None if array is None else arrow_column_type(array.type)
        typed[field] = (_TEXT, None) if kind is None or array is None else (kind, array)
    return typed


def _is_timestamp(text: str) -> bool:
    if len(text) < 10 or not text[:4].isdigit() or text[4] != "-":
        return False
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


@dataclass
class ApiSchemaStep(InferredSchemaStep):
    """The run's schema step for an API stream. `stored` and `applied` grow in place as slices load: the
    runner checkpoints `stored` with every slice and reports `applied` at the end."""

    primary_key: frozenset[str] = frozenset()  # a number in a text key column lands as its value's text

    def settle(self, records: list[dict[str, Any]], loader: Loader) -> list[dict[str, Any]]:
        """Check a slice before it loads: record new fields, widen the target for widened types, strip
        fields a policy skips, or raise SchemaPaused (the slice is not loaded, its checkpoint not moved). The
        records come back with their numbers in their columns' types, exact (see `exact_values`)."""
        changes = self._changes(records)
        if changes:
            records = self._apply(changes, records, loader)
        return self.exact_values(records)

    def _apply(
        self, changes: list[SchemaChange], records: list[dict[str, Any]], loader: Loader
    ) -> list[dict[str, Any]]:
        decision = self.decide(changes)
        if decision.pause:
            raise SchemaPaused(self._paused(decision.pause), decision.pause)
        retyped = [c for c in decision.apply if c.old is not None and c.new is not None and _columns(c)]
        if retyped:
            kind = loader.destination.type
            self.retype(loader, [(c, sql_type_of_arrow(_arrow(c), kind), _arrow(c)) for c in retyped])
        for change in decision.apply:
            assert change.new is not None
            self.stored[change.column] = [change.new.type_name, change.new.sql_type]
        self.applied += [c for c in decision.apply if not (self.learning and c.kind == "added")]
        self.skipped += [c for c in decision.skip if c.column not in {s.column for s in self.skipped}]
        skipped = decision.skipped_columns | {c.column for c in self.skipped}
        return [{k: v for k, v in r.items() if k not in skipped} for r in records] if skipped else records

    def exact_values(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Numbers as their field's stored type holds them exactly: a decimal column's as decimals (dlt gets the
        column's precision and scale from `column_hints`), a double column's as doubles (each fits, or the schema
        step widened it), a text column's as the text the API wrote. Numbers inside objects and lists keep their
        text unless they are integers of int64 (dlt would round a decimal to 9 places or write it as a JSON
        string, and fails the whole load on an integer past 64 bits)."""
        known = parse_stored(self.stored) or {}
        exact = []
        for record in records:
            row = dict(record)
            for field, value in record.items():
                if isinstance(value, dict | list):
                    row[field] = _nested(value)
                elif field.startswith("_ingest_"):
                    continue
                elif is_number(value):
                    column = known.get(field)
                    key_text = field in self.primary_key and _is_text(column)  # one id, however it is written
                    row[field] = value_text(value) if key_text else _as_stored(value, column)
                elif isinstance(value, str) and _is_stamp(known.get(field)):
                    row[field] = to_microseconds(value) or value  # dlt would cut digits past the sixth
                elif isinstance(value, bool) and _is_text(known.get(field)):
                    row[field] = json_text(value)  # `true`, as the column's rows made text by the database read
            exact.append(row)
        return exact

    def column_hints(self) -> dict[str, dict[str, Any]]:
        """dlt hints for the decimal fields: their precision and scale (dlt's default decimal, 38 digits with 9
        after the point, would round)."""
        hints: dict[str, dict[str, Any]] = {}
        for field, column in (parse_stored(self.stored) or {}).items():
            kind = arrow_type(column) if column.type_name == "numeric" else None
            if kind is not None and pa.types.is_decimal(kind):
                hints[field] = {"data_type": "decimal", "precision": kind.precision, "scale": kind.scale}
        return hints

    def _changes(self, records: list[dict[str, Any]]) -> list[SchemaChange]:
        known = dict(parse_stored(self.stored) or {})
        numbers = number_types(records)
        changes: dict[str, SchemaChange] = {}
        for record in records:
            for field, value in record.items():
                if field.startswith("_ingest_"):
                    continue
                kind = value_kind(value, known.get(field))
                if kind is None:
                    continue
                new, values = numbers[field] if kind == "number" else (column_type(kind), None)
                old = known.get(field)
                if old == new or (old is not None and _fits(old, new, values)):
                    continue  # values the stored type holds: cast in `exact_values` (text to a number pauses)
                wanted = new if old is None or values is None else wider(old, new, values)
                change = _change(field, old, wanted, field in self.key_fields)
                if change is None:
                    continue
                changes[field] = change
                known[field] = wanted if change.kind != "incompatible" else known.get(field, wanted)
        return list(changes.values())

    def _paused(self, changes: list[SchemaChange]) -> str:
        listed = "; ".join(c.describe() for c in changes)
        return (
            f"stream {self.name} is paused by a schema change in the API's records (policy {self.policy}): "
            f"{listed}. Its checkpoint is kept (the slice with the change was not loaded); to apply it run "
            f"`ingest schema accept {self.name}` (an incompatible field keeps its old values in "
            "`<field>__<old type>`, when each of them survives the new type: else nothing changes), or change "
            "the policy"
        )


def _change(field: str, old: ColumnType | None, new: ColumnType, key: bool) -> SchemaChange | None:
    if old is None:
        return SchemaChange("added", field, None, new)
    kind = classify(old, new)
    if kind == "widened" and (old.type_name in _NESTED or new.type_name in _NESTED):
        kind = "incompatible"  # an object or a list becoming text is no widening dlt can apply
    if kind is None:
        return None
    note = "it is a primary key or cursor field" if key and kind == "incompatible" else ""
    return SchemaChange(kind, field, old, new, note)


def _fits(old: ColumnType, new: ColumnType, values: pa.Array | None) -> bool:
    """Whether a slice's values of type `new` load into the stored type `old` as they are: a slice is typed on its
    own, so integers after the field became text (or a double) are not a change back to bigint, only values the
    stored type cannot hold are. Numbers by their values (`fits`), booleans and timestamps where the stored type
    holds every one of them (text); an object or a list never fits a column (dlt flattens it)."""
    if old.type_name in _NESTED or new.type_name in _NESTED:
        return False
    if values is not None:
        return fits(values, new, old)
    return classify(new, old) == "widened"


def _columns(change: SchemaChange) -> bool:
    """Whether both types are a column of their own (an object is flattened, a list is a child table)."""
    assert change.old is not None and change.new is not None
    return change.old.type_name not in _NESTED and change.new.type_name not in _NESTED


def _arrow(change: SchemaChange) -> pa.DataType:
    assert change.new is not None
    arrow = arrow_type(change.new)
    return arrow if arrow is not None else pa.string()


def _as_stored(value: Any, column: ColumnType | None) -> Any:
    """A number in its column's type, exactly (the schema step made sure the type holds it)."""
    if column is None or column.type_name == "int8":
        return value
    if column.type_name == "numeric":  # a Decimal: dlt fails an int past 64 bits, Arrow rounds a double
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(value) if isinstance(value, int) else value
    if column.type_name == "float8":
        return float(value)
    return json_text(value)  # text (or a type a number never lands in, which the load then reports)


def _is_text(column: ColumnType | None) -> bool:
    return column is not None and column.type_name == "text"


def _is_stamp(column: ColumnType | None) -> bool:
    return column is not None and column.type_name == "timestamptz"


def _nested(value: Any) -> Any:
    """An object or list with its numbers exact for dlt: integers of int64 as they are, other numbers as text."""
    if isinstance(value, dict):
        return {k: _nested(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nested(v) for v in value]
    if isinstance(value, Number) or (isinstance(value, int) and not -(2**63) <= value < 2**63):
        return json_text(value)
    return value


def api_schema_step(stream: Any, details: dict[str, Any]) -> ApiSchemaStep:
    """The step an API stream's run starts with: the stored schema of its last checkpoint."""
    spec = stream.spec
    keys = frozenset([*spec.primary_key, *([spec.cursor] if spec.cursor else [])])
    step = ApiSchemaStep.resumed(stream, details, keys)
    step.primary_key = frozenset(spec.primary_key)
    return step
