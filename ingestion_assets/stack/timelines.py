"""Which timeline held Dagster's storage at a given time, and which base backups lie on its history.

Every restore and promotion starts a new timeline; the archive keeps them all (`<TLI>.history` files list a
timeline's parents and where it branched off). Recovery that follows the newest timeline would replay a
later restore's history: restoring to T1 after a restore to an earlier T0 would stop on T0's branch and hold
T0's state. A restore instead recovers onto the timeline that was current at the target time: the newest one
created (its history file archived) at or before it."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from ingestion_assets.stack.recovery import RestoreRefused
from ingestion_assets.stack.standby_check import lsn

HISTORY = re.compile(r"^([0-9A-F]{8})\.history$")


@dataclass(frozen=True)
class Timeline:
    tli: int
    created_at: dt.datetime | None  # None: the first timeline, there from the start
    parents: tuple[tuple[int, int], ...]  # (parent timeline, position where this history left it), oldest first

    def holds(self, tli: int, position: int) -> bool:
        """Is WAL position `position` of timeline `tli` part of this timeline's history?"""
        if tli == self.tli:
            return True
        return any(parent == tli and position < switch for parent, switch in self.parents)


def timelines(wal: Path) -> list[Timeline]:
    found = [Timeline(1, None, ())]
    for path in sorted(wal.glob("*.history")):
        match = HISTORY.match(path.name)
        if match is None:
            continue
        parents = []
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and not line.startswith("#"):
                parents.append((int(fields[0]), lsn(fields[1])))
        created = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
        found.append(Timeline(int(match.group(1), 16), created, tuple(parents)))
    return found


def timeline_at(wal: Path, to: dt.datetime) -> Timeline:
    """The timeline that was current at `to`: the newest one created at or before it."""
    floor = dt.datetime.min.replace(tzinfo=dt.UTC)
    earlier = [line for line in timelines(wal) if (line.created_at or floor) <= to]
    return max(earlier, key=lambda line: (line.created_at or floor, line.tli))


def backup_position(data: Path) -> tuple[int, int]:
    """(timeline, WAL position) where a base backup starts, from the backup_label pg_basebackup wrote."""
    try:
        label = (data / "backup_label").read_text()
        where = re.search(r"^START WAL LOCATION: ([0-9A-F]+/[0-9A-F]+)", label, re.MULTILINE)
        tli = re.search(r"^START TIMELINE: (\d+)", label, re.MULTILINE)
        if where is None or tli is None:
            raise ValueError("no START WAL LOCATION / START TIMELINE")
        return int(tli.group(1)), lsn(where.group(1))
    except (OSError, ValueError) as exc:
        raise RestoreRefused(f"cannot tell which timeline the base backup {data} is on ({exc})") from exc


def recovered_from(data: Path, new_tli: int) -> int | None:
    """The timeline a finished recovery branched off (the last line of its new timeline's history file)."""
    try:
        lines = [line for line in (data / "pg_wal" / f"{new_tli:08X}.history").read_text().splitlines() if line]
    except FileNotFoundError:
        return None
    return int(lines[-1].split()[0]) if lines else None
