"""Files whose rows' versions tie on the modified time and share a key: which of them holds the newer value is
unknown, so the run says so instead of deciding silently.

S3 (and other object stores) keep modified times in whole seconds: two uploads within one second carry the same
time, and the merge orders them by path, not by upload order. Only the key columns of the files of one moment are
kept (files are read in time order; at most KEPT_KEYS rows of them) and compared only when a second file of that
moment comes, so a run without ties compares nothing and reads nothing twice."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

KEPT_KEYS = 1_000_000  # key rows kept of one moment's files (a huge file's keys are not all held in memory)


@dataclass
class SameMomentKeys:
    """Fed each file's rows as they are read; `found` names each pair of files of one moment sharing a key."""

    key: tuple[str, ...]  # the stream's primary key (empty: rows are keyed by their own file, nothing to tie)
    found: list[str] = field(default_factory=list)
    _moment: dt.datetime | None = None
    _keys: dict[str, list[pa.Table]] = field(default_factory=dict)  # file -> its key columns, for `_moment`
    _kept: int = 0
    _pairs: set[tuple[str, str]] = field(default_factory=set)

    def add(self, table: pa.Table | None, relative: str, moment: dt.datetime) -> None:
        if not self.key or table is None or not table.num_rows or not set(self.key) <= set(table.column_names):
            return
        if moment != self._moment:
            self._moment, self._keys, self._kept = moment, {}, 0
        mine = table.select(list(self.key))
        others = [(other, keys) for other, keys in self._keys.items() if other != relative]
        for other, keys in others:
            if (other, relative) not in self._pairs:
                self._compare(other, keys, relative, mine)
        if self._kept + mine.num_rows <= KEPT_KEYS:
            self._keys.setdefault(relative, []).append(mine)
            self._kept += mine.num_rows

    def _compare(self, other: str, theirs: list[pa.Table], relative: str, mine: pa.Table) -> None:
        shared = _distinct_keys(pa.concat_tables(theirs, promote_options="permissive"), self.key).join(
            _distinct_keys(mine, self.key), list(self.key), join_type="inner"
        )
        if shared.num_rows:
            self._pairs.add((other, relative))
            self.found.append(f"{other} and {relative} (key {_describe(shared.slice(0, 1), self.key)})")


def _distinct_keys(table: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """Keys as text (a column typed differently in two files still matches) without repeats."""
    texts = pa.table({name: pc.cast(table.column(name), pa.string()) for name in key})
    return texts.group_by(list(key)).aggregate([])


def _describe(row: pa.Table, key: tuple[str, ...]) -> str:
    values = row.to_pylist()[0]
    return ", ".join(f"{name}={values[name]}" for name in key)
