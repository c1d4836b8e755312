"""Fixtures for the HTTP API tests: the demo API on a free loopback port, a private governor, captured logs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets.sources.rest import BucketRegistry

StartApi = Callable[..., DemoApi]


@pytest.fixture
def start_api() -> Iterator[StartApi]:
    """Start demo APIs with config overrides (small data, ties of 7); every one is stopped afterwards."""
    started: list[DemoApi] = []

    def start(**overrides: Any) -> DemoApi:
        api = start_demo_api(**{"orders": 137, "customers": 61, "tie_group": 7, **overrides})
        started.append(api)
        return api

    try:
        yield start
    finally:
        for api in started:
            api.stop()


@pytest.fixture
def api(start_api: StartApi) -> DemoApi:
    return start_api()


@pytest.fixture
def buckets() -> BucketRegistry:
    """A registry of this test's own, so one test's pace never slows the next."""
    return BucketRegistry()


class CapturedLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(f"{r.name} {r.levelname} {r.getMessage()}" for r in self.records)


@pytest.fixture
def logs() -> Iterator[CapturedLogs]:
    """Every log record at DEBUG and up (works with `-p no:logging`, where caplog does not exist)."""
    handler, root = CapturedLogs(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
