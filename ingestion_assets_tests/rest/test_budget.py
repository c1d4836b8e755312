"""The request budget: pages read ahead into a bounded queue while slices load, slices that take what waits,
and a sync paced at the API's own limit that never gets a 429. Rates themselves are measured in
bench/api_rate.py, never asserted here."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.defs.assets import catalog_streams
from ingestion_assets.settings import Settings
from ingestion_assets.sources.rest.read_ahead import ReadAhead
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.streams.runner import PartitionJob
from ingestion_assets_tests.rest.conftest import StartApi
from ingestion_assets_tests.rest.helpers import resource_requests


class _Store:
    def __init__(self) -> None:
        self.history: list[Checkpoint] = []

    def latest(self, partition: str | None) -> Checkpoint | None:
        return self.history[-1] if self.history else None

    def commit(self, partition: str | None, position: dict[str, Any] | None, **details: Any) -> None:
        self.history.append(Checkpoint(position, "test", dt.datetime.now(dt.UTC), len(self.history), details))


def test_read_ahead_is_bounded_and_a_take_gets_what_waits() -> None:
    advanced: list[int] = []

    def items() -> Iterator[int]:
        for number in range(100):
            advanced.append(number)
            yield number

    ahead = ReadAhead(items(), depth=5)
    try:
        assert ahead.take(1, 1) == [0]
        deadline = time.monotonic() + 5
        while ahead.waiting() < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert ahead.waiting() == 5 and len(advanced) <= 1 + 5 + 1  # the queue, and the one it holds
        taken = ahead.take(2, 40)  # what waits, not only the two asked for
        assert taken[:5] == [1, 2, 3, 4, 5] and taken == list(range(1, len(taken) + 1))
    finally:
        ahead.close()
    assert len(advanced) < 100  # closing stopped the reader


def test_a_gathering_take_waits_for_a_full_queue_the_end_or_an_old_page() -> None:
    def trickle(release: threading.Event) -> Iterator[int]:
        yield from range(8)
        release.wait(30)  # a read that goes quiet: the pages waiting are loaded once old enough
        yield 8

    release = threading.Event()
    ahead = ReadAhead(trickle(release), depth=5)
    try:
        assert ahead.take(1, 1, gather=30) == [0] and ahead.waiting() >= 4  # the queue had filled first
        assert ahead.take(1, 10, gather=30)[:5] == [1, 2, 3, 4, 5]  # full: taken at once
    finally:
        release.set()
        ahead.close()
    release = threading.Event()
    quiet = ReadAhead(trickle(release), depth=50)
    try:
        assert quiet.take(1, 50, gather=1.0) == list(range(8))  # the oldest waited 1 s: taken, not 30 s
        release.set()
        assert quiet.take(1, 50, gather=30) == [8] and quiet.take(1, 50, gather=30) == []  # the read ended
    finally:
        quiet.close()


def test_a_failure_in_the_reader_comes_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("the API broke")

    ahead = ReadAhead(items(), depth=10)
    try:
        assert ahead.take(5, 5) == [1, 2]
        with pytest.raises(ValueError, match="the API broke"):
            ahead.take(1, 5)
    finally:
        ahead.close()


@pytest.mark.parametrize("latency", [0.001, pytest.param(0.05, marks=pytest.mark.slow)])
def test_a_4000_record_sync_at_the_apis_own_limit_gets_no_429(
    start_api: StartApi, tmp_path: Path, latency: float
) -> None:
    api = start_api(orders=4000, latency=latency, rate=20.0, burst=5, token_ttl=3600.0)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "id").write_text(api.config.client_id)
    (secrets / "secret").write_text(api.config.client_secret)
    auth = {"type": "oauth2_client_credentials", "token_url": "/oauth/token"}
    auth |= {"client_id": {"file": str(secrets / "id")}, "client_secret": {"file": str(secrets / "secret")}}
    stream = {"path": "/v1/orders", "primary_key": "id", "page_size": 100, "pages_per_slice": 5}
    source = {"type": "rest", "base_url": api.url, "auth": auth, "streams": {"orders": stream}}
    source["rate_limit"] = {"requests_per_second": 20, "burst": 5}  # exactly what the server allows
    warehouse = tmp_path / "warehouse.duckdb"
    path = tmp_path / "catalog.yaml"
    path.write_text(
        yaml.safe_dump({"destination": {"type": "duckdb", "path": str(warehouse)}, "sources": {"crm": source}})
    )
    (orders,) = catalog_streams(Settings(home=tmp_path / "home", catalog_path=path), load_catalog(path))

    changes = threading.Event()

    def writer() -> None:  # the data changes while it is read
        rng = random.Random(3)
        while not changes.wait(0.2):
            api.mutate("orders", inserts=rng.randint(0, 3), updates=rng.randint(0, 5))

    thread, store = threading.Thread(target=writer), _Store()
    thread.start()
    try:
        PartitionJob(orders, store).run()  # type: ignore[arg-type]
    finally:
        changes.set()
        thread.join()
    PartitionJob(orders, store).run()  # type: ignore[arg-type]  # the tail, with nothing changing
    statuses = [e["status"] for e in resource_requests(api)]
    assert statuses and set(statuses) == {200}  # not one 429
    with duckdb.connect(str(warehouse), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        rows = con.execute(
            "SELECT id, strftime(updated_at, '%Y-%m-%dT%H:%M:%S.%fZ'), status, number FROM crm.orders"
        ).fetchall()
    expected = {(r["id"], r["updated_at"], r["status"], r["number"]) for r in api.records("orders")}
    assert len(rows) == len({r[0] for r in rows}) and set(rows) == expected


def test_favouring_the_reader_is_undone_when_the_last_overlapping_read_ends() -> None:
    import gc
    import sys

    from ingestion_assets.sources.rest.read_ahead import favour_the_reader

    before = sys.getswitchinterval()
    first, second = favour_the_reader(), favour_the_reader()
    first.__enter__()
    second.__enter__()  # two streams reading at once in one process
    assert sys.getswitchinterval() <= 0.001 and gc.get_freeze_count() > 0
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() <= 0.001  # the other read still runs
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before and gc.get_freeze_count() == 0


def test_loads_run_in_a_thread_of_their_own_below_the_readers_priority_and_end_with_it() -> None:
    import os
    import sys

    from ingestion_assets.sources.rest.read_ahead import BackgroundLoads

    def where() -> tuple[int, int]:
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)

    mine = where()
    with BackgroundLoads(niceness=5) as loads:
        tid, nice = loads.run(where)
        assert loads.run(where)[0] == tid  # one thread for every load of the read, one load at a time
        with pytest.raises(ValueError, match="bad slice"):
            loads.run(lambda: (_ for _ in ()).throw(ValueError("bad slice")))
    assert tid != mine[0]
    if sys.platform.startswith("linux"):
        assert nice == min(19, mine[1] + 5)
    assert where() == mine  # the caller's priority is untouched
    assert all(t.native_id != tid for t in threading.enumerate())  # the lowered thread is gone
