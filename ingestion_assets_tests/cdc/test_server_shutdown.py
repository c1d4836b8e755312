"""A source server shut down (fast) while a live session reads its slot: the slot stays behind what the
reader acknowledged, and the session does not hold the shutdown up."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from ingestion_assets.sources.postgres.cdc.errors import CdcError
from ingestion_assets.sources.postgres.cdc.live import LiveReader
from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets_tests.cdc.sandbox import Sandbox, confirmed_flush, prepare

POLL_FOR_SECONDS = 20.0  # a reader left polling this long would hold the shutdown up as long


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    """A server of the test's own: it is shut down in the middle."""
    root = Path(tempfile.mkdtemp(prefix="ingest-cdc-stop-"))
    pg = EmbeddedPostgres(root / "pg")
    try:
        yield pg.ensure_running()
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def _poll(reader: LiveReader, ended: threading.Event) -> None:
    """Read batches as a live run waiting for changes does, until the session ends or the test gives up."""
    deadline = time.monotonic() + POLL_FOR_SECONDS
    try:
        while time.monotonic() < deadline and not ended.is_set():
            reader.next_batch(ended.is_set)
    except CdcError:
        pass


def _poll_and_acknowledge(reader: LiveReader, ended: threading.Event) -> None:
    """A live run whose every batch is stored at once: each is acknowledged as soon as it is read."""
    deadline = time.monotonic() + POLL_FOR_SECONDS
    try:
        while time.monotonic() < deadline and not ended.is_set():
            batch = reader.next_batch(ended.is_set)
            if batch.transactions:
                reader.acknowledge(batch.transactions[-1].end_lsn)
    except CdcError:
        pass


def _write(url: str, table: str, ended: threading.Event) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            key = 100
            while not ended.is_set():
                key += 1
                cur.execute(f"INSERT INTO {table} VALUES (%s, 'writer')", (key,))
                time.sleep(0.002)
    except psycopg2.Error:
        pass  # the shutdown ends the writer's session
    finally:
        conn.close()


def _shut_down_while_polling(server: EmbeddedPostgres, reader: LiveReader) -> float:
    ended = threading.Event()
    poller = threading.Thread(target=_poll, args=(reader, ended))
    poller.start()
    time.sleep(0.5)
    return _shut_down(server, ended, poller)


def _shut_down(server: EmbeddedPostgres, ended: threading.Event, poller: threading.Thread) -> float:
    began = time.monotonic()
    server.stop("fast")
    took = time.monotonic() - began
    ended.set()
    poller.join()
    server.ensure_running()
    return took


@pytest.mark.parametrize("unacknowledged", [False, True], ids=["all-acknowledged", "batch-in-flight"])
def test_a_fast_shutdown_never_moves_the_slot_past_the_acknowledged_position(
    server: EmbeddedPostgres, unacknowledged: bool
) -> None:
    box = Sandbox(server.ensure_database("cdc"))
    box.setup()
    t = prepare(box)
    start = confirmed_flush(box)
    with LiveReader(
        box.url, box.slot, box.publication, start, max_changes=100, batch_seconds=0.2, lifetime_seconds=60
    ) as reader:
        box.execute(f"INSERT INTO {t} VALUES (1, 'stored')")
        batch = reader.next_batch()
        while not batch.transactions:
            batch = reader.next_batch()
        stored = batch.transactions[-1].end_lsn  # the checkpoint a run stores, then acknowledges
        reader.acknowledge(stored)
        # A restart point the slot takes once a reply passes it: the walsender then saves the slot at once,
        # so what it is told after the shutdown checkpoint outlives the restart.
        box.query("SELECT pg_log_standby_snapshot()")
        if unacknowledged:  # a transaction read whose load and checkpoint never happen
            box.execute(f"INSERT INTO {t} VALUES (2, 'in flight')")
            while not reader.next_batch().transactions:
                pass
        took = _shut_down_while_polling(server, reader)
    assert confirmed_flush(box) <= stored  # the server's shutdown checkpoint lies after it: never acknowledged
    assert took < 5.0  # 0.2 s without a reader


def test_a_fast_shutdown_after_a_writer_leaves_the_slot_at_the_last_acknowledged_batch(
    server: EmbeddedPostgres,
) -> None:
    box = Sandbox(server.ensure_database("cdc"))
    box.setup()
    t = prepare(box)
    start = confirmed_flush(box)
    writing, ended = threading.Event(), threading.Event()
    writer = threading.Thread(target=_write, args=(box.url, t, writing))
    acknowledged: list[int] = []
    with LiveReader(
        box.url, box.slot, box.publication, start, max_changes=100, batch_seconds=0.2, lifetime_seconds=60
    ) as reader:
        send = reader.acknowledge
        reader.acknowledge = lambda lsn: (send(lsn), acknowledged.append(lsn))  # type: ignore[method-assign]
        poller = threading.Thread(target=_poll_and_acknowledge, args=(reader, ended))
        poller.start()
        writer.start()
        time.sleep(1.0)
        writing.set()
        writer.join()
        time.sleep(1.0)  # every write read and acknowledged
        box.query("SELECT pg_log_standby_snapshot()")
        took = _shut_down(server, ended, poller)
    assert acknowledged
    assert confirmed_flush(box) <= acknowledged[-1]
    assert took < 5.0
