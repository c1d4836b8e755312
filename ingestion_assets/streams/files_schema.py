"""Schema handling for file streams: each file's inferred Arrow columns go through the stream's schema policy
before they load (new columns added, widened types applied to the target, incompatible ones pause).

A file is typed on its own (a CSV column of small numbers reads as integers in one drop and as decimals in
the next), so a file's narrower type is cast up to the type the target already holds, and only a type the
target cannot hold is a change. A column absent from a file is not dropped: the rows load with nulls there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.schema.changes import ColumnType, SchemaChange, classify, parse_stored
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow
from ingestion_assets.streams.files_names import FileColumnNames
from ingestion_assets.streams.schema_step import InferredSchemaStep, SchemaPaused


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


@dataclass
class FilesSchemaStep(InferredSchemaStep):
    """The run's schema step for a file stream: `stored` grows in place as files load (checkpointed with each
    slice), `applied` lists what changed for the run's report."""

    columns: FileColumnNames | None = None  # how the files' columns are spelled (one target column, one name)

    def settle(self, table: pa.Table, loader: Loader, where: str) -> pa.Table:
        """One file's batch, in the target's types; raises SchemaPaused before anything of it loads."""
        if self.columns is not None:
            table = self.columns.spelled(table)
        known = parse_stored(self.stored) or {}
        changes: list[SchemaChange] = []
        for field in table.schema:
            new = column_type(field.type)
            old = known.get(field.name)
            if new is None or field.name.startswith("_ingest_") or old == new:
                continue
            if old is not None and (
                old.type_name == new.type_name
                or classify(new, old) == "widened"
                or _doubles_hold(table.column(field.name), old)
            ):
                continue  # the file's type fits in the target's: cast below
            kind = "added" if old is None else classify(old, new)
            if kind is not None:
                key = field.name in self.key_fields and kind == "incompatible"
                changes.append(SchemaChange(kind, field.name, old, new, "it is a primary key" if key else ""))
        if changes:
            self._apply(changes, loader, where)
        return self.cast(table)

    def _apply(self, changes: list[SchemaChange], loader: Loader, where: str) -> None:
        decision = self.decide(changes)
        if decision.pause:
            raise SchemaPaused(self._paused(decision.pause, where), decision.pause)
        retyped = [c for c in decision.apply if c.old is not None and c.new is not None]
        if retyped and loader.targettable_exists():  # else nothing to retype: the first load creates it so
            kind = loader.destination.type
            loader.migrate([(c, sql_type_of_arrow(_arrow(c), kind), _arrow(c)) for c in retyped])
        for change in decision.apply:
            assert change.new is not None
            self.stored[change.column] = [change.new.type_name, change.new.sql_type]
        self.applied += [c for c in decision.apply if not (self.learning and c.kind == "added")]
        self.skipped += [c for c in decision.skip if c.column not in {s.column for s in self.skipped}]

    def cast(self, table: pa.Table) -> pa.Table:
        """Columns in the stored types; skipped (ignored) columns and columns of nulls only left out."""
        known = parse_stored(self.stored) or {}
        skipped = {c.column for c in self.skipped}
        for field in list(table.schema):
            name = field.name
            if name.startswith("_ingest_"):
                continue
            stored = known.get(name)
            target = arrow_type(stored) if stored is not None else None
            if name in skipped or (stored is None and pa.types.is_null(field.type)):
                table = table.drop_columns([name])
            elif target is not None and field.type != target:
                index = table.schema.get_field_index(name)
                table = table.set_column(index, pa.field(name, target), pc.cast(table.column(name), target))
        return table

    def _paused(self, changes: list[SchemaChange], where: str) -> str:
        listed = "; ".join(c.describe() for c in changes)
        return (
            f"stream {self.name} is paused by a schema change in {where} (policy {self.policy}): {listed}. Its "
            f"checkpoint is kept (that file was not loaded); to apply it run `ingest schema accept {self.name}`"
            + "".join(
                f" (the old values of {c.column!r} are kept in `{c.column}__{c.old.type_name}`)"
                for c in changes
                if c.kind == "incompatible" and c.old is not None
            )
            + ", or change the policy"
        )


_EXACT_IN_DOUBLE = 2**53  # every integer up to this magnitude is a double exactly


def _doubles_hold(values: pa.ChunkedArray, target: ColumnType) -> bool:
    """Integers that a double column holds exactly (a file of whole amounts after one with decimals): they fit
    the target's type, while a bigint column as such does not (past 2**53 a double rounds)."""
    if target.type_name != "float8" or not pa.types.is_integer(values.type):
        return False
    low, high = pc.min_max(values).values()
    return low.as_py() is None or (low.as_py() >= -_EXACT_IN_DOUBLE and high.as_py() <= _EXACT_IN_DOUBLE)


def _arrow(change: SchemaChange) -> pa.DataType:
    assert change.new is not None
    return arrow_type(change.new) or pa.string()


def files_schema_step(stream: Any, details: dict[str, Any]) -> FilesSchemaStep:
    """The step a file stream's run starts with: the stored schema of its last checkpoint."""
    from ingestion_assets.loading.destinations import target_names

    spec = stream.spec
    step = FilesSchemaStep.resumed(stream, details, frozenset(spec.primary_key))
    step.columns = FileColumnNames(target_names(stream.destination), [*spec.primary_key, *step.stored])
    return step
