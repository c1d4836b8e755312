"""Answers real SaaS servers give besides a page of JSON, through the client on loopback: an HTML maintenance page
with status 200 in the middle of a read is an outage (retried, then named), a redirect is followed on the same
host only and said as a redirect, never as a records_path problem."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ingestion_assets.sources.rest import (
    BucketRegistry,
    EndpointSpec,
    PaginationSpec,
    Redirected,
    RestClient,
    RetriesExhausted,
    RetryPolicy,
    read_pages,
)
from ingestion_assets_tests.rest.conftest import CapturedLogs
from ingestion_assets_tests.rest.scripted import Answer, ScriptedApi

FEED = EndpointSpec(
    "/feed",
    primary_key=("id",),
    cursor_field="seq",
    cursor_param="since",
    pagination=PaginationSpec(stream="saas.feed"),
    page_size=3,
)
PAGES = [[{"id": p * 3 + n, "seq": p * 3 + n} for n in range(3)] for p in range(3)]
MAINTENANCE = Answer(200, b"<html><body><h1>Down for maintenance</h1></body></html>", {"Content-Type": "text/html"})
FAST = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.02)

Start = Callable[..., ScriptedApi]


def _client(api: ScriptedApi, base: str | None = None) -> RestClient:
    return RestClient(base or api.url, rate=500.0, burst=50, retry=FAST, seed=1, buckets=BucketRegistry())


def test_an_html_maintenance_page_mid_read_is_retried_and_the_read_ends_exact(
    scripted_api: Start, logs: CapturedLogs
) -> None:
    api = scripted_api(feed=PAGES)
    with _client(api) as rest:
        pages = read_pages(rest, FEED, None)
        first = next(pages)
        api.answers += [MAINTENANCE, MAINTENANCE]  # the 2nd page's request meets the page twice, then data
        read = first.records + [r for page in pages for r in page.records]
    assert read == [r for page in PAGES for r in page]
    retried = [r.getMessage() for r in logs.records if "retry" in r.getMessage()]
    assert len(retried) == 2 and all("stream saas.feed" in m and "text/html" in m for m in retried)


def test_a_maintenance_page_that_stays_fails_as_transient_naming_what_came(scripted_api: Start) -> None:
    api = scripted_api(feed=PAGES, answers=[MAINTENANCE] * 10)
    with _client(api) as rest, pytest.raises(RetriesExhausted) as raised:
        list(read_pages(rest, FEED, {"seq": "0", "id": "0"}))
    message = str(raised.value)
    assert raised.value.transient
    for said in ("stream saas.feed", f"{api.url}/feed", "HTTP 200", "text/html", "Down for maintenance", "4 failed"):
        assert said in message, said
    assert "since=" not in message  # the URL without its query (a key may travel there)
    assert len(api.requests) == 4


def test_a_same_host_redirect_is_followed_once_said(scripted_api: Start, logs: CapturedLogs) -> None:
    api = scripted_api(feed=PAGES, redirects={"/old/feed": "/feed"})
    with _client(api) as rest:
        read = [
            r
            for page in read_pages(rest, EndpointSpec(**{**FEED.__dict__, "path": "/old/feed"}), None)
            for r in page.records
        ]
    assert read == [r for page in PAGES for r in page]
    said = [r.getMessage() for r in logs.records if "redirect" in r.getMessage()]
    assert len(said) == 1 and f"HTTP 301 redirect to {api.url}/feed" in said[0]


def test_a_redirect_to_another_host_is_not_followed_and_says_where_to(scripted_api: Start) -> None:
    elsewhere = scripted_api(feed=PAGES)
    api = scripted_api(redirects={"/feed": f"{elsewhere.url}/feed?api_key=s3cret"})
    with _client(api) as rest, pytest.raises(Redirected) as raised:
        list(read_pages(rest, FEED, None))
    message = str(raised.value)
    assert f"HTTP 301 redirect to {elsewhere.url}/feed, on another scheme, host or port: not followed" in message
    assert "records_path" not in message and "s3cret" not in message and not raised.value.transient
    assert elsewhere.requests == []  # nothing, credentials least of all, went there
