"""The real chaos run, short: SIGKILLed Dagster runs and a crashed storage server, then every target equals
its source row by row. `make chaos TRIALS=N` runs the long configuration (RELIABILITY.md)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingestion_assets_tests.chaos.run import Chaos, ChaosConfig


@pytest.fixture
def chaos_home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ingest-chaos-test-"))  # not pytest's 0700 root: see conftest.home
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_kills_and_a_storage_crash_lose_and_duplicate_nothing(chaos_home: Path) -> None:
    config = ChaosConfig(
        trials=3, seed=3, kinds=("kill", "restart", "kill"), horizon=9.0, items=5_000, events=1_500, api_orders=200
    )
    chaos = Chaos(chaos_home, config)
    try:
        report = chaos.run(say=lambda line: None)
    finally:
        chaos.settings.embedded.stop()
    summary = "\n".join(report.lines())
    assert report.trials == 3
    assert set(report.compared) == {"tbl/items", "cdc/events", "api/orders"}, summary
    assert all(count > 0 for count in report.compared.values()), summary
    assert report.ok, summary
