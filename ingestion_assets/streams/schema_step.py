"""Before a read: compare the table's columns with the stored schema and act by the stream's policy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

from ingestion_assets.loading.migrate import ValuesWouldBeLost, sql_type
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.schema.changes import (
    ColumnType,
    SchemaChange,
    StoredSchema,
    classify,
    diff,
    keeps_values,
    parse_stored,
    to_stored,
)
from ingestion_assets.schema.policy import Decision, decide
from ingestion_assets.sources.postgres.introspect import Column, column_of
from ingestion_assets.sources.postgres.landing import PgType
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.streams.postgres_table import PostgresTableStream
from ingestion_assets.streams.target_types import fit_plan, held_values, same_sql_type, target_column_types


class SchemaPaused(RuntimeError):
    """The source changed in a way the stream's policy does not apply by itself."""

    transient = False

    def __init__(self, message: str, changes: list[SchemaChange]) -> None:
        super().__init__(message)
        self.changes = changes


@dataclass
class SchemaStep:
    plan: ReadPlan | None  # None for sources whose schema dlt infers from the records (APIs)
    stored: StoredSchema  # what the state keeps after this run
    applied: list[SchemaChange] = field(default_factory=list)
    skipped: list[SchemaChange] = field(default_factory=list)

    def describe(self) -> list[str]:
        return [c.describe() for c in self.applied] + [f"{c.describe()} (not read: ignored)" for c in self.skipped]


@dataclass
class InferredSchemaStep(SchemaStep):
    """A schema step of a source whose types come from the rows themselves (API records, files): `stored`
    grows in place as slices load (checkpointed with each), `applied` lists what changed for the run's report."""

    policy: str = "evolve"
    accepted: bool = False
    name: str = ""
    key_fields: frozenset[str] = frozenset()
    learning: bool = False  # no schema stored yet: the first run learns the fields without reporting them

    @classmethod
    def resumed(cls, stream: Any, details: dict[str, Any], key_fields: frozenset[str]) -> Self:
        """The step a run starts with: the stored schema of the stream's last checkpoint."""
        return cls(
            plan=None,
            stored={k: list(v) for k, v in (details.get("schema") or {}).items()},
            policy=stream.spec.schema_policy,
            accepted=bool(details.get("schema_accepted")),
            name=stream.qualified_name,
            key_fields=key_fields,
            learning=not details.get("schema"),
        )

    def decide(self, changes: list[SchemaChange]) -> Decision:
        """What the policy does with `changes`. Before any schema is stored (a stream's first slice) the columns
        found are the schema, not changes to it: they are adopted whatever the policy (`pause` paused on each of
        them, `ignore` skipped them all); columns that come after it are changes."""
        if not self.stored:
            return Decision(apply=list(changes))
        return decide(self.policy, changes, accepted=self.accepted)

    def retype(self, loader: Loader, typed: list[tuple[SchemaChange, str, Any]]) -> None:
        """Change the target's column types (change, SQL type, Arrow type). An inferred source does not read its
        rows again, so a conversion that would not keep a value the target holds (text `A-3` or `0150` into a
        bigint) changes nothing and pauses the stream, whatever accepted or applied it."""
        try:
            loader.migrate(typed, exact=True)
        except ValuesWouldBeLost as exc:
            change = exc.change
            lost = f"{exc.count} value(s) (e.g. {exc.sample!r})" if exc.count > 0 else f"values ({exc.sample})"
            old = change.old.sql_type if change.old is not None else "-"
            new = change.new.sql_type if change.new is not None else "-"
            raise SchemaPaused(
                f"stream {self.name} is paused: its column {change.column!r} cannot change type {old} -> {new} "
                f"({change.kind}, policy {self.policy}{', accepted' if self.accepted else ''}) without losing "
                f"{lost} the target holds there, and this stream does not read those rows again. Nothing was "
                "changed and the checkpoint is kept. To load the new values, read the stream again in full into a "
                f"new table (`ingest refresh {self.name}`; a file stream can first fix the column's type, e.g. "
                "`csv.column_types: {COLUMN: string}`), or fix the source",
                [change],
            ) from exc


