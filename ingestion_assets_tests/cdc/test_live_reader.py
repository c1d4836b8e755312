"""A live session (LiveReader): one replication connection for many batches, acknowledged only on request."""

from __future__ import annotations

import time

import pytest

from ingestion_assets.errors import classify
from ingestion_assets.sources.postgres.cdc import read_changes
from ingestion_assets.sources.postgres.cdc.errors import CdcError
from ingestion_assets.sources.postgres.cdc.live import LiveReader
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


def test_a_session_ended_by_an_operator_is_a_transient_failure(sandbox: Sandbox) -> None:
    prepare(sandbox)
    start = confirmed_flush(sandbox)
    with LiveReader(
        sandbox.url, sandbox.slot, sandbox.publication, start, max_changes=3, batch_seconds=0.2, lifetime_seconds=30
    ) as reader:
        sandbox.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
            params=(sandbox.slot,),
        )
        with pytest.raises(CdcError) as raised:
            for _ in range(200):  # the batches read before the session ended, then its failure
                reader.next_batch()
    # An operator's pg_terminate_backend (57P01) is no fault of the run: retried, like a dropped connection.
    assert classify(raised.value).transient and "terminating connection due to administrator command" in str(raised.value)

