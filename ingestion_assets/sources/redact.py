"""Secret values this process resolved, and the one function that masks them in text quoted from elsewhere
(a server's error body, an exception's words) before it reaches a message, a log line or metadata."""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import quote, quote_plus, unquote, urlsplit

MASK = "***"
_MIN_LENGTH = 4  # shorter values would mask ordinary words
_known: set[str] = set()
_BASIC = re.compile(r"(?i)(basic\s+)([A-Za-z0-9+/=_-]{8,})")


def remember(value: str) -> None:
    """Register a secret value (and its URL- and base64-encoded forms) so `redact` masks it from now on."""
    if len(value) < _MIN_LENGTH:
        return
    _known.update(
        {value, quote(value, safe=""), quote_plus(value), base64.b64encode(value.encode()).decode().rstrip("=")}
    )


def remember_resolved(value: str) -> None:
    """A value resolved from an env var or a secret file: a URL's password only (its host and path are what
    messages name), anything else whole."""
    if "://" not in value:
        remember(value)
        return
    try:
        password = urlsplit(value).password
    except ValueError:
        return
    if password:
        remember(unquote(password))


def redact(text: str) -> str:
    """`text` with every known secret, plain or encoded (a Basic header included), replaced by ***."""
    if not _known:
        return text
    text = _BASIC.sub(_basic, text)
    for secret in sorted(_known, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _basic(match: re.Match[str]) -> str:
    try:
        decoded = base64.b64decode(match.group(2) + "==", validate=False).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return match.group(0)
    return match.group(1) + MASK if any(secret in decoded for secret in _known) else match.group(0)
