"""ISO 8601 timestamps finer than a microsecond, rounded to the microsecond as PostgreSQL rounds them on input."""

from __future__ import annotations

import datetime as dt
import re
from decimal import ROUND_HALF_EVEN, Decimal

# The seconds' fraction past six digits, and what stands around it (the date and time before, a zone after).
_FINE = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)\.(\d{7,})(Z|[+-]\d\d(?::?\d\d(?::?\d\d)?)?)?$")


def to_microseconds(text: str) -> str | None:
    """`text` rounded to the microsecond (None when it has no digit past the sixth, or is no timestamp): the
    nearest, a tie to even, as PostgreSQL's input does (`rint` of the fraction in microseconds); .9999995 and up
    carry into the next second, and so on up to the year. Python, and so dlt, would cut the digits instead, a
    microsecond early. None also when rounding passes year 9999 (the value is left to fail as it would)."""
    found = _FINE.match(text)
    if found is None:
        return None
    head, digits, zone = found.group(1), found.group(2), found.group(3) or ""
    micro = int((Decimal("0." + digits) * 1_000_000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    try:
        moment = dt.datetime.fromisoformat(head + zone) + dt.timedelta(microseconds=micro)
    except (ValueError, OverflowError):
        return None
    rounded = moment.isoformat(timespec="microseconds")
    return rounded[: -len("+00:00")] + "Z" if zone == "Z" and rounded.endswith("+00:00") else rounded