def settle_schema(stream: PostgresTableStream, details: dict[str, Any]) -> SchemaStep:
    """Discover, diff against the stored schema, and pause, skip or apply each change by policy."""
    discovered = {c.name: ColumnType(c.type_name, c.sql_type, c.base_type) for c in stream.discover().columns}
    stored = parse_stored(details.get("schema"))
    if stored is None:
        return SchemaStep(stream.plan(), to_stored(discovered))
    changes = diff(stored, discovered, stream.key_columns)
    decision = decide(stream.spec.schema_policy, changes, accepted=bool(details.get("schema_accepted")))
    if decision.pause:
        raise SchemaPaused(_paused_message(stream, decision.pause), decision.pause)
    plan = stream.plan(frozenset(decision.skipped_columns))
    kept = {name: column for name, column in discovered.items() if name not in decision.skipped_columns}
    return SchemaStep(plan, to_stored(kept), decision.apply, decision.skip)


_FILLED_SQL = """
SELECT attname FROM pg_attribute
WHERE attrelid = %(table)s::regclass AND attname = ANY(%(names)s) AND NOT attisdropped
  AND (atthasdef OR attgenerated <> '' OR attidentity <> '')
"""


def added_with_values(stream: PostgresTableStream, step: SchemaStep) -> list[str]:
    """Columns this run adds that the table filled in its existing rows (a default, a generated or identity
    column): those rows changed without their cursor moving, so a run reading on from its checkpoint would land
    them with NULL there. An added column without a default holds NULL in every existing row: nothing to read."""
    added = [c.column for c in step.applied if c.kind == "added"]
    if not added or step.plan is None:
        return []
    from psycopg2 import sql

    from ingestion_assets.sources.postgres.reader import connect

    conn = connect(stream.source_url(), "ingest-added-columns")
    try:
        table = sql.Identifier(stream.spec.schema_name, stream.spec.table_name).as_string(conn)
        with conn.cursor() as cur:
            cur.execute(_FILLED_SQL, {"table": table, "names": added})
            return sorted(str(row[0]) for row in cur.fetchall())
    finally:
        conn.close()


def added_over_values(loader: Loader, step: SchemaStep) -> list[str]:
    """Columns this run adds to the stored schema that the target already holds with values: a column the source
    dropped (the target keeps it) and added again under its name in a later run, or one the target holds any other
    way. The source's new column holds NULL (or its default) in every existing row, the target the old values,
    which rows not read again would keep. A target column of NULLs only changes nothing. Where the target's columns
    are not read here (a destination other than DuckDB, PostgreSQL, MariaDB/MySQL or a lake) every added column
    counts: a re-read costs time, never a row."""
    added = [c.column for c in step.applied if c.kind == "added"]
    if not added or step.plan is None:
        return []
    counts = held_values(loader, added)
    if counts is None:
        return sorted(added)
    return sorted(name for name, count in counts.items() if count)


COLUMN_IDS = "column_ids"  # the checkpoint detail: the table's oid and each column's number when it was read
_IDS_SQL = """
SELECT c.oid::bigint, a.attname, a.attnum, a.xmin::text FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
WHERE c.oid = %(table)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
"""


def column_ids(stream: PostgresTableStream) -> dict[str, Any]:
    """{"table": the table's oid, "columns": {name: [attnum, xmin of its pg_attribute row]}}: a column dropped and
    added again under its name (or a table dropped and made again, a restore) gets a new number, a column renamed
    keeps its number under a new name, and any ALTER of a column (a rewrite to the same type `USING` an
    expression, a type changed there and back, a rename and back) writes its row anew: no type or name
    comparison shows those."""
    from psycopg2 import sql

    from ingestion_assets.sources.postgres.reader import connect

    conn = connect(stream.source_url(), "ingest-column-ids")
    try:
        table = sql.Identifier(stream.spec.schema_name, stream.spec.table_name).as_string(conn)
        with conn.cursor() as cur:
            cur.execute(_IDS_SQL, {"table": table})
            rows = cur.fetchall()
    finally:
        conn.close()
    columns = {str(name): [int(number), str(xmin)] for _, name, number, xmin in rows}
    return {"table": int(rows[0][0]) if rows else None, "columns": columns}


