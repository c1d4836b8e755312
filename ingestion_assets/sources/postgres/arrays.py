"""PostgreSQL's text of a one-dimensional array (`{1,NULL,"a b"}`), split into its elements' texts.

Only what a LIST holds is accepted: one dimension and the default lower bound 1. PostgreSQL does not enforce
an array column's declared dimensions, so any value may be multi-dimensional or carry its own bounds
(`[0:1]={1,2}`); such a value does not fit and the caller parks its row with the reason.
"""

from __future__ import annotations

import re

from ingestion_assets.sources.postgres.temporal import Unfit

# One element and the character after it: quoted (backslash escapes inside) or bare, then a comma or the end.
_ELEMENT = re.compile(r'(?:"((?:[^"\\]|\\.)*)"|([^,"{}\\]*))(,|$)', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def elements(text: str) -> list[str | None]:
    """The elements' texts, None for NULL (a quoted "NULL" is the four-letter string)."""
    if text.startswith("["):
        raise Unfit("is an array with explicit bounds, which a LIST cannot keep")
    if not (text.startswith("{") and text.endswith("}")):
        raise Unfit("is not an array PostgreSQL writes")
    body = text[1:-1]
    if not body:
        return []
    if body.startswith("{"):
        raise Unfit("is a multi-dimensional array; the column lands as one-dimensional LIST")
    if '"' not in body and "\\" not in body:  # the common case: numbers, dates, plain words
        return [None if part == "NULL" else part for part in body.split(",")]
    found: list[str | None] = []
    position = 0
    while True:
        match = _ELEMENT.match(body, position)
        if match is None or match.end() == position:
            raise Unfit("is not an array PostgreSQL writes")
        quoted, bare, separator = match.groups()
        if quoted is not None:
            found.append(_ESCAPE.sub(r"\1", quoted))
        else:
            found.append(None if bare == "NULL" else bare)
        position = match.end()
        if not separator:
            break
    if position != len(body):
        raise Unfit("is not an array PostgreSQL writes")
    return found
