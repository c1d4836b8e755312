"""A misbehaving API: 429 storms, Retry-After in both forms, 5xx bursts, dropped connections; the data still ends exact."""

from __future__ import annotations

import pytest

from ingestion_assets.sources.rest import BucketRegistry, RateLimited, RetriesExhausted, RetryPolicy
from ingestion_assets_tests.rest.conftest import StartApi
from ingestion_assets_tests.rest.helpers import (
    ORDERS,
    Target,
    assert_equal_to_server,
    assert_rate_respected,
    client,
    oauth,
    resource_requests,
)


def test_a_429_storm_pauses_the_source_and_the_data_ends_exact(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(storm_retry_after=1)
    target = Target()
    with client(api, oauth(api), buckets, rate=40.0, burst=2) as rest:
        target.sync(rest, ORDERS)
        api.mutate("orders", inserts=5, updates=20)
        api.fail_next("429", 3)
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    requests = resource_requests(api)
    statuses = [e["status"] for e in requests]
    assert statuses.count(429) == 3 and statuses[-1] == 200
    limited = [i for i, e in enumerate(requests) if e["status"] == 429]
    for index in limited:  # every retry came after the second the API asked for
        assert requests[index + 1]["at"] - requests[index]["at"] >= 0.95
    assert_rate_respected(requests, rate=40.0, burst=2)


@pytest.mark.parametrize("style", ["seconds", "date"])
def test_retry_after_is_honoured_in_seconds_and_as_an_http_date(
    start_api: StartApi, buckets: BucketRegistry, style: str
) -> None:
    api = start_api(retry_after=style, storm_retry_after=1)
    api.fail_next("429", 1)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    first, second = resource_requests(api)[:2]
    assert first["status"] == 429 and second["status"] == 200
    # seconds: exactly one; a date is whole seconds, rounded up by the server: between one and two
    assert 0.95 <= second["at"] - first["at"] <= 2.5


def test_a_client_faster_than_the_server_allows_slows_down_and_finishes(
    start_api: StartApi, buckets: BucketRegistry
) -> None:
    api = start_api(rate=20.0, burst=6, retry_after="alternate")
    target = Target()
    with client(api, oauth(api), buckets, rate=200.0, burst=10) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    statuses = [e["status"] for e in resource_requests(api)]
    assert 429 in statuses and statuses.count(200) == 14


def test_5xx_bursts_and_random_errors_are_retried_until_the_data_is_exact(
    start_api: StartApi, buckets: BucketRegistry
) -> None:
    api = start_api(error_rate=0.15, seed=11)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        api.fail_next("5xx", 4)
        target.sync(rest, ORDERS)
        api.mutate("orders", inserts=6, updates=30)
        api.fail_next("5xx", 3)
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert [e["status"] for e in resource_requests(api)].count(503) >= 7


def test_dropped_connections_are_retried_until_the_data_is_exact(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(reset_rate=0.1, seed=5)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        api.fail_next("reset", 3)
        target.sync(rest, ORDERS)
        api.mutate("orders", inserts=2, updates=9)
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    assert [e["status"] for e in resource_requests(api)].count(0) >= 3  # 0: closed without an answer


def test_transient_failures_past_the_budget_fail_with_the_endpoint_named(
    start_api: StartApi, buckets: BucketRegistry
) -> None:
    api = start_api()
    api.fail_next("5xx", 100)
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
    with client(api, oauth(api), buckets, retry=policy) as rest, pytest.raises(RetriesExhausted) as raised:
        Target().sync(rest, ORDERS)
    assert f"GET {api.url}/v1/orders" in str(raised.value) and "3 failed attempts" in str(raised.value)
    assert "HTTP 503" in str(raised.value)
    assert len(resource_requests(api)) == 3


def test_rate_limited_longer_than_allowed_fails_with_advice(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(storm_retry_after=1)
    api.fail_next("429", 100)
    policy = RetryPolicy(max_rate_limited_seconds=1.5)
    with client(api, oauth(api), buckets, retry=policy) as rest, pytest.raises(RateLimited) as raised:
        Target().sync(rest, ORDERS)
    assert "/v1/orders" in str(raised.value) and "lower the stream's request rate" in str(raised.value)
    assert len(resource_requests(api)) == 2
