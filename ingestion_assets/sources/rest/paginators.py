"""Paginators: how one read walks an endpoint's pages, and how it notices a server going round in circles."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import httpx

from ingestion_assets.sources.rest.errors import ApiError, BadPayload, NotFound, PaginationLoop
from ingestion_assets.sources.rest.links import Link, parse_links

logger = logging.getLogger(__name__)

Params = dict[str, str | int]


def json_path(body: Any, path: str) -> Any:
    """The value at a dotted path (`data`, `result.items`); the body itself for an empty path; None if absent."""
    for part in filter(None, path.split(".")):
        body = body.get(part) if isinstance(body, dict) else None
    return body


def absent_key(body: Any, path: str) -> tuple[dict[str, Any], str] | None:
    """Where a dotted path breaks off because an object lacks the key: (that object, the key). None when the
    path is there (its value may be null) or runs into a null or a non-object (a value, not a missing key)."""
    for part in filter(None, path.split(".")):
        if not isinstance(body, dict):
            return None
        if part not in body:
            return body, part
        body = body[part]
    return None


def _folded(name: str) -> str:
    """A key as a typo of it would spell it too: case, `_` and `-` ignored (`nextCursor`, `next_cursor`)."""
    return name.lower().replace("_", "").replace("-", "")


class Paginator(ABC):
    """One read's walk through pages: `request()` for the next one, `advance()` with its response and parsed body.

    `token` is what fetches the next page (a cursor, a URL, a page number or an offset) and can be
    stored to `resume()` a read. A token, or a whole page, seen twice raises PaginationLoop.
    """

    # A listing by position (page number, offset, a link built from them): a record changing during the read
    # moves and shifts the records after it across page boundaries (`incremental.ShiftWatch` looks for it).
    shifts = False

    def __init__(self, page_size: int, stream: str = "") -> None:
        self.page_size = page_size
        self.stream = stream  # for messages: the stream the pages feed ("" standalone)
        self.has_more = True
        self.token: str | None = None
        self.largest = 0  # records on the largest page of this read before the current one: the server's cap
        self.doubt: str | None = None  # why the end may not be the end (a key listing retires nothing on it)
        self._seen: set[str] = set()
        self._last_page: list[Any] = []
        self._pages = 0  # pages with records taken in

    def request(self, path: str, params: Params) -> tuple[str, Params | None]:
        """URL and query parameters of the next request (None: the URL carries them)."""
        return (path, {**params, **self.first_params()}) if self.token is None else self.next_request(path, params)

    def advance(self, response: httpx.Response, body: Any, records: list[Any]) -> list[Any]:
        """Take in a page; the records it adds to the read (none when it repeats the page before as the end)."""
        # The same records in the same order. Compared, not hashed: two different pages differ in their first
        # record, so this costs microseconds, where hashing the page's text cost ~0.5 ms on every request.
        if records and records == self._last_page:
            if self.repeat_ends():
                self.end()
                return []
            raise PaginationLoop(
                f"{_where(response)}: the API returned the same page twice; stopping the read{self.loop_hint()}"
            )
        self._pages += bool(records)
        self._last_page = list(records)
        token = self.next_token(response, body, records)
        self.largest = max(self.largest, len(records))
        if token is not None and token in self._seen:
            if not records:  # an empty last page echoing its token: the end, as an empty page is
                self.end()
                return records
            raise PaginationLoop(
                f"{_where(response)}: the API returned page token {token[:80]!r} again after "
                f"{len(self._seen)} pages; stopping instead of reading forever (a server bug: report it)"
            )
        self.has_more, self.token = token is not None, token
        if token is not None:
            self._seen.add(token)
        return records

    def repeat_ends(self) -> bool:
        """Whether a page served again right after itself is the end (an API clamping page numbers)."""
        return False

    def resume(self, token: str) -> None:
        self.token = token
        self._seen.add(token)

    def ends_with(self, error: ApiError) -> bool:
        """Whether the error answering the next page's request says there is no such page: the end, not a
        failure (a page past the last that a server answers 404, as Django REST framework's do)."""
        return False

    def end(self) -> None:
        """The pages ended without a page that says so (`ends_with`)."""
        self.has_more, self.token = False, None

    def loop_hint(self) -> str:
        return ""

    def place(self, response: httpx.Response) -> str:
        """Where a message about this page is from: the stream (when known) and the request."""
        return f"stream {self.stream}: {_where(response)}" if self.stream else _where(response)

    def first_params(self) -> Params:
        return {}

    @abstractmethod
    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None: ...

    @abstractmethod
    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]: ...


