"""Listings read by position (Link headers, page numbers, offsets, echoed tokens) against a scripted API on
loopback: every page is read, the end is the end, and a listing that shifts under a read is read again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from ingestion_assets.sources.rest import (
    BadPayload,
    EndpointSpec,
    PaginationLoop,
    PaginationSpec,
    Position,
    RestClient,
    read_pages,
)
from ingestion_assets.sources.rest.incremental import REREAD_FROM, Page
from ingestion_assets_tests.rest.conftest import CapturedLogs
from ingestion_assets_tests.rest.helpers import FAST_RETRY
from ingestion_assets_tests.rest.scripted import Answer, ScriptedApi, json_answer

RECORDS = [{"id": i, "updated_at": f"2024-05-01T00:00:{i:02d}Z", "name": f"r{i}"} for i in range(1, 24)]
Route = Callable[[dict[str, str]], Answer]


@pytest.fixture
def scripted(scripted_api: Callable[..., ScriptedApi]) -> Callable[[str, Route], ScriptedApi]:
    """A scripted API on loopback answering `path` with `route` (the project's `scripted_api`, one route)."""
    return lambda path, route: scripted_api(routes={path: route})


def read(api: ScriptedApi, endpoint: EndpointSpec, start: Position | None = None) -> list[Page]:
    with RestClient(api.url, rate=500.0, burst=50, retry=FAST_RETRY, seed=1) as rest:
        return list(read_pages(rest, endpoint, start))


def ids(pages: list[Page]) -> list[int]:
    return [r["id"] for p in pages for r in p.records]


def linked(lines: Callable[[int, int], list[str]]) -> Route:
    """Pages of 10 of RECORDS by `page`, each with the Link header lines `lines(page, last page)`."""

    def route(query: dict[str, str]) -> Answer:
        page = int(query.get("page", "1"))
        answer = json_answer({"data": RECORDS[(page - 1) * 10 : page * 10]})
        answer.lines = [("Link", line) for line in lines(page, 3)]
        return answer

    return route


LINK = EndpointSpec("/items", cursor_field=None, cursor_param=None, pagination=PaginationSpec("link"), page_size=10)


@pytest.mark.parametrize(
    "lines",
    [
        # relation types compare case-insensitively (RFC 8288 3.3)
        lambda n, last: [f'</items?page={n + 1}>; rel="Next"'] if n < last else [],
        # several relation types in one rel, and a relative URL resolved against the request's
        lambda n, last: (
            [f'<items?page={n + 1}>; rel="last next"']
            if n == last - 1
            else ([f"<items?page={n + 1}>; rel=next"] if n < last else [])
        ),
        # several Link lines, a quoted parameter holding a comma and a semicolon before the next link
        lambda n, last: (
            ['</items?page=1>; rel="first"; title="the first, of all; pages"']
            + ([f'</items?page={n + 1}>; title="next, please"; rel="NEXT"'] if n < last else [])
        ),
        # one line holding several links, the next one last
        lambda n, last: [
            f'</items?page=1>; rel=first, </items?page={last}>; rel="last"'
            + (f', </items?page={n + 1}>; rel="prefetch next"' if n < last else "")
        ],
    ],
    ids=["Next", "last next", "several lines", "one line"],
)
def test_link_pagination_follows_every_next_link_rfc_8288_allows(
    scripted: Callable[[str, Route], ScriptedApi], lines: Callable[[int, int], list[str]]
) -> None:
    # before: httpx keys links by the raw rel text, so `rel="Next"` or `rel="last next"` ended the read on page 1
    api = scripted("/items", linked(lines))
    pages = read(api, LINK)
    assert [r for p in pages for r in p.records] == RECORDS
    assert pages[-1].position == {} and pages[-1].doubt is None


def test_a_page_without_a_next_link_but_a_last_page_elsewhere_fails(
    scripted: Callable[[str, Route], ScriptedApi],
) -> None:
    # a next link the paginator does not recognise (here rel="following") must not end the read quietly on page 1
    api = scripted(
        "/items", linked(lambda n, last: [f'</items?page={n + 1}>; rel="following"', f"</items?page={last}>; rel=last"])
    )
    with pytest.raises(BadPayload, match="names a last page") as raised:
        read(api, LINK)
    assert "/items" in str(raised.value)


def test_a_link_to_the_last_page_on_the_last_page_is_the_end(scripted: Callable[[str, Route], ScriptedApi]) -> None:
    # on the last page the `last` link names that very page (its query in another order): the end
    def lines(n: int, last: int) -> list[str]:
        if n < last:
            return [f"</items?x=1&page={n + 1}>; rel=next", f"</items?page={last}&x=1>; rel=last"]
        return [f"</items?page={last}&x=1>; rel=last"]

    api = scripted("/items", linked(lines))
    pages = read(api, replace(LINK, params={"x": 1}))
    assert ids(pages) == [r["id"] for r in RECORDS]


def shifting(per_page_param: str, offsets: bool) -> tuple[Route, list[dict[str, Any]]]:
    """A listing of RECORDS sorted by (updated_at, id), filtered by `updated_since`, read by page or offset;
    once the first page is served, record 5 is updated (it moves to the end)."""
    rows = [dict(r) for r in RECORDS]
    served = {"pages": 0}

    def route(query: dict[str, str]) -> Answer:
        listed = sorted(rows, key=lambda r: (r["updated_at"], r["id"]))
        if "updated_since" in query:
            listed = [r for r in listed if r["updated_at"] >= query["updated_since"]]
        size = int(query[per_page_param])
        first = int(query.get("offset", "0")) if offsets else (int(query.get("page", "1")) - 1) * size
        answer = json_answer({"data": listed[first : first + size]})
        served["pages"] += 1
        if served["pages"] == 1:
            next(r for r in rows if r["id"] == 5)["updated_at"] = "2024-05-01T00:01:00Z"
        return answer

    return route, rows


@pytest.mark.parametrize("style", ["page", "offset"])
def test_a_listing_shifted_by_a_change_during_the_read_is_read_again_from_the_moved_record(
    scripted: Callable[[str, Route], ScriptedApi], logs: CapturedLogs, style: str
) -> None:
    # before: record 11 (at the boundary of pages 1 and 2 once record 5 moved to the end) was never served, and
    # the position after the read passed its cursor: lost for good, no word
    route, rows = shifting("limit", offsets=style == "offset")
    api = scripted("/items", route)
    spec = PaginationSpec(style, size_param="limit")
    endpoint = EndpointSpec("/items", pagination=spec, page_size=10)
    pages = read(api, endpoint)
    assert 11 not in ids(pages) and ids(pages).count(5) == 2  # what the shift did to this read
    assert pages[-1].doubt is not None and "key id=5 was served twice" in pages[-1].doubt
    position = pages[-1].position
    assert position["updated_at"] == "2024-05-01T00:01:00Z"  # the newest record read ...
    assert position[REREAD_FROM] == "2024-05-01T00:00:01Z"  # ... and the next read starts at 5's first page
    said = [r.getMessage() for r in logs.records if r.levelname == "WARNING" and "served twice" in r.getMessage()]
    assert len(said) == 1 and "key id=5" in said[0]
    again = read(api, endpoint, position)
    assert 11 in ids(again)
    merged = {r["id"]: r for p in [*pages, *again] for r in p.records}
    assert sorted(merged.values(), key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])