def made_again(stored: Any, now: dict[str, Any], retyped: Iterable[str] = ()) -> list[str]:
    """What changed in place since `stored` (column_ids' figures) so that rows' values may have changed without
    their cursor moving: the table dropped and made again, a column dropped and added again, renamed (its values
    sit under a name the target does not have), or altered otherwise (a rewrite to the same type). A type change
    the schema step sees (`retyped`) is left to it (`keeps_values`). Nothing when nothing was stored."""
    if not isinstance(stored, dict) or not isinstance(stored.get("columns"), dict):
        return []
    if stored.get("table") is not None and stored.get("table") != now.get("table"):
        return ["the table itself"]
    before: dict[str, Any] = stored["columns"]
    columns: dict[str, Any] = now.get("columns") or {}
    numbers = {_number(figures): name for name, figures in before.items()}
    judged = set(retyped)
    changed = []
    for name, figures in columns.items():
        if name not in before:
            old = numbers.get(_number(figures))
            if old is not None and old not in columns:
                changed.append(f"column {name} (renamed from {old})")
        elif _number(before[name]) != _number(figures):
            changed.append(f"column {name} (dropped and added again)")
        elif _altered(before[name], figures) and name not in judged:
            changed.append(f"column {name} (altered in place)")
    return sorted(changed)


def unread_before(stored: Any, now: dict[str, Any], step: SchemaStep) -> list[str]:
    """Columns this run adds to the stored schema that the table already had, under the same number, when the last
    checkpoint was written (column_ids' figures): a policy that does not read added columns (`ignore`) skipped them,
    so rows that changed there were read without their values. A column new since then holds NULL (or its
    default, `added_with_values`) in every existing row. Call it with a checkpoint written by a read, not by a
    failure (which may store the new figures beside the old schema)."""
    if not isinstance(stored, dict) or not isinstance(stored.get("columns"), dict):
        return []
    if stored.get("table") is not None and stored.get("table") != now.get("table"):
        return []  # the table made again: `made_again` reads every row again
    before: dict[str, Any] = stored["columns"]
    columns: dict[str, Any] = now.get("columns") or {}
    added = [c.column for c in step.applied if c.kind == "added"]
    return sorted(
        name for name in added if name in before and name in columns and _number(before[name]) == _number(columns[name])
    )


def _number(figures: Any) -> int:
    return int(figures[0]) if isinstance(figures, list) else int(figures)


def _altered(before: Any, now: Any) -> bool:
    """Its pg_attribute row was written again (figures stored without it compare as unaltered)."""
    return isinstance(before, list) and isinstance(now, list) and before[1:2] != now[1:2]


def retyped_values(step: SchemaStep) -> list[str]:
    """Columns whose type change this run applies and whose rewrite may have changed existing values (a lower
    timestamp precision rounds, timestamp to timestamptz reads each value in the session's time zone, a lower
    numeric scale rounds): PostgreSQL rewrote every row without moving its cursor, so those rows are read again.
    Changes that keep every value (`keeps_values`) read nothing again."""
    return sorted(
        c.column for c in step.applied if c.old is not None and c.new is not None and not keeps_values(c.old, c.new)
    )


def apply_to_target(step: SchemaStep, loader: Loader) -> list[str]:
    """Widen or re-type target columns whose type there changed; added and dropped ones need nothing. Whether a
    column's type there changes is judged by what the target holds (a domain lands as its base type, which its
    name in the stored schema does not tell). Then the step's plan lands each column as the target holds it."""
    plan = step.plan
    if plan is None:
        return []
    kind = loader.destination.type
    held = target_column_types(loader)
    typed = []
    if held:  # before the step's own changes are judged: what it finds joins them (and their reports)
        step.applied += held_otherwise(step, held, kind, lambda name: loader.names.column(name))
    for change in step.applied:
        if change.old is None or change.new is None:
            continue
        column = plan.shape.column(change.column)
        new_type = sql_type(kind, column)
        if held is None:  # a destination whose tables we do not read: the stored schema tells how it landed
            differs = sql_type(kind, _stored_column(change.column, change.old, kind)) != new_type
        else:
            existing = held.get(loader.names.column(change.column))
            differs = existing is None or not same_sql_type(existing, new_type)
        if differs:
            typed.append((change, new_type, column.arrow_type))
    done = loader.migrate(typed) if typed else []
    step.plan = fit_plan(plan, loader)
    return done


