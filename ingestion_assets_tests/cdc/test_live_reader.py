"""A live session (LiveReader): one replication connection for many batches, acknowledged only on request."""

from __future__ import annotations

import threading
import time

import pytest

from ingestion_assets.errors import classify
from ingestion_assets.sources.postgres.cdc import read_changes
from ingestion_assets.sources.postgres.cdc.errors import CdcError
from ingestion_assets.sources.postgres.cdc.live import LiveReader, ReadAhead
from ingestion_assets_tests.cdc.sandbox import Sandbox, confirmed_flush, prepare


def test_a_held_session_hands_out_batches_and_moves_the_slot_only_when_told(sandbox: Sandbox) -> None:
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    with LiveReader(
        sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=3, batch_seconds=0.2, lifetime_seconds=30
    ) as reader:
        sandbox.execute(f"INSERT INTO {t} SELECT g, 'a' FROM generate_series(1, 3) g")
        sandbox.execute(f"INSERT INTO {t} SELECT g, 'b' FROM generate_series(4, 10) g")
        first = reader.next_batch()
        while not first.transactions:
            first = reader.next_batch()
        second = reader.next_batch()
        names = [c.new_record()["name"] for b in (first, second) for c in b.changes]
        assert names == ["a"] * 3 + ["b"] * 7  # whole transactions, in commit order, across batches
        assert confirmed_flush(sandbox) == start  # read is not stored: nothing acknowledged
        reader.acknowledge(first.end_lsn)
        deadline = time.monotonic() + 10
        while confirmed_flush(sandbox) < first.end_lsn and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.end_lsn <= confirmed_flush(sandbox) < second.end_lsn
    # The next reader starts where the acknowledged position is: the second transaction comes again.
    again = read_changes(sandbox.url, sandbox.slot, sandbox.publication, None)
    assert [c.new_record()["name"] for c in again.changes] == ["b"] * 7


def test_reading_ahead_hands_out_the_same_batches_and_sends_only_the_acknowledgements_it_was_given(
    sandbox: Sandbox,
) -> None:
    """ReadAhead reads the next batch while the caller loads one: same order, and the slot moves only behind what
    the caller acknowledged (a batch read ahead but not taken is read again by the next session)."""
    t = prepare(sandbox)
    start = confirmed_flush(sandbox)
    for letter, first in (("a", 1), ("b", 4), ("c", 11)):
        sandbox.execute(f"INSERT INTO {t} SELECT g, '{letter}' FROM generate_series({first}, {first + 2}) g")
    reader = LiveReader(
        sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=3, batch_seconds=0.2, lifetime_seconds=30
    )
    with reader, ReadAhead(reader, lambda: False) as ahead:
        batches = [ahead.next_batch() for _ in range(2)]
        while not batches[0].transactions:
            batches = [*batches[1:], ahead.next_batch()]
        time.sleep(0.5)  # the third transaction is read ahead meanwhile
        assert [c.new_record()["name"] for b in batches for c in b.changes] == ["a"] * 3 + ["b"] * 3
        ahead.acknowledge(batches[0].end_lsn)
    assert confirmed_flush(sandbox) == batches[0].end_lsn  # sent, at the latest when the reading ended
    again = read_changes(sandbox.url, sandbox.slot, sandbox.publication, None)
    assert [c.new_record()["name"] for c in again.changes] == ["b"] * 3 + ["c"] * 3


def test_a_failure_of_the_session_read_ahead_reaches_the_caller(sandbox: Sandbox) -> None:
    prepare(sandbox)
    start = confirmed_flush(sandbox)
    reader = LiveReader(
        sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=3, batch_seconds=0.2, lifetime_seconds=30
    )
    with reader, ReadAhead(reader, lambda: False) as ahead:
        sandbox.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
            params=(sandbox.slot,),
        )
        with pytest.raises(CdcError) as raised:
            for _ in range(200):  # the batches read before the session ended, then its failure
                ahead.next_batch()
    # An operator's pg_terminate_backend (57P01) is no fault of the run: retried, like a dropped connection.
    assert classify(raised.value).transient and "terminating connection due to administrator command" in str(raised.value)


def test_reading_ahead_ends_when_the_run_stops(sandbox: Sandbox) -> None:
    prepare(sandbox)
    start = confirmed_flush(sandbox)
    stopping = threading.Event()
    reader = LiveReader(
        sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=3, batch_seconds=0.2, lifetime_seconds=30
    )
    with reader, ReadAhead(reader, stopping.is_set) as ahead:
        ahead.next_batch()
        stopping.set()
        for _ in range(3):  # at most the batch read ahead, then empty ones: nothing blocks
            last = ahead.next_batch()
        assert not last.transactions
