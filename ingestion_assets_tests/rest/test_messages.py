"""Errors that point at their cause: a body cut off in transit is retried and says so, a wrong records_path
lists the keys the body has, a page that is not JSON names what came, a pagination loop is permanent."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import (
    BadPayload,
    BucketRegistry,
    PaginationLoop,
    RetriesExhausted,
    RetryPolicy,
    read_pages,
)
from ingestion_assets.sources.rest.payload import parse_json
from ingestion_assets_tests.rest.conftest import CapturedLogs, StartApi
from ingestion_assets_tests.rest.helpers import ORDERS, Target, assert_equal_to_server, client, oauth, resource_requests


def test_a_cut_off_body_is_retried_and_the_data_ends_exact(
    api: DemoApi, buckets: BucketRegistry, logs: CapturedLogs
) -> None:
    api.fail_next("cut", 3)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert len(resource_requests(api)) == 14 + 3
    retried = [r.getMessage() for r in logs.records if "cut off" in r.getMessage()]
    assert len(retried) == 3 and all("application/json" in m and "bytes" in m for m in retried)


def test_a_body_cut_off_every_time_fails_as_transient_saying_so(api: DemoApi, buckets: BucketRegistry) -> None:
    api.fail_next("cut", 100)
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
    with client(api, oauth(api), buckets, retry=policy) as rest, pytest.raises(RetriesExhausted) as raised:
        Target().sync(rest, ORDERS)
    assert "was cut off" in str(raised.value) and "not JSON" not in str(raised.value)
    assert raised.value.transient


def test_a_wrong_records_path_lists_the_keys_the_body_has(api: DemoApi, buckets: BucketRegistry) -> None:
    with client(api, oauth(api), buckets) as rest, pytest.raises(BadPayload) as raised:
        Target().sync(rest, replace(ORDERS, records_path="items"))
    message = str(raised.value)
    assert "records_path 'items'" in message and "['data', 'next_cursor']" in message
    assert "lists are at data" in message and not raised.value.transient
    assert len(resource_requests(api)) == 1  # permanent: not retried


def test_a_complete_body_that_is_not_json_names_what_came() -> None:
    html = httpx.Response(200, text="<html><body>Sign in</body></html>", headers={"Content-Type": "text/html"})
    with pytest.raises(BadPayload) as raised:
        parse_json(html, "GET /v1/orders")
    assert "(HTTP 200, text/html) is not JSON" in str(raised.value) and "<html><body>Sign in" in str(raised.value)
    complete = httpx.Response(200, text='{"data": [] } trailing', headers={"Content-Type": "application/json"})
    with pytest.raises(BadPayload):  # declared JSON, but complete and wrong: not a cut-off, not retried
        parse_json(complete, "GET /v1/orders")


def test_a_pagination_loop_is_permanent(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(repeat_cursor=True)
    with client(api, oauth(api), buckets) as rest, pytest.raises(PaginationLoop) as raised:
        list(read_pages(rest, ORDERS, None))
    assert not raised.value.transient
    assert len(resource_requests(api)) == 2


def test_integers_past_64_bits_read_exactly_not_as_doubles() -> None:
    """orjson reads an integer outside [-2**63, 2**64) as a double without an error: 12345678901234567890123 landed
    as 1.2345678901234568e+22 (or paused its column as a change to double) on a page without a fraction."""
    body = b'{"data": [{"id": 1, "big": 12345678901234567890123}, {"id": 2, "big": -9223372036854775809}]}'
    response = httpx.Response(200, content=body, headers={"Content-Type": "application/json"})
    records = parse_json(response, "GET /v1/orders")["data"]
    assert [r["big"] for r in records] == [12345678901234567890123, -9223372036854775809]
    assert all(not isinstance(r["big"], float) for r in records)


def test_bodies_the_fast_parser_refuses_read_as_json_reads_them() -> None:
    """orjson reads pages first; what it refuses and JSON still allows must come out as json.loads has it."""
    bodies = {
        b'{"data": [{"id": 18446744073709551616, "v": NaN}]}': "application/json",  # over 64 bits, NaN
        '{"data": [{"id": 1, "name": "Müller"}]}'.encode("latin-1"): "application/json; charset=iso-8859-1",
        b'\xef\xbb\xbf{"data": []}': "application/json; charset=utf-8-sig",  # a byte order mark
    }
    for content, kind in bodies.items():
        response = httpx.Response(200, content=content, headers={"Content-Type": kind})
        assert repr(parse_json(response, "GET /v1/orders")) == repr(json.loads(response.text))
