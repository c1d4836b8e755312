"""RFC 8288 `Link` headers: every link of every `Link` line, with its relation types as the RFC compares them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from ingestion_assets.sources.rest.errors import BadPayload


@dataclass(frozen=True)
class Link:
    target: str  # the URI reference between `<` and `>`, unresolved
    rels: frozenset[str]  # relation types, lower case (RFC 8288 3.3: compared case-insensitively)
    params: dict[str, str]  # every other parameter, by its lower-case name (the first of a name counts)


def parse_links(lines: list[str], where: str) -> list[Link]:
    """The links of the `Link` header lines, in order: `<uri>; name=value; name="quoted, value"`, separated by
    commas (which quoted values and URIs may hold). `rel="last next"` holds two relation types. A line that
    is not a list of links fails naming `where`: a next link misread would end the read early, unseen."""
    links: list[Link] = []
    for line in lines:
        links += _Scanner(line, where).links()
    return links


class _Scanner:
    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.at = text, where, 0

    def links(self) -> list[Link]:
        found: list[Link] = []
        while True:
            self._skip(" \t,")
            if self.at >= len(self.text):
                return found
            if self.text[self.at] != "<":
                self._fail("a link must start with <")
            close = self.text.find(">", self.at)
            if close < 0:
                self._fail("no > closes the link's URI")
            target = self.text[self.at + 1 : close].strip()
            self.at = close + 1
            params = self._params()
            rels = frozenset(r.lower() for r in params.pop("rel", "").split())
            found.append(Link(target, rels, params))

    def _params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        while True:
            self._skip(" \t")
            if self.at >= len(self.text) or self.text[self.at] == ",":
                return params
            if self.text[self.at] != ";":
                self._fail("expected ; or , after a link")
            self.at += 1
            self._skip(" \t")
            name = self._token().lower()
            self._skip(" \t")
            value = ""
            if self.at < len(self.text) and self.text[self.at] == "=":
                self.at += 1
                self._skip(" \t")
                value = self._quoted() if self.text[self.at : self.at + 1] == '"' else self._token()
            if name and name not in params:
                params[name] = value

    def _token(self) -> str:
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in ';,= \t"':
            self.at += 1
        return self.text[start : self.at]

    def _quoted(self) -> str:
        self.at += 1  # the opening quote
        out: list[str] = []
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == "\\" and self.at + 1 < len(self.text):
                out.append(self.text[self.at + 1])
                self.at += 2
                continue
            self.at += 1
            if char == '"':
                return "".join(out)
            out.append(char)
        self._fail("a quoted value is not closed")

    def _skip(self, chars: str) -> None:
        while self.at < len(self.text) and self.text[self.at] in chars:
            self.at += 1

    def _fail(self, why: str) -> NoReturn:
        raise BadPayload(
            f"{self.where}: the Link header {self.text[:200]!r} is not a list of links ({why} at character "
            f"{self.at}): its next-page link cannot be read"
        )
