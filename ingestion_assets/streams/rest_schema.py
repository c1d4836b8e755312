"""Schema handling for API streams: each slice's field types are compared with the stored schema before it
loads, and the stream's policy applies (the same policies and change kinds as for tables).

An API has no catalog to discover, so the schema is learnt from the records: a field's type is that of
its values (JSON null says nothing). A field absent from a slice is not a dropped one (APIs leave out
optional fields), so drops are never reported; dlt keeps the column and fills it with nulls.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.schema.changes import ColumnType, SchemaChange, classify, parse_stored
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow
from ingestion_assets.streams.schema_step import InferredSchemaStep, SchemaPaused

_TYPES = {  # JSON value kind -> (type name as `classify` knows it, SQL spelling, Arrow type)
    "bool": ("bool", "boolean", pa.bool_()),
    "int8": ("int8", "bigint", pa.int64()),
    "float8": ("float8", "double precision", pa.float64()),
    "text": ("text", "text", pa.string()),
    "timestamptz": ("timestamptz", "timestamp with time zone", pa.timestamp("us", tz="UTC")),
    "json": ("json", "json", None),  # an object: dlt flattens it into `field__key` columns
    "array": ("array", "array", None),  # a list: a child table
}


def column_type(kind: str) -> ColumnType:
    name, sql, _ = _TYPES[kind]
    return ColumnType(name, sql)


def value_kind(value: Any, stored: ColumnType | None) -> str | None:
    """The kind of one JSON value; a string is a timestamp only where the field is one (or is new and looks
    like one), as dlt detects ISO timestamps in a new column and keeps a text column text."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int8"
    if isinstance(value, float):
        return "float8"
    if isinstance(value, dict):
        return "json"
    if isinstance(value, list):
        return "array"
    if stored is not None and stored.type_name != "timestamptz":
        return "text"
    return "timestamptz" if _is_timestamp(str(value)) else "text"


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

    def settle(self, records: list[dict[str, Any]], loader: Loader) -> list[dict[str, Any]]:
        """Check a slice before it loads: record new fields, widen the target for widened types, strip
        fields a policy skips, or raise SchemaPaused (the slice is not loaded, its checkpoint not moved)."""
        changes = self._changes(records)
        if not changes:
            return records
        decision = self.decide(changes)
        if decision.pause:
            raise SchemaPaused(self._paused(decision.pause), decision.pause)
        retyped = [c for c in decision.apply if c.old is not None and c.new is not None and _columns(c)]
        if retyped:
            kind = loader.destination.type
            loader.migrate([(c, sql_type_of_arrow(_arrow(c), kind), _arrow(c)) for c in retyped])
        for change in decision.apply:
            assert change.new is not None
            self.stored[change.column] = [change.new.type_name, change.new.sql_type]
        self.applied += [c for c in decision.apply if not (self.learning and c.kind == "added")]
        self.skipped += [c for c in decision.skip if c.column not in {s.column for s in self.skipped}]
        skipped = decision.skipped_columns | {c.column for c in self.skipped}
        return [{k: v for k, v in r.items() if k not in skipped} for r in records] if skipped else records

    def _changes(self, records: list[dict[str, Any]]) -> list[SchemaChange]:
        known = dict(parse_stored(self.stored) or {})
        changes: dict[str, SchemaChange] = {}
        for record in records:
            for field, value in record.items():
                if field.startswith("_ingest_"):
                    continue
                kind = value_kind(value, known.get(field))
                if kind is None or (field in known and known[field] == column_type(kind)):
                    continue
                new = column_type(kind)
                change = _change(field, known.get(field), new, field in self.key_fields)
                if change is None:
                    continue
                changes[field] = change
                known[field] = new if change.kind != "incompatible" else known.get(field, new)
        return list(changes.values())

    def _paused(self, changes: list[SchemaChange]) -> str:
        listed = "; ".join(c.describe() for c in changes)
        return (
            f"stream {self.name} is paused by a schema change in the API's records (policy {self.policy}): "
            f"{listed}. Its checkpoint is kept (the slice with the change was not loaded); to apply it run "
            f"`ingest schema accept {self.name}` (an incompatible field keeps its old values in "
            "`<field>__<old type>`), or change the policy"
        )


def _change(field: str, old: ColumnType | None, new: ColumnType, key: bool) -> SchemaChange | None:
    if old is None:
        return SchemaChange("added", field, None, new)
    kind = classify(old, new)
    if kind == "widened" and (None in (_TYPES[old.type_name][2], _TYPES[new.type_name][2])):
        kind = "incompatible"  # an object or a list becoming text is no widening dlt can apply
    if kind is None:
        return None
    note = "it is a primary key or cursor field" if key and kind == "incompatible" else ""
    return SchemaChange(kind, field, old, new, note)


def _columns(change: SchemaChange) -> bool:
    """Whether both types are a column of their own (an object is flattened, a list is a child table)."""
    assert change.old is not None and change.new is not None
    return None not in (_TYPES[change.old.type_name][2], _TYPES[change.new.type_name][2])


def _arrow(change: SchemaChange) -> pa.DataType:
    assert change.new is not None
    arrow = _TYPES[change.new.type_name][2]
    return arrow if arrow is not None else pa.string()


def api_schema_step(stream: Any, details: dict[str, Any]) -> ApiSchemaStep:
    """The step an API stream's run starts with: the stored schema of its last checkpoint."""
    spec = stream.spec
    keys = frozenset([*spec.primary_key, *([spec.cursor] if spec.cursor else [])])
    return ApiSchemaStep.resumed(stream, details, keys)
