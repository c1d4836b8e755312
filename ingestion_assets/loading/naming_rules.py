"""dlt's two naming conventions (`snake_case`, `direct`), spelled out so a run that loads nothing needs no dlt.

Any `dlt.*` import runs dlt's package set-up (~0.7 s), and every stream names its target's columns before it
knows whether it loads. These functions give the names dlt's `NamingConvention.normalize_identifier` gives
(dlt 1.x: `dlt/common/normalizers/naming/{naming,snake_case,direct}.py`), shortening included;
`test_naming_rules` compares them with dlt's own on awkward names.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import re

_UNDERSCORES = re.compile("__+")
_LEADING_DIGITS = re.compile(r"^\d+")
_NON_ALPHANUMERIC = re.compile(r"[^a-zA-Z\d_]+")
_BREAK_1 = re.compile("([^_])([A-Z][a-z]+)")
_BREAK_2 = re.compile("([a-z0-9])([A-Z])")
_REDUCE_ALPHABET = str.maketrans("+-*@|", "x_xal")
_DIRECT_CLEANUP = str.maketrans("\n\r'\"▶", "_____")
_TAG_ALPHABET = bytes.maketrans(b"/+", b"ab")
_COLLISION_PROBABILITY = 0.001


@functools.lru_cache(maxsize=4096)
def normalize(convention: str, identifier: str, max_length: int | None) -> str:
    """The name `convention` gives `identifier` (a column, table or dataset) in a target of `max_length`."""
    stripped = identifier.strip()
    if not stripped:
        raise ValueError(f"the name {identifier!r} is empty or blank: no column or table can be named after it")
    if convention == "direct":
        return shorten(stripped.translate(_DIRECT_CLEANUP), stripped, max_length)
    if convention != "snake_case":
        raise ValueError(f"unknown naming convention {convention!r}")
    reduced = _NON_ALPHANUMERIC.sub("_", stripped.translate(_REDUCE_ALPHABET))
    return shorten(_snake_case(reduced), stripped, max_length)


def _snake_case(identifier: str) -> str:
    identifier = _BREAK_2.sub(r"\1_\2", _BREAK_1.sub(r"\1_\2", identifier)).lower()
    if _LEADING_DIGITS.match(identifier):
        identifier = "_" + identifier
    stripped = identifier.rstrip("_")
    stripped += "x" * (len(identifier) - len(stripped))  # trailing underscores become x
    return _UNDERSCORES.sub("_", stripped)


def shorten(normalized: str, identifier: str, max_length: int | None) -> str:
    """Past `max_length`: the middle is cut and a tag hashed from the original identifier put in its place."""
    if not max_length or len(normalized) <= max_length:
        return normalized
    size = int(((2 + 1) * math.log2(1 / _COLLISION_PROBABILITY) // 8) + 1)
    digest = hashlib.shake_128(identifier.encode("utf-8")).digest(size)
    tag = base64.b64encode(digest).rstrip(b"=").translate(_TAG_ALPHABET).lower().decode("ascii")
    remaining = max_length - len(tag)
    head = remaining // 2 + remaining % 2
    return normalized[:head] + tag + normalized[len(normalized) - remaining // 2 :]
