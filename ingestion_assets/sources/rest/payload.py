"""Reading an answer's JSON body, telling a body cut off in transit from one that was never JSON."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson

from ingestion_assets.sources.rest.errors import BadPayload


class CutOff(Exception):
    """The body declared JSON ends mid-document: lost in transit (a proxy or server timeout), worth retrying."""


def parse_json(response: httpx.Response, where: str) -> Any:
    """The parsed body; CutOff if it was cut short, BadPayload if it is complete and still not JSON.

    orjson reads the UTF-8 bytes as they came, at about a fifth of `json.loads`'s time, on the page reader's
    thread between one answer and the next request. What it refuses (another encoding, NaN, integers over
    64 bits, or no JSON at all) goes through `json.loads` of the decoded text, which decides and explains."""
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        pass
    kind = response.headers.get("Content-Type") or "no Content-Type"
    text = response.text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if "json" in kind.lower() and _ends_early(exc, text):
            raise CutOff(
                f"the body ({kind}) was cut off: it ends mid-document after {len(response.content):,} bytes"
            ) from exc
        start = " ".join(text[:60].split())
        raise BadPayload(
            f"{where}: the answer is not JSON ({kind}; {exc.msg} at character {exc.pos}; it starts {start!r}); "
            "check the path and base URL (a login or error page?)",
            response.status_code,
        ) from exc


def _ends_early(error: json.JSONDecodeError, text: str) -> bool:
    """Whether the parser ran out of input, rather than meeting something that is not JSON: an unterminated
    string reaches the end by definition; any other error at the (trimmed) end is a document cut short."""
    return error.msg.startswith("Unterminated string") or error.pos >= len(text.rstrip())
