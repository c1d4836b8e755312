"""Log sequence numbers: PostgreSQL's 'X/Y' text form and the 64-bit integer behind it."""

from __future__ import annotations

import re

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
MAX_LSN = (1 << 64) - 1


def parse_lsn(text: str) -> int:
    """'16/B374D848' -> 0x16B374D848; raises ValueError naming the text if it is not an LSN."""
    match = _LSN.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a PostgreSQL LSN; expected two hex numbers like '16/B374D848'")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(value: int) -> str:
    """0x16B374D848 -> '16/B374D848' (the low half zero-padded, as PostgreSQL 18 prints it)."""
    if not 0 <= value <= MAX_LSN:
        raise ValueError(f"{value} is outside the LSN range 0..2**64-1")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:08X}"


def to_lsn(value: int | str | None) -> int:
    """Accept either form (None means 0, 'from the slot's confirmed position')."""
    if value is None:
        return 0
    if isinstance(value, int):
        format_lsn(value)  # range check
        return value
    return parse_lsn(value)
