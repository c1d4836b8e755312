"""The request governor: a token bucket per credential shared across the process, and the backoff policy."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

logger = logging.getLogger(__name__)
_DECIMAL_SECONDS = re.compile(r"[0-9]+\.[0-9]+")


class Clock(Protocol):
    """Time as the governor sees it; tests and simulations swap it to control waiting."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class TokenBucket:
    """`rate` requests per second with bursts of up to `burst`, spent evenly by every thread that shares it.

    Kept as the time the next request is due (the generic cell rate algorithm, a token bucket
    by another name): each caller reserves its slot under the lock and waits outside it, so
    concurrent callers queue up `1 / rate` apart instead of waking together. A caller that came late
    (a slow response) may catch up on the time it lost, as far as the burst allows: the long-run rate
    stays at `rate` whatever the latency's jitter.

    One token of a burst of two or more is kept in reserve: paced exactly at the API's own limit, our
    requests would empty its bucket too, and then one arriving a millisecond early (network jitter) gets a
    429 and a whole second's pause. The reserve absorbs `1 / rate` of jitter for one request less of burst.
    """

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not rate={rate}, burst={burst}")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._due = clock.monotonic()  # when the bucket is full again, less one token per queued request
        self._lock = threading.Lock()

    @property
    def _tolerance(self) -> float:
        """How far ahead of the even pace a request may go: the burst, less the reserve token."""
        return (self.burst - (2 if self.burst > 1 else 1)) / self.rate

    def acquire(self) -> float:
        """Wait for the next slot; returns the seconds waited."""
        with self._lock:
            now = self._clock.monotonic()
            self._due = max(self._due, now)
            wait = max(0.0, self._due - self._tolerance - now)
            self._due += 1 / self.rate
        if wait > 0:
            self._clock.sleep(wait)
        return wait

    def pause(self, seconds: float) -> None:
        """Hold every caller for `seconds` (the API said 429), then resume one request at a time."""
        with self._lock:
            resume = self._clock.monotonic() + seconds + self._tolerance
            self._due = max(self._due, resume)

    def tighten(self, rate: float, burst: int) -> None:
        with self._lock:
            self.rate, self.burst = min(self.rate, rate), min(self.burst, burst)


class BucketRegistry:
    """Buckets by credential key: every stream using one credential shares one bucket."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def bucket(self, key: str, rate: float, burst: int, clock: Clock) -> TokenBucket:
        """The bucket for `key`; if streams declare different limits for one credential, the stricter wins."""
        with self._lock:
            found = self._buckets.get(key)
            if found is None:
                found = self._buckets[key] = TokenBucket(rate, burst, clock)
            elif (rate, burst) != (found.rate, found.burst):
                found.tighten(rate, burst)
            return found


SHARED_BUCKETS = BucketRegistry()  # the process's buckets (empty until a client asks)


@dataclass(frozen=True)
class RetryPolicy:
    """When to try a request again, and for how long.

    429s pause the source (as long as the API asks, up to `max_rate_limited_seconds` per request);
    5xx, 408, timeouts and dropped connections are retried `max_attempts` times in all, within
    `max_elapsed_seconds`, with exponential backoff and full jitter; other 4xx fail at once.
    """

    max_attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_elapsed_seconds: float = 300.0
    max_rate_limited_seconds: float = 900.0

    def backoff(self, failures: int, rng: random.Random) -> float:
        """Full jitter: uniform between 0 and the exponential ceiling for the `failures`-th failure."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * 2 ** (failures - 1)))


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds a `Retry-After` header asks for (delay-seconds or an HTTP-date); None if absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    if _DECIMAL_SECONDS.fullmatch(text):  # not RFC 9110, but APIs send "1.5": read as asked
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        logger.warning("ignoring an unreadable Retry-After header %r", text[:64])
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
