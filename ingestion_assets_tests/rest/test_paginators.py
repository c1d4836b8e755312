"""Each paginator against the demo API, resuming a full read from its page token, and loop detection."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import (
    PAGE_TOKEN,
    ApiError,
    BadPayload,
    BucketRegistry,
    NotFound,
    PaginationLoop,
    PaginationSpec,
    read_pages,
)
from ingestion_assets.sources.rest.paginators import LinkHeaderPaginator
from ingestion_assets_tests.rest.conftest import CapturedLogs, StartApi
from ingestion_assets_tests.rest.helpers import ORDERS, Target, client, oauth, resource_requests

STYLES = {
    "cursor": PaginationSpec("cursor"),
    "link": PaginationSpec("link"),
    "page": PaginationSpec("page", size_param="per_page"),
    "offset": PaginationSpec("offset"),
}


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("incremental", [True, False])
def test_each_paginator_reads_every_record_in_order(
    api: DemoApi, buckets: BucketRegistry, style: str, incremental: bool
) -> None:
    endpoint = replace(ORDERS, pagination=STYLES[style], page_size=9)
    if not incremental:
        endpoint = replace(endpoint, cursor_field=None, cursor_param=None)
    with client(api, oauth(api), buckets) as rest:
        pages = list(read_pages(rest, endpoint, None))
    assert [r for p in pages for r in p.records] == api.records("orders")
    # 137 records; page and offset end on an empty page (a short page is no proof), the others when told
    trailing = [0] if style in ("page", "offset") else []
    assert [len(p.records) for p in pages] == [9] * 15 + [2] + trailing
    requests = resource_requests(api)
    assert len(requests) == 16 + len(trailing) and all(e["status"] == 200 for e in requests)


@pytest.mark.parametrize("style", ["page", "offset"])
@pytest.mark.parametrize("incremental", [True, False])
def test_an_api_capping_the_page_size_is_read_to_the_end(
    start_api: StartApi, buckets: BucketRegistry, logs: CapturedLogs, style: str, incremental: bool
) -> None:
    # asked for 10 a page, the API serves 4: a short page is not the last (before: 4 of 137 records, no word)
    api = start_api(page_cap=4)
    endpoint = replace(ORDERS, pagination=STYLES[style], page_size=10)
    if not incremental:
        endpoint = replace(endpoint, cursor_field=None, cursor_param=None)
    with client(api, oauth(api), buckets) as rest:
        pages = list(read_pages(rest, endpoint, None))
    assert [r for p in pages for r in p.records] == api.records("orders")
    assert [len(p.records) for p in pages] == [4] * 34 + [1, 0]
    last = api.records("orders")[-1]  # served oldest first: the finished read's position is the newest record
    expected = {"updated_at": last["updated_at"], "id": str(last["id"])} if incremental else {}
    assert {k: v for k, v in pages[-1].position.items() if k in ("updated_at", "id")} == expected
    said = [
        r.getMessage() for r in logs.records if r.levelname == "WARNING" and "serves 4 records a page" in r.getMessage()
    ]
    assert len(said) == (1 if style == "page" else 0)  # page numbers count the pages served: said once


def test_a_404_for_a_page_past_the_last_ends_the_read(start_api: StartApi, buckets: BucketRegistry) -> None:
    # Django REST framework answers 404 for a page number past the last one: that is the end, not a failure
    api = start_api(page_past_end="404")
    endpoint = replace(ORDERS, pagination=STYLES["page"], page_size=10, cursor_field=None, cursor_param=None)
    with client(api, oauth(api), buckets) as rest:
        pages = list(read_pages(rest, endpoint, None))
    assert [r for p in pages for r in p.records] == api.records("orders")
    assert [len(p.records) for p in pages] == [10] * 13 + [7, 0]
    assert pages[-1].position == {}  # a finished full read: the next one starts from the top
    assert [e["status"] for e in resource_requests(api)] == [200] * 14 + [404]
    with client(api, oauth(api), buckets) as rest, pytest.raises(NotFound):  # the first page's 404 is no end
        list(read_pages(rest, replace(endpoint, path="/v1/nothing"), None))


def test_offset_pagination_warns_that_changing_data_can_skip_rows(
    api: DemoApi, buckets: BucketRegistry, logs: CapturedLogs
) -> None:
    with client(api, oauth(api), buckets) as rest:
        list(read_pages(rest, replace(ORDERS, pagination=STYLES["offset"]), None))
    warnings = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
    assert any("offset pagination" in w and "skipped or read twice" in w for w in warnings)


@pytest.mark.parametrize("style", list(STYLES))
def test_a_full_read_resumes_from_its_page_token(api: DemoApi, buckets: BucketRegistry, style: str) -> None:
    endpoint = replace(ORDERS, pagination=STYLES[style], cursor_field=None, cursor_param=None)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        pages = read_pages(rest, endpoint, None)
        target.load(next(pages) for _ in range(4))
        pages.close()
        assert target.position is not None and target.position[PAGE_TOKEN]
        read = target.sync(rest, endpoint)
    assert [r["id"] for r in read] == [r["id"] for r in api.records("orders")][40:]
    assert target.position == {}  # a finished full read: the next one starts from the top
    assert list(target.rows.values()) == api.records("orders")


def test_a_repeated_page_token_stops_the_read(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(repeat_cursor=True)
    with client(api, oauth(api), buckets) as rest, pytest.raises(PaginationLoop) as raised:
        list(read_pages(rest, ORDERS, None))
    assert "GET http://127.0.0.1" in str(raised.value) and "/v1/orders" in str(raised.value)
    assert "page token" in str(raised.value)
    assert len(resource_requests(api)) == 2  # the first page, and the one that handed the token back


def test_a_page_served_twice_stops_the_read(api: DemoApi, buckets: BucketRegistry) -> None:
    # the API ignores an unknown page parameter and serves the first page again and again
    spec = PaginationSpec("page", page_param="pg", size_param="limit")
    with client(api, oauth(api), buckets) as rest, pytest.raises(PaginationLoop, match="same page twice"):
        list(read_pages(rest, replace(ORDERS, pagination=spec), None))
    assert len(resource_requests(api)) == 2


def test_a_link_to_another_host_is_not_followed() -> None:
    request = httpx.Request("GET", "http://127.0.0.1:8000/v1/orders")
    response = httpx.Response(
        200, headers={"Link": '<https://elsewhere.example/v1/orders?page=2>; rel="next"'}, request=request
    )
    with pytest.raises(ApiError, match=r"elsewhere\.example"):
        LinkHeaderPaginator(10).advance(response, {}, [{"id": 1}])
    relative = httpx.Response(200, headers={"Link": '</v1/orders?page=2>; rel="next"'}, request=request)
    paginator = LinkHeaderPaginator(10)
    paginator.advance(relative, {}, [{"id": 1}])
    assert paginator.token == "http://127.0.0.1:8000/v1/orders?page=2"


def test_a_misspelt_token_path_fails_naming_the_key_the_body_has(api: DemoApi, buckets: BucketRegistry) -> None:
    # the body holds `next_cursor`, the catalog says `nextCursor`: before, the read ended after its first page
    endpoint = replace(ORDERS, pagination=PaginationSpec("cursor", token_path="nextCursor", stream="crm.orders"))
    with client(api, oauth(api), buckets) as rest, pytest.raises(BadPayload) as raised:
        list(read_pages(rest, endpoint, None))
    message = str(raised.value)
    assert "stream crm.orders" in message and "'nextCursor'" in message and "'next_cursor'" in message
    assert "['data', 'next_cursor']" in message and not raised.value.transient
    assert len(resource_requests(api)) == 1


def test_a_token_path_missing_from_a_full_page_is_the_end_with_a_warning(
    api: DemoApi, buckets: BucketRegistry, logs: CapturedLogs
) -> None:
    # no key like `token` in the body: an API that leaves the token out on its last page ends the read; on a full
    # page that may be a wrong token_path, so it is said; a short page missing it says nothing
    endpoint = replace(ORDERS, pagination=PaginationSpec("cursor", token_path="meta.token"), page_size=10)
    with client(api, oauth(api), buckets) as rest:
        pages = list(read_pages(rest, endpoint, None))
        assert [len(p.records) for p in pages] == [10]
        warnings = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
        assert any("'meta.token' is not in the body" in w and "full page (10 records)" in w for w in warnings)
        logs.records.clear()
        short = replace(endpoint, path="/v1/orders", params={"updated_since": api.records("orders")[-3]["updated_at"]})
        tail = [r for r in api.records("orders") if r["updated_at"] >= short.params["updated_since"]]
        assert [len(p.records) for p in read_pages(rest, short, None)] == [len(tail)] and len(tail) < 10
    assert not [r for r in logs.records if r.levelname == "WARNING"]
