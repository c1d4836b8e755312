"""The request governor: token bucket pacing, full-jitter backoff, Retry-After, and the rate the server saw."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import BucketRegistry, RetryPolicy, TokenBucket, read_pages
from ingestion_assets.sources.rest.governor import retry_after_seconds
from ingestion_assets_tests.rest.helpers import (
    CUSTOMERS,
    ORDERS,
    Target,
    assert_equal_to_server,
    assert_rate_respected,
    client,
    oauth,
    resource_requests,
)


class FakeClock:
    """Time that moves only when someone sleeps."""

    def __init__(self) -> None:
        self.time = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.time

    def now(self) -> datetime:
        return datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=self.time)

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.time += seconds


def test_token_bucket_allows_a_burst_then_spaces_requests_evenly() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=4.0, burst=4, clock=clock)
    waits = [bucket.acquire() for _ in range(6)]
    assert waits == [0.0, 0.0, 0.0, 0.25, 0.25, 0.25]  # a burst of 4 less the token kept for jitter
    clock.time += 10  # idle: the bucket fills up to the burst again, not beyond
    assert [bucket.acquire() for _ in range(4)] == [0.0, 0.0, 0.0, 0.25]
    assert [TokenBucket(rate=4.0, burst=1, clock=clock).acquire() for _ in range(1)] == [0.0]


def test_a_late_caller_catches_up_within_the_burst_and_the_long_run_rate_is_the_limit() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=5, clock=clock)
    start, sent = clock.time, 0
    for index in range(200):
        bucket.acquire()
        sent += 1
        clock.time += 0.25 if index % 10 == 0 else 0.02  # a slow response now and then, fast ones between
    elapsed = clock.time - start
    assert sent <= 10.0 * elapsed + 5  # never above the rate, plus the burst
    assert sent / elapsed > 9.8  # the time the slow responses lost is made up


def test_a_pause_holds_the_bucket_then_resumes_one_at_a_time() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=2, clock=clock)
    bucket.pause(2.0)
    assert [round(bucket.acquire(), 6) for _ in range(3)] == [2.0, 0.1, 0.1]


def test_the_registry_shares_one_bucket_per_credential_and_the_stricter_limit_wins() -> None:
    registry, clock = BucketRegistry(), FakeClock()
    first = registry.bucket("oauth2:x:client", 10.0, 5, clock)
    assert registry.bucket("oauth2:x:client", 4.0, 8, clock) is first
    assert (first.rate, first.burst) == (4.0, 5)
    assert registry.bucket("api-key:other", 10.0, 5, clock) is not first


def test_backoff_is_exponential_with_full_jitter() -> None:
    policy, rng = RetryPolicy(base_delay=0.5, max_delay=8.0), random.Random(3)
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (9, 8.0)]:
        delays = [policy.backoff(failures, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert min(delays) < ceiling * 0.1 and max(delays) > ceiling * 0.9  # the whole range, not a band


def test_retry_after_in_seconds_and_as_an_http_date() -> None:
    now = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=5), usegmt=True), now) == 5.0
    assert retry_after_seconds("Sat, 01 Mar 2025 11:59:00 GMT", now) == 0.0  # already past
    assert retry_after_seconds(None, now) is None
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds(" 1.5 ", now) == 1.5  # decimal seconds, as some APIs send them
    assert retry_after_seconds("-3", now) is None and retry_after_seconds("1e3", now) is None


def test_the_server_never_sees_more_than_the_configured_rate(api: DemoApi, buckets: BucketRegistry) -> None:
    target = Target()
    with client(api, oauth(api), buckets, rate=25.0, burst=3) as rest:
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)
    requests = resource_requests(api)
    assert len(requests) == 14
    assert_rate_respected(requests, rate=25.0, burst=3)


def test_two_streams_of_one_credential_share_its_rate_across_threads(api: DemoApi, buckets: BucketRegistry) -> None:
    targets = {"orders": Target(), "customers": Target()}
    errors: list[BaseException] = []

    def sync(resource: str) -> None:
        endpoint = ORDERS if resource == "orders" else CUSTOMERS
        try:  # each stream its own client and token, one credential: one bucket
            with client(api, oauth(api), buckets, rate=30.0, burst=2) as rest:
                targets[resource].sync(rest, endpoint)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=sync, args=(name,)) for name in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert_equal_to_server(targets["orders"], api, "orders")
    assert_equal_to_server(targets["customers"], api, "customers")
    requests = resource_requests(api, "demo-client")
    assert {e["path"] for e in requests} == {"/v1/orders", "/v1/customers"} and len(requests) == 14 + 7
    assert_rate_respected(requests, rate=30.0, burst=2)


def test_pages_are_read_while_paced(api: DemoApi, buckets: BucketRegistry) -> None:
    with client(api, oauth(api), buckets, rate=50.0, burst=1) as rest:
        pages = list(read_pages(rest, ORDERS, None))
    assert [p.index for p in pages] == list(range(14))
