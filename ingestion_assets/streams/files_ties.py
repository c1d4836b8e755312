"""Files whose rows' versions tie on the modified time and share a key: which of them holds the newer value is
unknown, so the run says so instead of deciding silently.

S3 (and other object stores) keep modified times in whole seconds: two uploads within one second carry the same
time, and the merge orders them by path, not by upload order. Only the keys of files of one moment are kept and
compared (files are read in time order), so a run without ties compares nothing and reads nothing twice."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class SameMomentKeys:
    """Fed each file's rows as they are read; `found` names each pair of files of one moment sharing a key."""

    key: tuple[str, ...]  # the stream's primary key (empty: rows are keyed by their own file, nothing to tie)
    found: list[str] = field(default_factory=list)
    _moment: dt.datetime | None = None
    _keys: dict[str, pa.Table] = field(default_factory=dict)  # file -> its distinct keys (as text), for `_moment`
    _pairs: set[tuple[str, str]] = field(default_factory=set)

    def add(self, table: pa.Table | None, relative: str, moment: dt.datetime) -> None:
        if not self.key or table is None or not table.num_rows or not set(self.key) <= set(table.column_names):
            return
        if moment != self._moment:
            self._moment, self._keys = moment, {}
        mine = _distinct_keys(table, self.key)
        for other, theirs in self._keys.items():
            if other != relative and (other, relative) not in self._pairs:
                shared = theirs.join(mine, list(self.key), join_type="inner")
                if shared.num_rows:
                    self._pairs.add((other, relative))
                    self.found.append(f"{other} and {relative} (key {_describe(shared.slice(0, 1), self.key)})")
        before = self._keys.get(relative)
        self._keys[relative] = mine if before is None else pa.concat_tables([before, mine])


def _distinct_keys(table: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """Keys as text (a column typed differently in two files still matches) without repeats."""
    texts = pa.table({name: pc.cast(table.column(name), pa.string()) for name in key})
    return texts.group_by(list(key)).aggregate([])


def _describe(row: pa.Table, key: tuple[str, ...]) -> str:
    values = row.to_pylist()[0]
    return ", ".join(f"{name}={values[name]}" for name in key)