def test_a_full_page_read_that_shifted_is_in_doubt(scripted: Callable[[str, Route], ScriptedApi]) -> None:
    # a key listing without a cursor: a key skipped by the shift must not be taken for deleted
    route, _ = shifting("limit", offsets=False)
    api = scripted("/items", route)
    endpoint = EndpointSpec(
        "/items",
        cursor_field=None,
        cursor_param=None,
        pagination=PaginationSpec("page", size_param="limit"),
        page_size=10,
    )
    pages = read(api, endpoint)
    assert 11 not in ids(pages)
    assert pages[-1].position == {} and pages[-1].doubt is not None and "shifted" in pages[-1].doubt


def cursor_feed(echo_on: str) -> Route:
    """Cursor pagination over three pages (tokens a, b); the last page hands back the token it was asked with:
    empty (`echo_on` "empty": a page after the last) or holding records ("full")."""

    def route(query: dict[str, str]) -> Answer:
        cursor = query.get("cursor")
        if cursor is None:
            return json_answer({"data": RECORDS[:10], "next_cursor": "a"})
        if cursor == "a":
            return json_answer({"data": RECORDS[10:20], "next_cursor": "b"})
        return json_answer({"data": [] if echo_on == "empty" else RECORDS[20:], "next_cursor": "b"})

    return route


def test_an_empty_last_page_echoing_its_token_is_the_end(scripted: Callable[[str, Route], ScriptedApi]) -> None:
    # before: "returned page token 'b' again after 2 pages ... a server bug", on every run
    api = scripted("/feed", cursor_feed("empty"))
    endpoint = EndpointSpec("/feed", cursor_field=None, cursor_param=None, page_size=10)
    pages = read(api, endpoint)
    assert ids(pages) == [r["id"] for r in RECORDS[:20]] and pages[-1].position == {}
    with pytest.raises(PaginationLoop, match="page token 'b' again"):  # records with a repeated token: a loop
        read(scripted("/feed", cursor_feed("full")), endpoint)


