"""Compare a stream's discovered columns with the last known ones and classify every change."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ChangeKind = Literal["added", "dropped", "widened", "incompatible"]

_INTEGER_DIGITS = {"int2": 5, "int4": 10, "int8": 19}
_INTEGER_RANK = {"int2": 0, "int4": 1, "int8": 2}
_TEXT = {"text", "varchar", "bpchar", "name", "citext"}
_TYPMOD = re.compile(r"\((\d+)(?:,(\d+))?\)")


@dataclass(frozen=True)
class ColumnType:
    type_name: str  # pg_type.typname: int4, numeric, varchar ...
    sql_type: str  # format_type(): numeric(12,2), character varying(20) ...
    base: str = ""  # a domain's base type (typname, domains resolved); "" when type_name is not a domain

    @property
    def kind(self) -> str:
        """What the values are: a change to or from a domain is judged by its base type."""
        return self.base or self.type_name


StoredSchema = dict[str, list[str]]  # column -> [type_name, sql_type(, base)], as kept with the stream's state


@dataclass(frozen=True)
class SchemaChange:
    kind: ChangeKind
    column: str
    old: ColumnType | None
    new: ColumnType | None
    note: str = ""

    def describe(self) -> str:
        old = self.old.sql_type if self.old else "-"
        new = self.new.sql_type if self.new else "-"
        text = {"added": f"column {self.column!r} added ({new})", "dropped": f"column {self.column!r} dropped ({old})"}
        base = text.get(self.kind, f"column {self.column!r} changed type {old} -> {new} ({self.kind})")
        return f"{base}{': ' + self.note if self.note else ''}"

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "column": self.column, "old": _sql(self.old), "new": _sql(self.new)}


def _sql(column: ColumnType | None) -> str | None:
    return column.sql_type if column else None


def parse_stored(stored: Mapping[str, Any] | None) -> dict[str, ColumnType] | None:
    if not stored:
        return None
    return {name: ColumnType(*(str(part) for part in value[:3])) for name, value in stored.items()}


def to_stored(columns: Mapping[str, ColumnType]) -> StoredSchema:
    return {name: [c.type_name, c.sql_type, *([c.base] if c.base else [])] for name, c in columns.items()}


def diff(old: Mapping[str, ColumnType], new: Mapping[str, ColumnType], key_columns: set[str]) -> list[SchemaChange]:
    """Every change from `old` to `new`; losing a key or cursor column is always incompatible."""
    changes: list[SchemaChange] = []
    for name, column in new.items():
        if name not in old:
            changes.append(SchemaChange("added", name, None, column))
        elif old[name] != column:
            kind = classify(old[name], column)
            if kind is not None:
                changes.append(SchemaChange(kind, name, old[name], column))
    for name, column in old.items():
        if name not in new:
            if name in key_columns:
                note = "it is a primary key or cursor column; fix the catalog or the source"
                changes.append(SchemaChange("incompatible", name, column, None, note))
            else:
                changes.append(SchemaChange("dropped", name, column, None))
    return changes


def classify(old: ColumnType, new: ColumnType) -> ChangeKind | None:
    """`widened` when every old value fits the new type exactly; None when nothing that matters changed. A domain
    counts as its base type (its limits are the source's to enforce: every value already met them)."""
    if old.sql_type == new.sql_type:
        return None
    if new.kind in _TEXT and _typmod(new)[0] is None:
        return "widened"  # unbounded text holds any value's text
    if old.kind == new.kind:
        return "widened" if _wider_same_type(old, new) else "incompatible"
    if {old.kind, new.kind} <= {"json", "jsonb"} or (old.kind in _TEXT and new.kind in _TEXT):
        old_limit, new_limit = _typmod(old)[0], _typmod(new)[0]
        fits = new_limit is None or (old_limit is not None and old_limit <= new_limit)  # text -> varchar(10) does not
        return "widened" if fits else "incompatible"
    if old.kind in _INTEGER_RANK:
        if new.kind in _INTEGER_RANK:
            return "widened" if _INTEGER_RANK[new.kind] > _INTEGER_RANK[old.kind] else "incompatible"
        if new.kind == "numeric":
            precision, scale = _typmod(new)
            fits = precision is None or precision - (scale or 0) >= _INTEGER_DIGITS[old.kind]
            return "widened" if fits else "incompatible"
        if new.kind == "float8" and old.kind != "int8":
            return "widened"
    if old.kind == "float4" and new.kind == "float8":
        return "widened"
    if old.kind == "date" and new.kind == "timestamp":
        return "widened"  # every date is a timestamp, at midnight (a time zone's would depend on the session's)
    return "incompatible"


_SAME_TEXT = {"text", "varchar"}  # bpchar is not: its cast to text or varchar drops the trailing blanks
_SAME_LIMITED = {"varchar", "timestamp", "timestamptz", "time", "timetz"}  # a larger limit keeps every value


def keeps_values(old: ColumnType, new: ColumnType) -> bool:
    """Whether PostgreSQL's rewrite of a column from `old` to `new` keeps every existing value as it was, so
    rows not read again already hold in the target what the source holds. Kept: the same type under another
    name (a domain and its base), text and varchar without a smaller limit, a larger limit of varchar or of
    the time types, integers to larger integers, numeric(p,s) to a larger p with the same s. Any other
    change (a limit lowered, a scale changed, timestamp to timestamptz, json to jsonb, anything to text, an
    integer to numeric or float) may rewrite values or their text: the rows are read again."""
    if old.sql_type == new.sql_type:
        return True
    old_limit, new_limit = _typmod(old), _typmod(new)
    if old.kind == new.kind and old_limit == new_limit:
        return True
    if old.kind in _SAME_TEXT and new.kind in _SAME_TEXT:
        return new_limit[0] is None or (old_limit[0] is not None and old_limit[0] <= new_limit[0])
    if old.kind == new.kind in _SAME_LIMITED:
        return new_limit[0] is None or (old_limit[0] is not None and old_limit[0] <= new_limit[0])
    if old.kind in _INTEGER_RANK and new.kind in _INTEGER_RANK:
        return _INTEGER_RANK[new.kind] >= _INTEGER_RANK[old.kind]
    if old.kind == new.kind == "numeric" and old_limit[0] is not None and new_limit[0] is not None:
        return (new_limit[1] or 0) == (old_limit[1] or 0) and new_limit[0] >= old_limit[0]
    return False


def _wider_same_type(old: ColumnType, new: ColumnType) -> bool:
    old_p, old_s = _typmod(old)
    new_p, new_s = _typmod(new)
    if new_p is None:
        return True  # numeric, varchar, timestamp without a limit: wider than any limited one
    if old_p is None:
        return False
    if old.kind == "numeric":
        return (new_s or 0) >= (old_s or 0) and new_p - (new_s or 0) >= old_p - (old_s or 0)
    return new_p >= old_p


def _typmod(column: ColumnType) -> tuple[int | None, int | None]:
    match = _TYPMOD.search(column.sql_type)
    if match is None:
        return None, None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else None
