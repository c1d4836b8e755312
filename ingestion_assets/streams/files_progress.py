"""Where a file stream stands: the newest file read (modified_at, path), the fingerprints of the files read that
nothing else knows, and the file a run stopped inside. It rides in the checkpoint as the position.

Which files were read is known exactly, from two places, never guessed from a file's modified time:
- `seen`: the fingerprint (modified time, size, etag) of every file read within `lookback_seconds` of the newest
  one, and of every older file still listed whose rows the target no longer holds (a keyed daily snapshot whose
  keys all came again in the next one, an empty file, a file parked whole) or whose content (size and etag) another
  listed file has (a copy: deleted, its rows move to that file, files_deletes.py);
- the target's `_ingest_file` column: an older file whose rows the target holds was read (its fingerprint leaves
  `seen` once it is older than the window, at the end of a run (`settle`), so the checkpoint grows with the
  listing's files that hold no rows, and within a run with the files it read, not with every file ever read).
A file neither knows is due, whatever its modified time: a file renamed or copied keeping an old time (`mv`,
`cp -p`, `rsync -t`) is read, and said so (`unknown`). A file in the window is due when its fingerprint is not the
one read (new, late, or rewritten in place). An older file whose rows the target holds is taken as read even if
rewritten (its old fingerprint is gone): the README says so. The window is anchored on the newest file read but
never later than the run's clock: a file stamped in the future (a wrong clock) would otherwise push every file
written now out of the window, their rewrites unseen (`future` names such files; the run warns). A due file whose
content (size and etag) was read under another name still in `seen` (a copy, or a move: copy and delete) is a
copy, not news: its rows keep the version (modified time and path) of that first read (`origin`), else they would
win over the files read after the original and bring back its old values.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.sources.files import FileInfo, Resume

SKEW = dt.timedelta(minutes=5)  # a modified time further ahead of the run's clock is a wrong clock: said


@dataclass
class Progress:
    newest: tuple[str, str] | None = None  # (modified_at ISO, path) of the newest file read
    seen: dict[str, list[Any]] = field(default_factory=dict)  # path -> fingerprint (see the module's docstring)
    partial: dict[str, Any] | None = None  # {"path", "fingerprint", "rows", "bad"}: a file read in part
    unknown: list[str] = field(default_factory=list)  # due older than the window, known to neither place
    future: list[str] = field(default_factory=list)  # listed with a modified time ahead of the run's clock
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))  # the run's clock
    origin: dict[str, tuple[str, str]] = field(default_factory=dict)  # due copy -> (modified time, path) first read
    gone: dict[str, list[Any]] = field(default_factory=dict)  # read before, no longer listed: path -> fingerprint

    @classmethod
    def of(cls, position: dict[str, Any] | None) -> Progress:
        if not position:
            return cls()
        newest = (str(position["modified_at"]), str(position["path"])) if position.get("modified_at") else None
        return cls(newest, {k: list(v) for k, v in (position.get("seen") or {}).items()}, position.get("partial"))

    def position(self) -> dict[str, Any]:
        modified_at, path = self.newest or (None, None)
        partial = dict(self.partial) if self.partial else None
        return {"modified_at": modified_at, "path": path, "seen": dict(self.seen), "partial": partial}

    def due(
        self, files: list[FileInfo], name: dict[str, str], lookback_seconds: float, held: Callable[[], set[str]]
    ) -> list[FileInfo]:
        """Files not read yet (or changed since), in (modified_at, path) order; a file read in part first. `name`:
        every listed file's path under the url; `held()`: the files the target holds live rows of (asked only
        when a file older than the window is listed without its fingerprint)."""
        self.origin = self._origins(files, name)  # before a moved file's original leaves `seen`
        if name:  # a file the listing no longer shows leaves: put back, it is read again
            self.gone = {k: v for k, v in self.seen.items() if k not in set(name.values())}
            self.seen = {k: v for k, v in self.seen.items() if k in set(name.values())}
        self.future = sorted(name[f.path] for f in files if f.modified_at > self.now + SKEW)
        horizon = self._horizon(lookback_seconds)
        old = {name[f.path] for f in files if horizon is not None and f.modified_at < horizon} - set(self.seen)
        target = held() if old else set()
        self.unknown = sorted(old - target)
        read = old & target  # older than the window, no fingerprint: read if the target holds its rows
        due = [f for f in files if self.seen.get(name[f.path]) != f.fingerprint and name[f.path] not in read]
        partial = self.partial
        if partial is not None:
            due.sort(key=lambda f: (name[f.path] != partial["path"], f.order))
        return due

    def _origins(self, files: list[FileInfo], name: dict[str, str]) -> dict[str, tuple[str, str]]:
        first: dict[tuple[int, str], list[tuple[str, str]]] = {}  # (size, etag) -> [(modified time, path)] read
        for path, (moment, size, etag) in self.seen.items():
            if etag:
                first.setdefault((int(size), str(etag)), []).append((str(moment), path))
        partial = self.partial or {}
        origin = {}
        for f in files:
            earlier = [(m, p) for m, p in first.get((f.size, f.etag or ""), []) if p != name[f.path]]
            if partial.get("origin") and partial["path"] == name[f.path] and partial["fingerprint"] == f.fingerprint:
                moment, path = partial["origin"]  # a copy read in part: its original may have left `seen`
                earlier.append((str(moment), str(path)))
            read = min(earlier, key=lambda v: (dt.datetime.fromisoformat(v[0]), v[1]), default=None)
            if read is not None and (dt.datetime.fromisoformat(read[0]), read[1]) < (f.modified_at, name[f.path]):
                origin[name[f.path]] = read
        return origin

    def version(self, relative: str, info: FileInfo) -> tuple[dt.datetime, str]:
        """(modified time, path) of a file's rows' versions: a copy of content read before carries that read's."""
        moment, path = self.origin.get(relative, (info.modified_at.isoformat(), relative))
        return dt.datetime.fromisoformat(moment), path

    def resume(self, relative: str, info: FileInfo) -> Resume:
        partial = self.partial
        if partial is None or partial["path"] != relative or partial["fingerprint"] != info.fingerprint:
            return Resume()
        if int(partial.get("bad", 0)) and partial.get("numbers") != "records":
            return Resume()  # counted before a bad CSV line kept its number: the file is read again from its start
        return Resume(int(partial["rows"]), int(partial.get("bad", 0)))

    def inside(self, relative: str, info: FileInfo, rows: int, bad: int) -> None:
        self.partial = {"path": relative, "fingerprint": info.fingerprint, "rows": rows, "bad": bad}
        self.partial["numbers"] = "records"  # rows: the number of the last record read, bad ones counted
        if relative in self.origin:
            self.partial["origin"] = list(self.origin[relative])

    def done(self, relative: str, info: FileInfo) -> None:
        """The file is read to its end (or parked): remember it and move the newest. Fingerprints that left the
        window are forgotten only by `settle`, which asks the target then: a file's rows may all be superseded by
        a newer file read later in the same run, and a fingerprint forgotten too early would read it again."""
        self.partial = None
        self.seen[relative] = info.fingerprint
        moment = (info.modified_at.isoformat(), relative)
        if self.newest is None or (dt.datetime.fromisoformat(moment[0]), moment[1]) > self._newest_order():
            self.newest = moment

    def settle(self, listed: set[str], held: Callable[[], set[str]], lookback_seconds: float) -> dict[str, Any]:
        """The position a run ends with: only listed files (if the listing found any), and an older fingerprint only
        for a file whose rows the target does not hold now (`held()`, asked only if there is one) or whose content
        (size and etag) another listed file has: a copy's rows move to its twin when it is deleted (files_deletes),
        which needs the deleted file's content known then."""
        if listed:
            self.seen = {k: v for k, v in self.seen.items() if k in listed}
        horizon = self._horizon(lookback_seconds)
        if self._aged(horizon):
            kept = held()
            assert horizon is not None
            contents = Counter((int(v[1]), str(v[2])) for v in self.seen.values() if v[2])
            self.seen = {
                k: v
                for k, v in self.seen.items()
                if k not in kept
                or dt.datetime.fromisoformat(v[0]) >= horizon
                or (v[2] and contents[(int(v[1]), str(v[2]))] > 1)
            }
        return self.position()

    def moved(self) -> list[str]:
        """Files gone from the listing whose fingerprint (modified time, size, etag) a file read to its end in this
        run has: renamed (`mv` keeps the time), their content read again under the new name."""
        read = {tuple(fingerprint) for path, fingerprint in self.seen.items() if path not in self.gone}
        return sorted(path for path, fingerprint in self.gone.items() if tuple(fingerprint) in read)

    def _aged(self, horizon: dt.datetime | None) -> bool:
        return horizon is not None and any(dt.datetime.fromisoformat(v[0]) < horizon for v in self.seen.values())

    def _newest_order(self) -> tuple[dt.datetime, str]:
        assert self.newest is not None
        return dt.datetime.fromisoformat(self.newest[0]), self.newest[1]

    def _horizon(self, lookback_seconds: float) -> dt.datetime | None:
        if self.newest is None:
            return None
        anchor = min(dt.datetime.fromisoformat(self.newest[0]), self.now)
        return anchor - dt.timedelta(seconds=lookback_seconds)