def _where(response: httpx.Response) -> str:
    return f"{response.request.method} {response.request.url.copy_with(query=None)}"


class CursorTokenPaginator(Paginator):
    """An opaque token in the body (`next_cursor`), sent back as a parameter; null, empty or absent ends the read.

    An absent key is the end only when nothing suggests `token_path` is misspelled: when the object lacks the
    key but holds one spelled the same ignoring case, `_` and `-` (`nextCursor` for `next_cursor`), the read
    fails, naming both; when it lacks the key on a full page (as many records as `page_size` or as the largest
    page before it), the end is logged as a warning.
    """

    def __init__(
        self,
        page_size: int,
        size_param: str = "limit",
        token_path: str = "next_cursor",
        token_param: str = "cursor",
        stream: str = "",
    ) -> None:
        super().__init__(page_size, stream)
        self.size_param, self.token_path, self.token_param = size_param, token_path, token_param

    def first_params(self) -> Params:
        return {self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        token = json_path(body, self.token_path)
        if token is None and (absent := absent_key(body, self.token_path)) is not None:
            self._absent(response, records, *absent)
        return str(token) if token not in (None, "") else None

    def _absent(self, response: httpx.Response, records: list[Any], holder: dict[str, Any], key: str) -> None:
        where = self.place(response)
        keys = sorted(str(k) for k in holder)
        shown = f"{keys[:20]}{' ...' if len(keys) > 20 else ''}"
        near = sorted(k for k in keys if k != key and _folded(k) == _folded(key))
        if near:
            raise BadPayload(
                f"{where}: pagination.token_path {self.token_path!r}: the body has no key {key!r} but has "
                f"{near[0]!r} (its keys: {shown}); a misspelt token_path would end every read after its first "
                f"page: set token_path to the key that holds the next page's token"
            )
        if records and len(records) >= min(self.page_size, self.largest or self.page_size):
            self.doubt = f"pagination.token_path {self.token_path!r} is not in the body of a full page (keys: {shown})"
            logger.warning(
                "%s: pagination.token_path %r is not in the body (its keys: %s) of a full page (%d records): taken "
                "as the last page; if the API has more, token_path names the wrong key",
                where,
                self.token_path,
                shown,
                len(records),
            )

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, **self.first_params(), self.token_param: self.token}


