"""Dates and numbers in file paths (`dt={date}/`, `year={year}/month={month}/`, `shard={key}/`): the moment or
key a file belongs to, which decides the partition that reads it."""

from __future__ import annotations

import datetime as dt
import re
from functools import lru_cache

_TOKEN = re.compile(r"\{(\w+)\}")
_GROUPS = {
    "date": r"(?P<date>\d{4}-\d{2}-\d{2})",
    "year": r"(?P<year>\d{4})",
    "month": r"(?P<month>\d{1,2})",
    "day": r"(?P<day>\d{1,2})",
    "hour": r"(?P<hour>\d{1,2})",
    "key": r"(?P<key>-?\d+)",
}


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    """The pattern as a regular expression: its text literal, each {token} a group; it may match anywhere in
    the path, but only at the start of a path segment (dt={date}/ does not match xdt=...)."""
    pieces: list[str] = []
    for index, piece in enumerate(_TOKEN.split(pattern)):
        pieces.append(_GROUPS[piece] if index % 2 else re.escape(piece))
    return re.compile(r"(?:^|/)" + "".join(pieces))


def path_moment(pattern: str, path: str) -> dt.datetime | None:
    """The UTC moment a path names, or None when the pattern does not match it (or names no real date)."""
    match = _compiled(pattern).search(path)
    if match is None:
        return None
    found = match.groupdict()
    try:
        if found.get("date"):
            day = dt.date.fromisoformat(found["date"])
        else:
            day = dt.date(int(found["year"]), int(found.get("month") or 1), int(found.get("day") or 1))
        return dt.datetime.combine(day, dt.time(int(found.get("hour") or 0)), tzinfo=dt.UTC)
    except ValueError:  # month 13, hour 25: not a moment
        return None


def path_number(pattern: str, path: str) -> int | None:
    """The integer a path names at {key}, or None when the pattern does not match it."""
    match = _compiled(pattern).search(path)
    return int(match.group("key")) if match is not None else None
