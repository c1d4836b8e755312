"""The per-source slot lock on a real server: a run that finds it taken says at once who holds it; a live run
that finds another live run's lock fails at once (not retried); other runs wait for it, saying so."""

from __future__ import annotations

import psycopg2
import pytest

from ingestion_assets.sources.postgres.cdc import SlotInUseError
from ingestion_assets.sources.postgres.cdc.slot_lock import SlotHeldByLiveRun, lock_key, reading_slot
from ingestion_assets_tests.cdc.sandbox import Sandbox


def _hold(sandbox: Sandbox, application: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(sandbox.url, application_name=application)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (lock_key(sandbox.slot),))
    return conn


def test_a_slot_held_by_a_live_run_fails_a_second_run_at_once_naming_it(sandbox: Sandbox) -> None:
    holder = _hold(sandbox, "ingest-cdc-lock live run-one")
    said: list[str] = []
    try:
        with (
            pytest.raises(SlotHeldByLiveRun) as refused,
            reading_slot(sandbox.url, sandbox.slot, 600, "two", True, said.append),
        ):
            pass
    finally:
        holder.close()
    assert not refused.value.transient and said == []
    message = str(refused.value)
    assert f"slot {sandbox.slot!r} is held by Dagster run run-one (a live run) (backend pid" in message


def test_a_slot_held_by_another_run_is_waited_for_saying_so(sandbox: Sandbox) -> None:
    holder = _hold(sandbox, "ingest-cdc-lock run run-one")
    said: list[str] = []
    try:
        with (
            pytest.raises(SlotInUseError) as waited,
            reading_slot(sandbox.url, sandbox.slot, 1, "two", True, said.append),
        ):
            pass
    finally:
        holder.close()
    assert waited.value.transient
    assert len(said) == 1 and "held by Dagster run run-one (backend pid" in said[0] and "waiting up to 1 s" in said[0]
    assert "held by Dagster run run-one" in str(waited.value)
    with reading_slot(sandbox.url, sandbox.slot, 1, "two", True, said.append):  # released: taken at once
        pass
    assert len(said) == 1


def test_a_history_range_run_waits_for_a_live_run_saying_so(sandbox: Sandbox) -> None:
    holder = _hold(sandbox, "ingest-cdc-lock live run-one")
    said: list[str] = []
    try:
        with pytest.raises(SlotInUseError), reading_slot(sandbox.url, sandbox.slot, 1, "two", False, said.append):
            pass
    finally:
        holder.close()
    assert len(said) == 1 and "held by Dagster run run-one (a live run) (backend pid" in said[0]