class LinkHeaderPaginator(Paginator):
    """RFC 8288 `Link: <url>; rel="next"`; the URL is followed as given (relative to the request), on the same
    origin only. Relation types compare case-insensitively, one of several (`rel="last next"`), on any `Link`
    line. A page without a next link whose `last` link names another page fails: the read would end early."""

    shifts = True

    def __init__(self, page_size: int, size_param: str = "limit", rel: str = "next", stream: str = "") -> None:
        super().__init__(page_size, stream)
        self.size_param, self.rel = size_param, rel.lower()

    def first_params(self) -> Params:
        return {self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        links = parse_links(response.headers.get_list("link"), self.place(response))
        link = next((x.target for x in links if self.rel in x.rels), None)
        if link is None:
            self._no_next(response, links, records)
            return None
        target = response.request.url.join(link)
        here = response.request.url
        if (target.scheme, target.host, target.port) != (here.scheme, here.host, here.port):
            raise ApiError(
                f"{_where(response)}: the next-page link points to {target.host}; not sending credentials there"
            )
        return str(target)

    def _no_next(self, response: httpx.Response, links: list[Link], records: list[Any]) -> None:
        """A full page without a Link header after linked pages is an end in doubt. A full page without a next
        link whose `last` link names another page fails: a next link under a
        relation type not followed (`rel="following"`) would end every read after its first page. The first page
        whose `last` link is its `first` one is a single page (GitLab links both, with `page=1`)."""
        full = bool(records) and len(records) >= min(self.page_size, self.largest or self.page_size)
        if full and not links and self.token is not None:
            # a full page after pages with next links, and no Link header at all: a last page usually still links
            # to the first or previous one, so the header may have been lost (a proxy): the end is in doubt
            self.doubt = "a full page came without a Link header after pages that had one"
            logger.warning("%s: %s; taken as the last page, its position short of it", self.place(response), self.doubt)
        here = response.request.url
        last = next((here.join(x.target) for x in links if "last" in x.rels), None)
        first = next((here.join(x.target) for x in links if "first" in x.rels), None)
        if last is None or not full or _same_page(last, here):
            return
        if self.token is None and first is not None and _same_page(last, first):
            return
        raise BadPayload(
            f"{self.place(response)}: the Link header has no rel={self.rel!r} link but names a last page "
            f"({last.copy_with(query=None, fragment=None)}, with its own query) other than this full page: ending "
            "here would skip the pages between; the API's Link header is inconsistent (report it), or its next "
            "link uses another relation type"
        )

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return self.token, None


def _same_page(one: httpx.URL, other: httpx.URL) -> bool:
    """The same resource and the same query parameters, in any order."""
    return (one.copy_with(query=None, fragment=None) == other.copy_with(query=None, fragment=None)) and sorted(
        one.params.multi_items()
    ) == sorted(other.params.multi_items())


class _CountedPages(Paginator):
    """Page and offset pagination: the body says nothing of the end, so the end is an empty page (or a 404
    for a page after the first). A short page is no proof: APIs cap the page size below what was asked
    (GitHub's per_page at 100) or filter a page after cutting it, so it costs one request more per read."""

    shifts = True
    position_param = ""  # the query parameter the token goes in, for messages

    def ends_with(self, error: ApiError) -> bool:
        return isinstance(error, NotFound) and self.token is not None

    def repeat_ends(self) -> bool:
        """An API clamping the page number (or offset) past the end serves its last page again. That is the end
        once the read has had two different pages (the parameter is honoured); a repeat of the first page may be
        an API ignoring the parameter, and ending there would skip every page after it."""
        if self._pages < 2:
            return False
        logger.info(
            "stream %s: %s=%s answered with the records of the page before: the API clamps past its last page; the end",
            self.stream or "(standalone)",
            self.position_param,
            self.token,
        )
        return True

    def loop_hint(self) -> str:
        asked = f"{self.position_param}={self.token}"
        return (
            f" ({asked} answered with the records of the page before, after no other page: the API clamps the page "
            "number past a single page, or ignores the page parameter: check page_param or offset_param; use "
            "pagination style single if it answers everything at once)"
        )


class PageNumberPaginator(_CountedPages):
    """`page=1, 2, ...` with the page size in `size_param`; an empty page is the end."""

    def __init__(
        self,
        page_size: int,
        size_param: str = "per_page",
        page_param: str = "page",
        first_page: int = 1,
        stream: str = "",
    ) -> None:
        super().__init__(page_size, stream)
        self.size_param, self.page_param, self.first_page = size_param, page_param, first_page
        self.position_param = page_param
        self._capped = False  # said that the API serves fewer records a page than asked

    def first_params(self) -> Params:
        return {self.page_param: self.first_page, self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        if not records:
            return None
        current = int(self.token) if self.token is not None else self.first_page
        if 0 < self.largest < self.page_size and not self._capped:  # records after a short page: a capped size
            self._capped = True
            logger.warning(
                "%s: the API serves %d records a page where page_size asks for %d: read on to an empty page. "
                "An API numbering its pages by the size asked, not the size served, would skip records: set "
                "page_size to %d",
                self.place(response),
                self.largest,
                self.page_size,
                self.largest,
            )
        return str(current + 1)

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, self.page_param: int(self.token), self.size_param: self.page_size}


class OffsetPaginator(_CountedPages):
    """`offset` and `limit`, the next offset past the records received; an empty page is the end. Rows that
    change during the read shift the offsets."""

    def __init__(
        self, page_size: int, size_param: str = "limit", offset_param: str = "offset", stream: str = ""
    ) -> None:
        super().__init__(page_size, stream)
        self.size_param, self.offset_param = size_param, offset_param
        self.position_param = offset_param
        logger.warning(
            "offset pagination: rows inserted, updated or deleted during the read shift the offsets, so rows "
            "can be skipped or read twice; prefer a cursor pagination if the API has one"
        )

    def first_params(self) -> Params:
        return {self.offset_param: 0, self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        if not records:
            return None
        return str((int(self.token) if self.token is not None else 0) + len(records))

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, self.offset_param: int(self.token), self.size_param: self.page_size}


class AfterIdPaginator(Paginator):
    """Stripe's lists: `starting_after=<id of the page's last record>`, while the body's `has_more` is true.

    The body must say `has_more` (true or false): a missing flag would end every read after its first page
    unseen, so it fails naming the body's keys; so does `has_more: true` on an empty page or a last record
    without a usable id (there is no page after it to ask for). Stripe lists newest first: a read's checkpoints
    before its end then stay at its start (`ServedOrder`), and a stopped read is read again, never skipped.
    """

    def __init__(
        self,
        page_size: int,
        size_param: str = "limit",
        after_param: str = "starting_after",
        has_more_path: str = "has_more",
        id_field: str = "id",
        stream: str = "",
    ) -> None:
        super().__init__(page_size, stream)
        self.size_param, self.after_param = size_param, after_param
        self.has_more_path, self.id_field = has_more_path, id_field

    def first_params(self) -> Params:
        return {self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        flag = json_path(body, self.has_more_path)
        setting = f"pagination.has_more_path {self.has_more_path!r}"
        if not isinstance(flag, bool):
            keys = sorted(str(k) for k in body) if isinstance(body, dict) else []
            found = "is not in the body" if flag is None else f"is {flag!r}, not true or false"
            raise BadPayload(
                f"{self.place(response)}: {setting} {found} (its keys: {keys[:20]}): without it the end of the list "
                "is unknown; set has_more_path to the key that says whether more pages follow"
            )
        if not flag:
            return None
        last = records[-1] if records else None
        value = last.get(self.id_field) if isinstance(last, dict) else None
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            what = "the page is empty" if last is None else f"its last record's {self.id_field!r} is {value!r}"
            raise BadPayload(
                f"{self.place(response)}: {setting} is true but {what}: no page after it can be asked for with "
                f"{self.after_param}; check pagination.id_field"
            )
        return str(value)

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, **self.first_params(), self.after_param: self.token}


class SinglePage(Paginator):
    """The endpoint answers with everything at once."""

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        return None

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        return path, params


@dataclass(frozen=True)
class PaginationSpec:
    """Which paginator an endpoint uses and its parameter names; `make()` builds a fresh one per read."""

    style: str = "cursor"  # cursor | link | page | offset | after_id | single
    size_param: str = "limit"
    token_path: str = "next_cursor"  # cursor: where the body holds the next token
    token_param: str = "cursor"  # cursor: the query parameter that sends it back
    page_param: str = "page"
    first_page: int = 1
    offset_param: str = "offset"
    after_param: str = "starting_after"  # after_id: the parameter carrying the last record's id
    has_more_path: str = "has_more"  # after_id: where the body says whether more pages follow
    id_field: str = "id"  # after_id: the record field whose value `after_param` sends
    stream: str = ""  # for messages: the stream the pages feed

    def make(self, page_size: int) -> Paginator:
        if self.style == "cursor":
            return CursorTokenPaginator(page_size, self.size_param, self.token_path, self.token_param, self.stream)
        if self.style == "link":
            return LinkHeaderPaginator(page_size, self.size_param, stream=self.stream)
        if self.style == "page":
            return PageNumberPaginator(page_size, self.size_param, self.page_param, self.first_page, self.stream)
        if self.style == "offset":
            return OffsetPaginator(page_size, self.size_param, self.offset_param, self.stream)
        if self.style == "after_id":
            return AfterIdPaginator(
                page_size, self.size_param, self.after_param, self.has_more_path, self.id_field, self.stream
            )
        if self.style == "single":
            return SinglePage(page_size, self.stream)
        raise ValueError(f"pagination style {self.style!r} is not one of cursor, link, page, offset, after_id, single")
