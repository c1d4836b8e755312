"""Secret values this process resolved, and the one function that masks them in text quoted from elsewhere
(a server's error body, an exception's words) before it reaches a message, a log line or metadata; it also puts
back the reference a file we wrote came from (PEM text of an `env` reference), a name the user knows."""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, urlsplit

MASK = "***"
_MIN_LENGTH = 4  # shorter values would mask ordinary words
_known: set[str] = set()
_origins: dict[str, set[str]] = {}  # a file this process wrote -> the references whose value it holds
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


def remember_origin(path: Path, reference: str) -> None:
    """`path` holds the value of `reference` (e.g. `env:SHOP_KEY_PEM`): messages name the reference instead, as
    the user wrote it, not a temporary file they never saw."""
    _origins.setdefault(str(path), set()).add(reference)


def redact(text: str) -> str:
    """`text` with every file we wrote named by its reference, and every known secret, plain or encoded (a Basic
    header included), replaced by ***."""
    for path in sorted(_origins, key=len, reverse=True):
        if path in text:
            named = f"(the PEM text of {' or '.join(sorted(_origins[path]))})"
            text = re.sub(f'"?{re.escape(path)}"?', named.replace("\\", "\\\\"), text)
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
