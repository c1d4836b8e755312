"""Paginators: how one read walks an endpoint's pages, and how it notices a server going round in circles."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import httpx

from ingestion_assets.sources.rest.errors import ApiError, PaginationLoop

logger = logging.getLogger(__name__)

Params = dict[str, str | int]


def json_path(body: Any, path: str) -> Any:
    """The value at a dotted path (`data`, `result.items`); the body itself for an empty path; None if absent."""
    for part in filter(None, path.split(".")):
        body = body.get(part) if isinstance(body, dict) else None
    return body


class Paginator(ABC):
    """One read's walk through pages: `request()` for the next one, `advance()` with its response and parsed body.

    `token` is what fetches the next page (a cursor, a URL, a page number or an offset) and can be
    stored to `resume()` a read. A token, or a whole page, seen twice raises PaginationLoop.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.has_more = True
        self.token: str | None = None
        self._seen: set[str] = set()
        self._last_page: list[Any] = []

    def request(self, path: str, params: Params) -> tuple[str, Params | None]:
        """URL and query parameters of the next request (None: the URL carries them)."""
        return (path, {**params, **self.first_params()}) if self.token is None else self.next_request(path, params)

    def advance(self, response: httpx.Response, body: Any, records: list[Any]) -> None:
        # The same records in the same order. Compared, not hashed: two different pages differ in their first
        # record, so this costs microseconds, where hashing the page's text cost ~0.5 ms on every request.
        if records and records == self._last_page:
            raise PaginationLoop(f"{_where(response)}: the API returned the same page twice; stopping the read")
        self._last_page = list(records)
        token = self.next_token(response, body, records)
        if token is not None and token in self._seen:
            raise PaginationLoop(
                f"{_where(response)}: the API returned page token {token[:80]!r} again after "
                f"{len(self._seen)} pages; stopping instead of reading forever (a server bug: report it)"
            )
        self.has_more, self.token = token is not None, token
        if token is not None:
            self._seen.add(token)

    def resume(self, token: str) -> None:
        self.token = token
        self._seen.add(token)

    def first_params(self) -> Params:
        return {}

    @abstractmethod
    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None: ...

    @abstractmethod
    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]: ...


def _where(response: httpx.Response) -> str:
    return f"{response.request.method} {response.request.url.copy_with(query=None)}"


class CursorTokenPaginator(Paginator):
    """An opaque token in the body (`next_cursor`), sent back as a parameter; null or absent ends the read."""

    def __init__(
        self, page_size: int, size_param: str = "limit", token_path: str = "next_cursor", token_param: str = "cursor"
    ) -> None:
        super().__init__(page_size)
        self.size_param, self.token_path, self.token_param = size_param, token_path, token_param

    def first_params(self) -> Params:
        return {self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        token = json_path(body, self.token_path)
        return str(token) if token not in (None, "") else None

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, **self.first_params(), self.token_param: self.token}


class LinkHeaderPaginator(Paginator):
    """RFC 8288 `Link: <url>; rel="next"`; the URL is followed as given, on the same origin only."""

    def __init__(self, page_size: int, size_param: str = "limit", rel: str = "next") -> None:
        super().__init__(page_size)
        self.size_param, self.rel = size_param, rel

    def first_params(self) -> Params:
        return {self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        link = response.links.get(self.rel, {}).get("url")
        if not link:
            return None
        target = response.url.join(link)
        if (target.scheme, target.host, target.port) != (response.url.scheme, response.url.host, response.url.port):
            raise ApiError(
                f"{_where(response)}: the next-page link points to {target.host}; not sending credentials there"
            )
        return str(target)

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return self.token, None


class PageNumberPaginator(Paginator):
    """`page=1, 2, ...` with `per_page`; a short page is the last."""

    def __init__(
        self, page_size: int, size_param: str = "per_page", page_param: str = "page", first_page: int = 1
    ) -> None:
        super().__init__(page_size)
        self.size_param, self.page_param, self.first_page = size_param, page_param, first_page

    def first_params(self) -> Params:
        return {self.page_param: self.first_page, self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        if len(records) < self.page_size:
            return None
        current = int(self.token) if self.token is not None else self.first_page
        return str(current + 1)

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, self.page_param: int(self.token), self.size_param: self.page_size}


class OffsetPaginator(Paginator):
    """`offset` and `limit`; a short page is the last. Rows that change during the read shift the offsets."""

    def __init__(self, page_size: int, size_param: str = "limit", offset_param: str = "offset") -> None:
        super().__init__(page_size)
        self.size_param, self.offset_param = size_param, offset_param
        logger.warning(
            "offset pagination: rows inserted, updated or deleted during the read shift the offsets, so rows "
            "can be skipped or read twice; prefer a cursor pagination if the API has one"
        )

    def first_params(self) -> Params:
        return {self.offset_param: 0, self.size_param: self.page_size}

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        if len(records) < self.page_size:
            return None
        return str((int(self.token) if self.token is not None else 0) + len(records))

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        assert self.token is not None
        return path, {**params, self.offset_param: int(self.token), self.size_param: self.page_size}


class SinglePage(Paginator):
    """The endpoint answers with everything at once."""

    def next_token(self, response: httpx.Response, body: Any, records: list[Any]) -> str | None:
        return None

    def next_request(self, path: str, params: Params) -> tuple[str, Params | None]:
        return path, params


@dataclass(frozen=True)
class PaginationSpec:
    """Which paginator an endpoint uses and its parameter names; `make()` builds a fresh one per read."""

    style: str = "cursor"  # cursor | link | page | offset | single
    size_param: str = "limit"
    token_path: str = "next_cursor"  # cursor: where the body holds the next token
    token_param: str = "cursor"  # cursor: the query parameter that sends it back
    page_param: str = "page"
    first_page: int = 1
    offset_param: str = "offset"

    def make(self, page_size: int) -> Paginator:
        if self.style == "cursor":
            return CursorTokenPaginator(page_size, self.size_param, self.token_path, self.token_param)
        if self.style == "link":
            return LinkHeaderPaginator(page_size, self.size_param)
        if self.style == "page":
            return PageNumberPaginator(page_size, self.size_param, self.page_param, self.first_page)
        if self.style == "offset":
            return OffsetPaginator(page_size, self.size_param, self.offset_param)
        if self.style == "single":
            return SinglePage(page_size)
        raise ValueError(f"pagination style {self.style!r} is not one of cursor, link, page, offset, single")
