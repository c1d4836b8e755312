"""Dates, times and timestamps between PostgreSQL's text and Arrow's integers, for the values Arrow's own
parser does not read: ±infinity, BC dates, years past 9999 and the time 24:00:00.

Arrow counts days (date32) and microseconds (time64, timestamp) from 1970-01-01 in the proleptic Gregorian
calendar, as PostgreSQL does (year 0 is 1 BC). DuckDB stores infinity as the largest integer of the type
and -infinity as its negation, and reads those integers back as infinity from Arrow and Parquet.
"""

from __future__ import annotations

import re

DATE_INFINITY = 2**31 - 1
TIMESTAMP_INFINITY = 2**63 - 1
LATEST_TIMESTAMP = TIMESTAMP_INFINITY - 1  # 294247-01-10 04:00:54.775806 UTC, DuckDB's latest finite instant
US_PER_DAY = 86_400_000_000
# Every destination's rows travel as Arrow slices: the limit is the load's, a PostgreSQL target would hold more.
LATER_THAN_CARRIED = (
    "is later than the latest timestamp the load carries (294247-01-10 04:00:54.775806 UTC: microseconds in 64 bits, "
    "as Arrow and DuckDB keep them), whatever the destination"
)
TEMPORAL = frozenset({"date", "time", "timestamp", "timestamptz"})

_VALUE = re.compile(
    r"(?P<y>\d{4,})-(?P<mo>\d\d)-(?P<d>\d\d)"
    r"(?:[ T](?P<time>\d\d:\d\d:\d\d(?:\.\d{1,6})?))?"
    r"(?P<tz>[+-]\d\d(?::?\d\d(?::?\d\d)?)?)?"
    r"(?P<bc> BC)?"
)
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


class Unfit(ValueError):
    """A value the target type cannot hold; the message says why (the caller names column and value)."""


def parse(text: str, kind: str) -> int:
    """Days (date) or microseconds (time, timestamp, timestamptz) of PostgreSQL's text of a value, as COPY or
    row_to_json print it under DateStyle ISO and TimeZone UTC."""
    if kind == "time":
        return _time_of_day(text)
    if text in ("infinity", "-infinity"):
        infinity = DATE_INFINITY if kind == "date" else TIMESTAMP_INFINITY
        return infinity if text == "infinity" else -infinity
    match = _VALUE.fullmatch(text)
    if match is None:
        raise Unfit(f"is not a {kind} PostgreSQL writes")
    year = int(match["y"])
    days = days_from_civil(1 - year if match["bc"] else year, int(match["mo"]), int(match["d"]))
    if kind == "date":
        return days
    micros = days * US_PER_DAY + (_time_of_day(match["time"]) if match["time"] else 0) - _offset(match["tz"])
    if micros > LATEST_TIMESTAMP:
        raise Unfit(LATER_THAN_CARRIED)
    return micros


def needs_parse(text: str, kind: str) -> bool:
    """Whether Arrow's CSV reader would fail on this text (the rare value; everything else it parses)."""
    if kind == "time":
        return text.startswith("24:")
    return text.endswith(("infinity", " BC")) or text.find("-") > 4


def format_value(value: int, kind: str) -> str:
    """PostgreSQL's text for Arrow's integer of a value; PostgreSQL reads it back to the identical value."""
    if kind == "time":
        return _clock(value)
    infinity = DATE_INFINITY if kind == "date" else TIMESTAMP_INFINITY
    if abs(value) == infinity:
        return "infinity" if value > 0 else "-infinity"
    days, micros = divmod(value, US_PER_DAY) if kind != "date" else (value, 0)
    year, month, day = civil_from_days(days)
    text = f"{year if year > 0 else 1 - year:04d}-{month:02d}-{day:02d}"
    if kind != "date":
        text += " " + _clock(micros) + ("+00" if kind == "timestamptz" else "")
    return text + ("" if year > 0 else " BC")


def sortable(value: int, unit: int) -> str:
    """Text of a date (unit 1: days) or timestamp (unit US_PER_DAY: microseconds) outside years 1 to 9999 whose
    string order is the value order, below (`!`) or above (`~`) every four-digit ISO year."""
    if abs(value) in (DATE_INFINITY, TIMESTAMP_INFINITY):
        return "~~" if value > 0 else "!!"
    days, micros = divmod(value, unit)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(micros, 1_000_000)
    clock = f"T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{fraction:06d}" if unit > 1 else ""
    prefix = f"~{year:07d}" if year > 0 else f"!{year + 10000:05d}"
    return f"{prefix}-{month:02d}-{day:02d}{clock}"


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 0 is 1 BC)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of days_from_civil."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + (3 if shifted_month < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


def _time_of_day(text: str) -> int:
    match = _TIME.fullmatch(text)
    if match is None:
        raise Unfit("is not a time of day PostgreSQL writes")
    hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3])
    return ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int((match[4] or "").ljust(6, "0"))


def _offset(zone: str | None) -> int:
    if not zone:
        return 0
    digits = zone[1:].replace(":", "")
    seconds = int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60 + int(digits[4:6] or 0)
    return (seconds if zone[0] == "+" else -seconds) * 1_000_000


def _clock(micros: int) -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{fraction:06d}".rstrip("0") if fraction else "")
