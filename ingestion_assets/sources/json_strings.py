"""Strings JSON can write that no target can store as text: a lone surrogate escape (`"\\ud800"`, half of a UTF-16
pair) parses into a Python string no encoder takes, and Arrow (so every load) failed on it. Readers of JSON (JSON
lines files, API answers) find such values and park their record naming where."""

from __future__ import annotations

import re
from typing import Any

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # in JSON text: only a record holding one is walked


def lone_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """Which string of `value` (at `path`) holds a lone surrogate, and its code point."""
    if isinstance(value, str):
        code = _surrogate_in(value)
        return None if code is None else (f"the value of {path!r}" if path else "the value", code)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        inner = f"{path}.{name}" if path else str(name)
        if isinstance(name, str) and (code := _surrogate_in(name)) is not None:
            return f"the key {inner!r}", code
        if (found := lone_surrogate(item, inner)) is not None:
            return found
    return None


def surrogate_problem(found: tuple[str, int]) -> str:
    where, code = found
    return (
        f"invalid text: {where} holds the escape \\u{code:04x}, half of a UTF-16 surrogate pair without its other "
        "half: no character, so no target can store it as text"
    )


def _surrogate_in(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ord(text[exc.start])
    return None