def clamped(total: int) -> Route:
    """Page numbers past the last answer the last page again."""

    def route(query: dict[str, str]) -> Answer:
        size = int(query["per_page"])
        last = max(1, -(-total // size))
        page = min(int(query.get("page", "1")), last)
        return json_answer({"data": RECORDS[:total][(page - 1) * size : page * size]})

    return route


def test_an_api_clamping_page_numbers_is_read_to_its_last_page(scripted: Callable[[str, Route], ScriptedApi]) -> None:
    # before: "the API returned the same page twice ... ignores the page parameter", on every run
    api = scripted("/items", clamped(23))
    endpoint = EndpointSpec("/items", pagination=PaginationSpec("page", size_param="per_page"), page_size=10)
    pages = read(api, endpoint)
    assert ids(pages) == [r["id"] for r in RECORDS] and pages[-1].records == []
    assert pages[-1].position["updated_at"] == RECORDS[-1]["updated_at"] and pages[-1].doubt is None


def test_the_first_page_served_again_stays_an_error_saying_clamped_or_ignored(
    scripted: Callable[[str, Route], ScriptedApi],
) -> None:
    # one page clamped looks like a page parameter ignored: ending there could skip every page after the first
    api = scripted("/items", clamped(7))
    endpoint = EndpointSpec("/items", pagination=PaginationSpec("page", size_param="per_page"), page_size=10)
    with pytest.raises(
        PaginationLoop,
        match=r"page=2 answered with the records of the page before.*clamps the page number past a single page, or ignores",
    ):
        read(api, endpoint)


def test_a_full_page_losing_its_link_header_is_an_end_in_doubt(
    scripted: Callable[[str, Route], ScriptedApi], logs: CapturedLogs
) -> None:
    # pages 1 and 2 link on; page 2 (full) comes with no Link header at all (a proxy dropped it): taken as the end,
    # but not as a finished read. Before: the position claimed the last record as if every page had been read
    api = scripted("/items", linked(lambda n, last: [f"</items?page={n + 1}>; rel=next"] if n < 2 else []))
    pages = read(api, replace(LINK, cursor_field="updated_at", cursor_param="updated_since"))
    assert ids(pages) == [r["id"] for r in RECORDS[:20]]
    assert pages[-1].doubt is not None and "without a Link header" in pages[-1].doubt
    assert pages[-1].position["id"] == "19"  # short of the end: the next read asks from there
    assert any("without a Link header" in r.getMessage() for r in logs.records if r.levelname == "WARNING")


def test_a_single_full_page_linking_first_and_last_to_page_1_is_the_end(
    scripted: Callable[[str, Route], ScriptedApi],
) -> None:
    # GitLab links `first` and `last` on every page, with `page=1`, which the first request did not send
    api = scripted(
        "/items", linked(lambda n, last: ["</items?page=1&limit=10>; rel=first, </items?limit=10&page=1>; rel=last"])
    )
    pages = read(api, LINK)
    assert ids(pages) == [r["id"] for r in RECORDS[:10]] and pages[-1].doubt is None


def patched_in_place(offsets: bool) -> tuple[Route, list[dict[str, Any]]]:
    """A listing that sorts first and fills in current values after (recheck25): record 15 changes while page 2
    is served, so page 2 shows it in its old place with its new cursor, and page 3, sorted again, shows it once
    more at the end; record 21, moved up to page 2's last place, is served by neither."""
    rows = [dict(r) for r in RECORDS]
    served = {"pages": 0}

    def route(query: dict[str, str]) -> Answer:
        listed = sorted(rows, key=lambda r: (r["updated_at"], r["id"]))
        if "updated_since" in query:
            listed = [r for r in listed if r["updated_at"] >= query["updated_since"]]
        first = int(query.get("offset", "0")) if offsets else (int(query.get("page", "1")) - 1) * 10
        served["pages"] += 1
        if served["pages"] == 2:
            next(r for r in rows if r["id"] == 15)["updated_at"] = "2024-05-01T00:01:00Z"  # after the sort
        return json_answer({"data": [dict(r) for r in listed[first : first + 10]]})

    return route, rows


@pytest.mark.parametrize("style", ["page", "offset"])
def test_a_record_served_in_its_old_place_with_its_new_cursor_reads_again_from_before_its_page(
    scripted: Callable[[str, Route], ScriptedApi], style: str
) -> None:
    # before: the next read started at the moved record's first cursor, its new one, past record 21: lost for good
    route, rows = patched_in_place(offsets=style == "offset")
    api = scripted("/items", route)
    endpoint = EndpointSpec("/items", pagination=PaginationSpec(style, size_param="limit"), page_size=10)
    pages = read(api, endpoint)
    assert 21 not in ids(pages) and ids(pages).count(15) == 2  # what the shift did to this read
    position = pages[-1].position
    assert position[REREAD_FROM] <= "2024-05-01T00:00:11Z"  # no later than the first record of 15's first page
    again = read(api, endpoint, position)
    assert 21 in ids(again)
    merged = {r["id"]: r for p in [*pages, *again] for r in p.records}
    assert sorted(merged.values(), key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])
