"""Target column names: the destination's naming convention applied to source names, collisions refused.

dlt renames every column it loads (snake_case by default: `Order ID` becomes `order_id`). Our own SQL on
the target (version guard, reconciliation, deletions, migrations) must use the same names, and two source
columns that land under one name, or a source column named like one of ours, must stop the stream with
a message instead of silently merging two columns into one.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ingestion_assets.loading.metadata_columns import DELETED_AT, EXTRACTED_AT, GENERATION, META, POSITION
from ingestion_assets.loading.naming_rules import normalize

CONVENTIONS = ("snake_case", "direct")
METADATA_COLUMNS = (EXTRACTED_AT, POSITION, GENERATION, DELETED_AT, META)  # every target table has them
# Columns the product or dlt writes itself: a source column of that name would be overwritten.
RESERVED = frozenset(
    {EXTRACTED_AT, POSITION, GENERATION, DELETED_AT, META, "_ingest_raw", "_ingest_problems"}
    | {"_dlt_id", "_dlt_load_id", "_dlt_parent_id", "_dlt_root_id", "_dlt_list_idx"}
)
OURS_PREFIX = "_ingest_"  # every column the product writes, now or in a later version, is named so


def reserved(name: str) -> bool:
    """A column name the product keeps for itself: one of RESERVED, or any under its own prefix (a name it does
    not write today, `_ingest_lsn`, may be one it writes tomorrow)."""
    return name in RESERVED or name.lower().startswith(OURS_PREFIX)


class NameCollision(ValueError):
    """Source columns that cannot land under distinct target names; the message says what to rename."""

    transient = False


class TooManyColumns(NameCollision):
    """More source columns, with the product's own, than a table of the destination can hold."""


@functools.lru_cache(maxsize=8)
def _convention(name: str, max_length: int | None) -> Any:
    module = importlib.import_module(f"dlt.common.normalizers.naming.{name}")
    return module.NamingConvention(max_length=max_length)


@dataclass(frozen=True)
class TargetNames:
    convention: str = "snake_case"
    max_length: int | None = None  # the destination's identifier limit (PostgreSQL: 63)
    case_sensitive: bool = True  # DuckDB folds case: `Order` and `order` are one column there
    max_columns: int | None = None  # the destination's columns per table (PostgreSQL: 1,600)
    destination: str = "the destination"  # its name in messages

    def column(self, name: str) -> str:
        """The name dlt gives this source column in the target (dlt's convention, without importing dlt)."""
        return normalize(self.convention, name, self.max_length)

    def naming_convention(self) -> Any:
        """dlt's naming convention object these names follow (imports dlt: for dlt's own clients)."""
        return _convention(self.convention, self.max_length)

    def table(self, name: str) -> str:
        """The name dlt gives a table or dataset (schema) of this name in the target."""
        return normalize(self.convention, name, self.max_length)

    def columns(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.column(name) for name in names)

    def _collide_under_direct(self, first: str, second: str) -> bool:
        direct = TargetNames("direct", self.max_length, self.case_sensitive)
        names = [direct.column(first), direct.column(second)]
        return len({n if self.case_sensitive else n.lower() for n in names}) == 1

    def _apart_only_by_case(self, first: str, second: str) -> bool:
        direct = TargetNames("direct", self.max_length, True)
        names = (direct.column(first), direct.column(second))
        return names[0] != names[1] and names[0].lower() == names[1].lower()

    def check(self, where: str, source_columns: Iterable[str], views: bool = True) -> None:
        """Refuse columns that would land under one name, or under a name the product writes itself, and more
        columns than a target table can hold. `views`: the stream could read a view that renames or leaves them
        out (CDC reads tables only)."""
        source_columns = tuple(source_columns)
        self._check_width(where, len(source_columns), views)
        seen: dict[str, str] = {}
        for name in source_columns:
            target = self.column(name)
            folded = target if self.case_sensitive else target.lower()
            if reserved(target) or reserved(name):
                raise NameCollision(
                    f"{where}: source column {name!r} lands as {target!r}, a column the product writes itself "
                    f"(metadata or dlt's): rename the source column{_view_fix('it') if views else ''}"
                )
            if folded in seen:
                if self.convention != "direct" and not self._collide_under_direct(seen[folded], name):
                    fix = "; or set `destination.naming: direct` in the catalog to keep source names exactly"
                elif not self.case_sensitive and self._apart_only_by_case(seen[folded], name):
                    fix = " (this destination does not tell names apart by case, whatever the naming convention)"
                else:
                    fix = ""
                raise NameCollision(
                    f"{where}: source columns {seen[folded]!r} and {name!r} both land as column {target!r} under "
                    f"the destination's naming convention {self.convention!r}; rename one of them in the source"
                    f"{_view_fix('one') if views else ''}{fix}"
                )
            seen[folded] = name

    def _check_width(self, where: str, count: int, views: bool) -> None:
        ours = len(METADATA_COLUMNS)
        if self.max_columns is None or count + ours <= self.max_columns:
            return
        raise TooManyColumns(
            f"{where}: {count} source columns and the product's {ours} ({', '.join(METADATA_COLUMNS)}) make "
            f"{count + ours} target columns, more than the {self.max_columns} a table of {self.destination} can "
            + (
                f"hold: stream a view of at most {self.max_columns - ours} of its columns (`table: schema.view` "
                "reads a view as it reads a table)"
                if views
                else "hold: a CDC stream reads the whole table; take the stream out of the CDC source's catalog"
            )
        )


def _view_fix(which: str) -> str:
    return f", or stream a view that renames {which} (`table: schema.view` reads a view as it reads a table)"
