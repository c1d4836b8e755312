"""Where a file stream stands: the newest file read (modified_at, path), the fingerprints of the files read
within the lookback window, and the file a run stopped inside. It rides in the checkpoint as the position.

Late files: a file is due when its fingerprint (modified time, size, etag) is not among those read, as long
as its modified time is within `lookback_seconds` of the newest file read. So a file copied in late with an
older time, or rewritten in place (new size or etag, even with its old time), is read; a file older than the
window is taken as read (listing and diffing every file ever seen would grow the checkpoint without bound).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.sources.files import FileInfo, Resume


@dataclass
class Progress:
    newest: tuple[str, str] | None = None  # (modified_at ISO, path) of the newest file read
    seen: dict[str, list[Any]] = field(default_factory=dict)  # path -> fingerprint, within the window
    partial: dict[str, Any] | None = None  # {"path", "fingerprint", "rows", "bad"}: a file read in part

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

    def due(self, files: list[FileInfo], name: dict[str, str], lookback_seconds: float) -> list[FileInfo]:
        """Files not read yet (or changed since), in (modified_at, path) order; a file read in part first."""
        horizon = self._horizon(lookback_seconds)
        due = [
            f
            for f in files
            if self.seen.get(name[f.path]) != f.fingerprint and (horizon is None or f.modified_at >= horizon)
        ]
        partial = self.partial
        if partial is not None:
            due.sort(key=lambda f: (name[f.path] != partial["path"], f.order))
        return due

    def resume(self, relative: str, info: FileInfo) -> Resume:
        partial = self.partial
        if partial is None or partial["path"] != relative or partial["fingerprint"] != info.fingerprint:
            return Resume()
        return Resume(int(partial["rows"]), int(partial.get("bad", 0)))

    def inside(self, relative: str, info: FileInfo, rows: int, bad: int) -> None:
        self.partial = {"path": relative, "fingerprint": info.fingerprint, "rows": rows, "bad": bad}

    def done(self, relative: str, info: FileInfo, lookback_seconds: float) -> None:
        """The file is read to its end (or parked): remember it, move the newest, forget what left the window."""
        self.partial = None
        self.seen[relative] = info.fingerprint
        moment = (info.modified_at.isoformat(), relative)
        if self.newest is None or (dt.datetime.fromisoformat(moment[0]), moment[1]) > self._newest_order():
            self.newest = moment
        horizon = self._horizon(lookback_seconds)
        if horizon is not None:
            self.seen = {k: v for k, v in self.seen.items() if dt.datetime.fromisoformat(v[0]) >= horizon}

    def _newest_order(self) -> tuple[dt.datetime, str]:
        assert self.newest is not None
        return dt.datetime.fromisoformat(self.newest[0]), self.newest[1]

    def _horizon(self, lookback_seconds: float) -> dt.datetime | None:
        if self.newest is None:
            return None
        return dt.datetime.fromisoformat(self.newest[0]) - dt.timedelta(seconds=lookback_seconds)
