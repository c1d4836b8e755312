"""A `numeric` without limits travels as its text: that text as text whose byte order is the value order.

'9.5' > '10' as text, 9.5 < 10 as numbers: every comparison of such a value (a row's version in the version guard,
the reconciliation's diff) compares this text instead, made in Python or, the same bytes, in SQL that DuckDB and
PostgreSQL (under COLLATE "C") both run, so a target written with the raw text is compared right as it is.
"""

from __future__ import annotations

from decimal import Decimal

EXPONENT_OFFSET = 500_000  # above any numeric's decimal exponent (131072 digits before the point, 16383 after)
_SPECIAL = {"-Infinity": "0", "Infinity": "4", "NaN": "5"}


def number_order(text: str) -> str:
    """A numeric's text as text whose byte order is PostgreSQL's order of the values: -Infinity, negatives,
    zero, positives, Infinity, NaN; within a sign by decimal exponent, then digits (the same value in any
    scale gets one text: 1.0 and 1.00 order alike)."""
    if text in _SPECIAL:
        return _SPECIAL[text]
    value = Decimal(text)
    if value.is_zero():
        return "2"
    digits = "".join(str(d) for d in value.as_tuple().digits).rstrip("0")
    exponent = value.adjusted()
    if value > 0:
        return f"3{exponent + EXPONENT_OFFSET:07d}{digits}"
    flipped = "".join(str(9 - int(d)) for d in digits)
    return f"1{EXPONENT_OFFSET - exponent:07d}{flipped}:"  # ':' sorts above digits: -1.51 before -1.5


def number_order_sql(text: str) -> str:
    """number_order as SQL over the text expression `text` (PostgreSQL's numeric output: no exponent, no '+'),
    the same in DuckDB and PostgreSQL; NULL stays NULL. PostgreSQL compares the result with COLLATE "C"."""
    text = f"CAST({text} AS VARCHAR)"  # a PostgreSQL destination's own numeric column prints the same text
    magnitude = f"ltrim({text}, '-')"
    digits = f"replace({magnitude}, '.', '')"
    significant = f"ltrim({digits}, '0')"  # from the first non-zero digit
    exponent = f"(length(split_part({magnitude}, '.', 1)) - 1 - (length({digits}) - length({significant})))"
    kept = f"rtrim({significant}, '0')"
    positive = f"'3' || lpad(CAST({exponent} + {EXPONENT_OFFSET} AS VARCHAR), 7, '0') || {kept}"
    flipped = f"translate({kept}, '0123456789', '9876543210')"
    negative = f"'1' || lpad(CAST({EXPONENT_OFFSET} - {exponent} AS VARCHAR), 7, '0') || {flipped} || ':'"
    special = " ".join(f"WHEN '{name}' THEN '{order}'" for name, order in _SPECIAL.items())
    return (
        f"(CASE {text} {special} ELSE CASE WHEN {significant} = '' THEN '2' "
        f"WHEN left({text}, 1) = '-' THEN {negative} ELSE {positive} END END)"
    )


def ordered_position(expr: str, numeric: bool) -> str:
    """A version column as the guard compares it: numeric text by its value, any other as it is."""
    return number_order_sql(expr) if numeric else expr