def held_otherwise(
    step: SchemaStep, held: dict[str, str], destination: str, target_name: Callable[[str], str]
) -> list[SchemaChange]:
    """Columns the target holds under another type than the source's column of that name has now, which the
    stored schema does not show as a type change: a column dropped (the target keeps it) and later added again
    with another type, a rename onto such a kept name, a schema lost with a checkpoint that kept none (a stream
    copied again or paused). The schema step sees an added column there, or none at all, and left it as it was,
    so every value the new type holds beyond the old one failed the load on every attempt. Judged as a type
    change from what the target holds. A target column that holds every value of the new type stays as it is (a
    target keeps the types it was created with, target_types.py), as does one whose type this cannot read as a
    PostgreSQL type; a text column stays unless the source's column is one every version landed natively."""
    assert step.plan is not None
    judged = {c.column for c in step.applied if c.old is not None and c.new is not None}
    found = []
    for column in step.plan.shape.columns:
        existing = held.get(target_name(column.name))
        stored = step.stored.get(column.name)
        if column.name in judged or existing is None or stored is None:
            continue
        if same_sql_type(existing, sql_type(destination, column)):
            continue
        old, new = held_column_type(existing), ColumnType(*(str(part) for part in stored[:3]))
        if old is None or (old.kind == new.kind and (old.kind != "numeric" or _typmod_of(new.sql_type) is None)):
            continue  # the same type landed as the destination spells it or chooses (unlimited numeric: DECIMAL(38,9))
        if old.kind == "text" and (new.base or new.kind not in _NATIVE):
            continue  # landed as text by versions before native types (target_types.py): it holds every value's text
        if old.kind != "text" and classify(new, old) in (None, "widened"):
            continue  # it holds every value of the new type (real landed as DOUBLE by older versions): it stays
        kind = classify(old, new)
        if kind is not None:
            note = f"the target held it as {existing} (a column of that name dropped or renamed before?)"
            found.append(SchemaChange(kind, column.name, old, new, note))
    return found


_HELD = {  # a target's spelling of a type -> PostgreSQL's typname (loading/migrate names history columns by it)
    "varchar": "text",
    "text": "text",
    "character varying": "text",
    "boolean": "bool",
    "smallint": "int2",
    "integer": "int4",
    "bigint": "int8",
    "real": "float4",
    "float": "float4",
    "double": "float8",
    "double precision": "float8",
    "decimal": "numeric",
    "numeric": "numeric",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz",
    "timestamptz": "timestamptz",
}


_NATIVE = set(_HELD.values()) - {"text"}  # what every version landed natively


def held_column_type(held: str) -> ColumnType | None:
    """A target column's type (DuckDB's or PostgreSQL's spelling) as the PostgreSQL type it holds, or None."""
    name, paren, rest = held.strip().lower().partition("(")
    type_name = _HELD.get(name.strip())
    if type_name is None or (paren and not rest.strip().endswith(")")):  # timestamp(3) with time zone: not read
        return None
    sql = "numeric" if type_name == "numeric" else "text" if type_name == "text" else name.strip()
    paren = "" if type_name == "text" else paren  # a limited varchar holds as much text as the column had
    return ColumnType(type_name, f"{sql}{paren}{rest.replace(' ', '')}" if paren else sql)


def _typmod_of(sql: str) -> str | None:
    return sql.partition("(")[2] or None


def _stored_column(name: str, column: ColumnType, destination: str) -> Column:
    """How a column of a stored schema landed, as far as the schema tells (a domain by its base type, whose
    limits it does not keep), for destinations whose tables are not read back."""
    typmod = -1
    if column.kind in _NUMERIC and "(" in column.sql_type:
        digits = [int(part) for part in column.sql_type.split("(")[-1].rstrip(")[]").split(",")]
        typmod = ((digits[0] << 16) | ((digits[1] if len(digits) > 1 else 0) & 0x7FF)) + 4
    element = PgType(column.kind[1:], typmod) if column.kind.startswith("_") else None
    pg = PgType(column.kind, -1 if element else typmod, element=element)
    return column_of(name, column.type_name, column.sql_type, True, pg, destination)


_NUMERIC = ("numeric", "_numeric")


def _paused_message(stream: PostgresTableStream, changes: list[SchemaChange]) -> str:
    listed = "; ".join(c.describe() for c in changes)
    fixable = not any(c.kind == "incompatible" and c.new is None for c in changes)  # a key column is gone
    kept = [f"`{c.column}__{c.old.type_name}`" for c in changes if c.kind == "incompatible" and c.old is not None]
    action = (
        f"to apply it run `ingest schema accept {stream.qualified_name}`"
        + (
            f" (the target keeps the old values in {', '.join(kept)} only until the run that applies it has read "
            "every row again, which leaves NULL there: copy the target first if you need them)"
            if kept
            else ""
        )
        + ", or fix the source"
        if fixable
        else "fix the catalog or the source: a key or cursor column cannot be accepted away"
    )
    return (
        f"stream {stream.qualified_name} is paused by a schema change (policy {stream.spec.schema_policy}): "
        f"{listed}. Its checkpoint is kept; {action}."
    )
