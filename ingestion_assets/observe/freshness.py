"""Freshness measured: commit-to-target latency of each change, recorded in an HDR histogram per run and
stored (encoded) in the run's metadata, so histograms of many runs and workers merge exactly and p99
survives aggregation (an average of percentiles would not)."""

from __future__ import annotations

from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

LOWEST_MS = 1
HIGHEST_MS = 30 * 24 * 3600 * 1000  # a month: a change older than that is clamped to it
SIGNIFICANT_DIGITS = 3
HISTOGRAM = "freshness histogram"  # the run's histogram, HDR-encoded (base64 of the compressed form)
PERCENTILES = (50.0, 95.0, 99.0)


def empty() -> HdrHistogram:
    return HdrHistogram(LOWEST_MS, HIGHEST_MS, SIGNIFICANT_DIGITS)


def record(latencies_ms: Iterable[float]) -> HdrHistogram:
    histogram = empty()
    for value in latencies_ms:
        histogram.record_value(min(max(round(value), LOWEST_MS), HIGHEST_MS))
    return histogram


def encode(histogram: HdrHistogram) -> str:
    return histogram.encode().decode("ascii")


def merged(encoded: Iterable[str]) -> HdrHistogram:
    """One histogram of many runs' (or workers') histograms."""
    total = empty()
    for text in encoded:
        total.add(HdrHistogram.decode(text.encode("ascii")))
    return total


def percentiles(histogram: HdrHistogram) -> dict[str, float]:
    """{"p50": ms, "p95": ms, "p99": ms}; empty when nothing was recorded."""
    if histogram.get_total_count() == 0:
        return {}
    return {f"p{p:g}": float(histogram.get_value_at_percentile(p)) for p in PERCENTILES}


def freshness_metadata(latencies_ms: list[float]) -> dict[str, float | str]:
    """The run's metadata: the encoded histogram and p50/p95/p99 as numbers (Dagster plots them over runs)."""
    if not latencies_ms:
        return {}
    return histogram_metadata(record(latencies_ms))


def histogram_metadata(histogram: HdrHistogram) -> dict[str, float | str]:
    """`freshness p50 ms` / `p95` / `p99` and the encoded histogram; empty when nothing was recorded."""
    if histogram.get_total_count() == 0:
        return {}
    figures: dict[str, float | str] = {f"freshness {name} ms": value for name, value in percentiles(histogram).items()}
    figures[HISTOGRAM] = encode(histogram)
    return figures
