"""Row-order comparisons in SQL with NULL lowest, as the stream orders its reads, on any side.

A row comparison `(a, b) <= (x, y)` is NULL when a value is NULL, while the stream sorts a NULL cursor
lowest; these helpers spell the comparison out so both dialects (and the in-process diff) agree.
"""

from __future__ import annotations

from collections.abc import Sequence

Op = str  # one of < <= > >=


def compare(columns: Sequence[tuple[str, bool]], values: Sequence[str | None], op: Op) -> str:
    """`(columns) op (values)` in lexicographic order; `columns` are (SQL, nullable), `values` SQL
    literals or None for NULL."""
    if len(columns) == 1:
        (column, nullable), value = columns[0], values[0]
        return _single(column, nullable, value, op)
    strict = _lt if op in ("<", "<=") else _gt
    terms = []
    for i, (column, nullable) in enumerate(columns):
        equal_before = [_eq(c, n, v) for (c, n), v in zip(columns[:i], values[:i], strict=True)]
        terms.append(_all([*equal_before, strict(column, nullable, values[i])]))
    if op in ("<=", ">="):
        terms.append(_all([_eq(c, n, v) for (c, n), v in zip(columns, values, strict=True)]))
    return "(" + " OR ".join(terms) + ")"


def columns_less(left: Sequence[str], right: Sequence[str]) -> str:
    """`(left) < (right)` between two rows' columns, any of which may be NULL (lowest)."""
    if not left:
        return "FALSE"
    terms = []
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        equal_before = [f"{x} IS NOT DISTINCT FROM {y}" for x, y in zip(left[:i], right[:i], strict=True)]
        terms.append(_all([*equal_before, f"({b} IS NOT NULL AND ({a} IS NULL OR {a} < {b}))"]))
    return "(" + " OR ".join(terms) + ")"


def columns_equal(left: Sequence[str], right: Sequence[str]) -> str:
    return _all([f"{a} IS NOT DISTINCT FROM {b}" for a, b in zip(left, right, strict=True)])


def _single(column: str, nullable: bool, value: str | None, op: Op) -> str:
    """One column: the plain comparison an index serves, NULL handled only where the column allows it."""
    if op == "<":
        return _lt(column, nullable, value)
    if op == ">":
        return _gt(column, nullable, value)
    if op == ">=":
        return "TRUE" if value is None else f"{column} >= {value}"
    if value is None:
        return _eq(column, nullable, None)
    return f"({column} IS NULL OR {column} <= {value})" if nullable else f"{column} <= {value}"


def _lt(column: str, nullable: bool, value: str | None) -> str:
    if value is None:
        return "FALSE"
    return f"({column} IS NULL OR {column} < {value})" if nullable else f"{column} < {value}"


def _gt(column: str, nullable: bool, value: str | None) -> str:
    if value is None:
        return f"{column} IS NOT NULL" if nullable else "TRUE"
    return f"{column} > {value}"


def _eq(column: str, nullable: bool, value: str | None) -> str:
    if value is None:
        return f"{column} IS NULL" if nullable else "FALSE"
    return f"{column} = {value}"


def _all(conditions: Sequence[str]) -> str:
    return "(" + " AND ".join(conditions) + ")" if conditions else "TRUE"
