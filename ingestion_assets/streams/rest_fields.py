"""Checks of an API record's fields that decide whether it can load as sent: two field names that land in one
target column (one value would be written over the other), and the non-JSON numbers `NaN` and `Infinity` (dlt
would load them as NULL).

dlt names a record's columns itself: each key under the destination's naming convention (`Name` and `name` are
both `name` under snake_case; every name of only non-Latin letters is `x`), an object's keys flattened into
`parent__key` columns and a list's items into a child table `table__key`, down to `max_table_nesting` levels
(deeper objects and lists stay JSON, their keys as sent). Two distinct keys of one object (or of the objects
flattened into one row) that come out as one column reach dlt as one: the later value wins without a word.
`name_collision` walks a record as dlt's relational normalizer does (dlt 1.x, `normalizers/json/relational.py`,
`_flatten` and `_normalize_list`) and names the first such pair."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.loading.naming import TargetNames, reserved
from ingestion_assets.loading.naming_rules import normalize, shorten
from ingestion_assets.sources.json_numbers import json_text

_SEPARATORS = {"snake_case": "__", "direct": "▶"}  # dlt's path separator: `a__b` is the key `a`, below it `b`
_CACHED = 100_000  # names a walker remembers
_EMPTY = "_empty"  # dlt's name for an empty (or blank) key
_DLT = frozenset({"_dlt_id", "_dlt_parent_id", "_dlt_list_idx", "_dlt_root_id", "_dlt_load_id"})  # dlt writes them


@dataclass(frozen=True)
class _Row:
    """One row dlt makes of a record (or of a list's item): the names it has given out so far."""

    columns: dict[str, str] = field(default_factory=dict)  # folded column -> the field landing there (`a.b`)
    tables: dict[str, str] = field(default_factory=dict)  # folded child table -> the field whose items fill it


def name_collision(record: dict[str, Any], names: TargetNames, nesting: int, table: str) -> str | None:
    """Why the record cannot load as sent: two of its fields land as one column (or one list's items and another's
    in one child table), or a field lands as a column the product or dlt writes; None if each field has a column of
    its own. `nesting`: the stream's `max_table_nesting`; `table`: the stream's target table."""
    walker = _walker(names)
    if walker.remembered() > _CACHED:
        walker.forget()  # an API whose keys are data (ids as keys) must not grow the caches without end
    return walker.row(record, (walker.table(table),), "", nesting, top=True)


def non_finite_fields(value: Any, path: str = "") -> list[str]:
    """The dotted paths of the numbers in a record that are `NaN`, `Infinity` or `-Infinity`."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "."]
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += non_finite_fields(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += non_finite_fields(item, f"{path}[{index}]")
    return found


def raw_text(record: Any) -> str:
    """A record as JSON text for its dead letter: NaN and the infinities, which no target's JSON holds, written as
    the strings `"NaN"`, `"Infinity"`, `"-Infinity"`."""
    text = json_text(record)
    return json_text(_spelled(record)) if "NaN" in text or "Infinity" in text else text


def _spelled(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _spelled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_spelled(v) for v in value]
    return value


@functools.lru_cache(maxsize=16)
def _walker(names: TargetNames) -> _Walker:
    return _Walker(names)  # one per destination naming: its names, cached, serve every record


class _Walker:
    def __init__(self, names: TargetNames) -> None:
        self.names = names
        self.separator = _SEPARATORS[names.convention]
        self._keys: dict[str, str] = {}
        self._lists: dict[str, str] = {}
        self._paths: dict[tuple[str, ...], str] = {}
        self._columns: dict[tuple[tuple[str, ...], str, bool], tuple[str, str, bool]] = {}

    def remembered(self) -> int:
        return len(self._keys) + len(self._lists) + len(self._paths) + len(self._columns)

    def forget(self) -> None:
        self._keys.clear()
        self._lists.clear()
        self._paths.clear()
        self._columns.clear()

    def table(self, name: str) -> str:
        return self.names.table(name)

    def _fold(self, name: str) -> str:
        return name if self.names.case_sensitive else name.lower()

    def _key(self, key: str) -> str:
        """dlt's name for a key holding a value or an object: `_empty` for a blank one, else `_list_name`."""
        if (name := self._keys.get(key)) is None:
            name = self._keys[key] = _EMPTY if not key or key.isspace() else self._list_name(key)
        return name

    def _list_name(self, key: str) -> str:
        """dlt's name for a key: its separated parts each normalized, the whole shortened to the limit (a blank
        key holding a list has no name: `""`)."""
        if (name := self._lists.get(key)) is not None:
            return name
        parts = [
            normalize(self.names.convention, part, self.names.max_length)
            for part in key.split(self.separator)
            if part.strip()
        ]
        name = self._lists[key] = shorten(self.separator.join(parts), key, self.names.max_length)
        return name

    def _path(self, fragments: tuple[str, ...]) -> str:
        if (name := self._paths.get(fragments)) is None:
            joined = self.separator.join(f for f in fragments if f.strip())
            name = self._paths[fragments] = shorten(joined, joined, self.names.max_length)
        return name

    def row(
        self, record: dict[str, Any], table: tuple[str, ...], where: str, level: int, top: bool = False
    ) -> str | None:
        """Check one row (the record, or an item of a list) and, below it, the rows of its child tables."""
        row = _Row()
        lists: list[tuple[str, tuple[str, ...], list[Any], int]] = []
        stack: list[tuple[dict[str, Any], int, tuple[str, ...], str]] = [(record, level, (), where)]
        while stack:
            current, depth, path, shown = stack.pop()
            for key, value in current.items():
                if depth <= 0 or not isinstance(value, dict | list):  # most fields: a value in a column
                    column, folded, ours = self._column_of(path, key, top)
                    name = f"{shown}.{key}" if shown else key
                    if ours or folded in row.columns:
                        return self._column(row, column, name, top)
                    row.columns[folded] = name
                    continue
                name = f"{shown}.{key}" if shown else str(key)
                norm = self._key(str(key))
                if isinstance(value, dict):
                    stack.append((value, depth - 1, (*path, norm), name))
                    continue
                child = (*table, *path, self._list_name(str(key)))
                if problem := self._claim(row.tables, self._path(child), name, "child table"):
                    return problem
                lists.append((name, child, value, level - 1))  # dlt: the row's level, not the object's
        for name, child, items, depth in lists:
            if problem := self._items(name, child, items, depth):
                return problem
        return None

    def _column_of(self, path: tuple[str, ...], key: str, top: bool) -> tuple[str, str, bool]:
        """The column a value under `key` lands in, as compared, and whether it is one the product or dlt writes."""
        if (known := self._columns.get((path, key, top))) is None:
            norm = self._key(str(key))
            column = norm if not path else self._path((*path, norm))
            folded = self._fold(column)
            known = self._columns[(path, key, top)] = (column, folded, (top and reserved(column)) or folded in _DLT)
        return known

    def _items(self, name: str, child: tuple[str, ...], items: list[Any], depth: int) -> str | None:
        for item in items:
            if isinstance(item, dict):
                problem = self.row(item, child, f"{name}[]", depth)
            elif isinstance(item, list):  # dlt wraps a list in a list as the row {"list": [...]}
                problem = self.row({"list": item}, child, f"{name}[]", depth - 1)
            else:
                problem = None
            if problem:
                return problem
        return None

    def _column(self, row: _Row, column: str, name: str, top: bool) -> str | None:
        if (top and reserved(column)) or self._fold(column) in _DLT:
            return (
                f"field {name!r} lands as column {column!r}, a column the product or dlt writes itself (its value "
                "would be lost); rename the field at the source"
            )
        return self._claim(row.columns, column, name, "column")

    def _claim(self, seen: dict[str, str], target: str, name: str, kind: str) -> str | None:
        """Each field of a row is met once: a target name met before is a second field landing there."""
        first = seen.setdefault(self._fold(target), name)
        if first is name:
            return None
        if self.names.convention != "direct":
            fix = "; or set `destination.naming: direct` in the catalog to keep field names as sent"
        elif not self.names.case_sensitive and first.lower() == name.lower():
            fix = " (this destination does not tell names apart by case, whatever the naming)"
        else:
            fix = ""
        where = "land as" if kind == "column" else "both fill"
        return (
            f"fields {first!r} and {name!r} {where} {kind} {target!r} under the destination's naming "
            f"{self.names.convention!r}{'' if self.names.case_sensitive else ' (names compared without case)'}: "
            f"one value would be written over the other: the API must send them under names that stay apart{fix}"
        )
