"""Schema handling for file streams: each file's inferred Arrow columns go through the stream's schema policy
before they load (new columns added, widened types applied to the target, incompatible ones pause).

A file is typed on its own (a CSV column of small numbers reads as integers in one drop and as decimals in
the next), so a file's narrower type is cast up to the type the target already holds, and only a type the
target cannot hold is a change. A column absent from a file is not dropped: the rows load with nulls there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.schema.changes import SchemaChange, classify, parse_stored
from ingestion_assets.sources.files import TEXT
from ingestion_assets.sources.postgres.landing import sql_type_of_arrow
from ingestion_assets.streams.files_names import FileColumnNames
from ingestion_assets.streams.inferred_types import (
    arrow_type,
    cast_exactly,
    column_type,
    fits,
    held_column_type,
    wider,
)
from ingestion_assets.streams.schema_step import InferredSchemaStep, SchemaPaused
from ingestion_assets.streams.target_types import target_column_types

log = logging.getLogger(__name__)


@dataclass
class FilesSchemaStep(InferredSchemaStep):
    """The run's schema step for a file stream: `stored` grows in place as files load (checkpointed with each
    slice), `applied` lists what changed for the run's report."""

    columns: FileColumnNames | None = None  # how the files' columns are spelled (one target column, one name)
    _held: dict[str, str] | None = None  # the target's columns (by target name) and SQL types, asked once a run

    def settle(self, table: pa.Table, loader: Loader, where: str) -> pa.Table:
        """One file's batch, in the target's types; raises SchemaPaused before anything of it loads."""
        if self.columns is not None:
            table = self.columns.spelled(table)
        self._known_to_target(table, loader)
        known = parse_stored(self.stored) or {}
        changes: list[SchemaChange] = []
        for field in table.schema:
            new = column_type(field.type)
            old = known.get(field.name)
            if new is None or field.name.startswith("_ingest_") or old == new:
                continue
            if old is not None and fits(table.column(field.name), new, old):
                continue  # the file's type fits in the target's: cast below
            wanted = new if old is None else wider(old, new, table.column(field.name))
            kind = "added" if old is None else classify(old, wanted)
            if kind is not None:
                key = field.name in self.key_fields and kind == "incompatible"
                changes.append(SchemaChange(kind, field.name, old, wanted, "it is a primary key" if key else ""))
        if changes:
            self._apply(changes, loader, where)
        return self.cast(table)

    def _known_to_target(self, table: pa.Table, loader: Loader) -> None:
        """Columns this stream's schema does not know yet but the target already holds (written by another
        partition, whose checkpoint has a schema of its own, or before a reset) take the target's type as their
        stored one: a file's values are then cast to it, or the column widened there, never loaded as a new
        column of another type (DECIMAL(3,1) meeting 100.5 failed the load)."""
        new = [n for n in table.column_names if n not in self.stored and not n.startswith("_ingest_")]
        if not new:
            return
        if self._held is None:
            types = target_column_types(loader)
            self._held = (types if types is not None else loader.held_types()) or {}
        for name in new:
            held = held_column_type(self._held.get(loader.names.column(name), ""))
            if held is not None:
                self.stored[name] = [held.type_name, held.sql_type]

    def _apply(self, changes: list[SchemaChange], loader: Loader, where: str) -> None:
        decision = self.decide(changes)
        if decision.pause:
            raise SchemaPaused(self._paused(decision.pause, where), decision.pause)
        retyped = [c for c in decision.apply if c.old is not None and c.new is not None]
        if retyped and loader.targettable_exists():  # else nothing to retype: the first load creates it so
            kind = loader.destination.type
            self.retype(loader, [(c, sql_type_of_arrow(_arrow(c), kind), _arrow(c)) for c in retyped])
            self._warn_texts(retyped)
        for change in decision.apply:
            assert change.new is not None
            self.stored[change.column] = [change.new.type_name, change.new.sql_type]
        self.applied += [c for c in decision.apply if not (self.learning and c.kind == "added")]
        self.skipped += [c for c in decision.skip if c.column not in {s.column for s in self.skipped}]

    def cast(self, table: pa.Table) -> pa.Table:
        """Columns in the stored types; skipped (ignored) columns and columns of nulls only left out. A column
        stored as text takes the file's own text where the reader kept it (`1e3`, `TRUE`, a time's offset as
        written), never the typed value written back; the texts stay beside the columns (a later file of the
        slice may still make one text): `without_texts` drops them before the load."""
        known = parse_stored(self.stored) or {}
        skipped = {c.column for c in self.skipped}
        for field in list(table.schema):
            name = field.name
            if name.startswith("_ingest_"):
                continue
            stored = known.get(name)
            target = arrow_type(stored) if stored is not None else None
            if name in skipped or (stored is None and pa.types.is_null(field.type)):
                table = table.drop_columns([name, *([TEXT + name] if TEXT + name in table.column_names else [])])
            elif target is not None and field.type != target:
                index = table.schema.get_field_index(name)
                text = TEXT + name in table.column_names and pa.types.is_string(target)
                cast = table.column(TEXT + name) if text else cast_exactly(table.column(name), target)
                if cast is None:  # the schema step let through a type the target cannot hold: never load it changed
                    raise ValueError(f"stream {self.name}: column {name!r} ({field.type}) does not fit {target}")
                table = table.set_column(index, pa.field(name, target), cast)
        return table

    def _warn_texts(self, retyped: list[SchemaChange]) -> None:
        """A column made text in the target: its rows already there were converted by the database (`1.5` for a
        file's `1.50`, `1000` for `1e3`, a time at UTC for one written with an offset), not given the file's
        text, which only a new read of their files gives them: say so, loudly."""
        for change in retyped:
            if change.new is not None and change.new.type_name == "text" and change.old is not None:
                log.warning(
                    "stream %s: column %r became text (was %s); its rows already in the target were converted by "
                    "the destination and may not read as their files wrote them (1.50 as 1.5, 1e3 as 1000, TRUE as "
                    "true, an offset time at UTC): run `ingest refresh %s` to read their files again",
                    self.name,
                    change.column,
                    change.old.sql_type,
                    self.name,
                )

    def _paused(self, changes: list[SchemaChange], where: str) -> str:
        listed = "; ".join(c.describe() for c in changes)
        return (
            f"stream {self.name} is paused by a schema change in {where} (policy {self.policy}): {listed}. Its "
            f"checkpoint is kept (that file was not loaded); to apply it run `ingest schema accept {self.name}`"
            + "".join(
                f" (the old values of {c.column!r} are kept in `{c.column}__{c.old.type_name}` when each survives the "
                "new type; else nothing changes)"
                for c in changes
                if c.kind == "incompatible" and c.old is not None
            )
            + ", or change the policy"
        )


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
