"""Reading an answer's JSON body, telling a body cut off in transit from one that was never JSON."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import orjson

from ingestion_assets.sources.json_numbers import loads
from ingestion_assets.sources.redact import redact
from ingestion_assets.sources.rest.errors import NotJson

# A number with a fraction or an exponent where JSON puts values (after a key's `":`, a `[` or a `,`); text like
# that inside a string also matches (only costing the exact parse), a time such as "10:00:00.5" does not. Also an
# integer of 19 digits or more: orjson 3.13 reads one outside [-2**63, 2**64) as a double, without a word.
_FRACTION = re.compile(rb'(?:"\s*:|[\[,])\s*-?(?:[0-9]+[.eE]|[0-9]{19})')


class CutOff(Exception):
    """The body declared JSON ends mid-document: lost in transit (a proxy or server timeout), worth retrying."""


def parse_json(response: httpx.Response, where: str) -> Any:
    """The parsed body, its numbers exact; CutOff if it was cut short, NotJson (a BadPayload) if it is complete and
    still not JSON (the client retries both: an HTML maintenance page in the middle of a run is an outage).

    orjson reads the UTF-8 bytes as they came, at about a fifth of `json.loads`'s time, on the page reader's
    thread between one answer and the next request, but it reads every number with a point as a double (1.50 is
    1.5, a 19-digit amount loses digits), as it does an integer past 64 bits: a body with such numbers, and what
    orjson refuses (another encoding, NaN, or no JSON at all), goes through `json.loads` of the decoded text,
    numbers kept exact (`json_numbers.loads`), which also decides and explains what is not JSON."""
    content = response.content
    if _FRACTION.search(content) is None:
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            pass
    kind = response.headers.get("Content-Type") or "no Content-Type"
    text = response.text
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        if "json" in kind.lower() and _ends_early(exc, text):
            raise CutOff(
                f"the body ({kind}) was cut off: it ends mid-document after {len(response.content):,} bytes"
            ) from exc
        start = redact(" ".join(text[:80].split()))  # a page may echo a token sent to it
        raise NotJson(
            f"{where}: the answer (HTTP {response.status_code}, {kind}) is not JSON ({exc.msg} at character "
            f"{exc.pos}; it starts {start!r}); a maintenance or login page? If it persists, check the path and "
            "base URL",
            response.status_code,
        ) from exc


def _ends_early(error: json.JSONDecodeError, text: str) -> bool:
    """Whether the parser ran out of input, rather than meeting something that is not JSON: an unterminated
    string reaches the end by definition; any other error at the (trimmed) end is a document cut short."""
    return error.msg.startswith("Unterminated string") or error.pos >= len(text.rstrip())
