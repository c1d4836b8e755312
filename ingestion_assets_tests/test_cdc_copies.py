"""CDC copies that resume (issue 13): a table copied beside the log goes in checkpointed key ranges, so a copy
killed at range N goes on after the last committed range instead of starting again, exactly, with the source
application writing in copied and uncopied ranges all along (embedded PostgreSQL 18)."""

from __future__ import annotations

import time

import pytest

from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import Writer, _assert_exact, _catalog, _drain, _metadata
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

CUSTOMERS = """
CREATE TABLE customers (id int PRIMARY KEY, name text);
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 200) g;
"""
# A text key (no integer ranges): keyset order on the primary key, whatever its type.
ACCOUNTS = """
CREATE TABLE accounts (code text PRIMARY KEY, id int NOT NULL, balance int NOT NULL);
INSERT INTO accounts SELECT 'k' || lpad(g::text, 5, '0'), g, g FROM generate_series(1, 2000) g;
"""
KEY = "'k' || lpad(%(k)s::text, 5, '0')"
SLICE = 200


def _copy_state(harness: StreamHarness, stream: str) -> dict[str, object] | None:
    checkpoint = harness.checkpoint(stream)
    assert checkpoint is not None
    copy = checkpoint.details.get("copy")
    return copy if isinstance(copy, dict) else None


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_a_copy_killed_mid_way_resumes_after_its_last_range_exactly(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, kill: bool
) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ACCOUNTS)
    _catalog(harness, {"customers": {}}, snapshot_slice_rows=SLICE)
    harness.materialize()
    app = [  # all over the key space: ranges copied already and ranges not copied yet
        (f"UPDATE accounts SET balance = balance + 1 WHERE code = {KEY}", 2000),
        (f"DELETE FROM accounts WHERE code = {KEY}", 2000),
        ("INSERT INTO accounts VALUES ('k' || %(n)s::text, %(n)s, 0)", 1),
        (f"UPDATE accounts SET code = 'a' || code WHERE code = {KEY}", 2000),  # a key moving to copied ranges
        (f"UPDATE accounts SET code = 'z' || code WHERE code = {KEY}", 2000),  # and to ranges not copied yet
        ("UPDATE customers SET name = name || '+' WHERE id = %(k)s", 200),
    ]
    with Writer(harness.source.url, harness.source.schema, app, pause=0.02) as writer:
        _catalog(harness, {"customers": {}, "accounts": {"primary_key": "code"}}, snapshot_slice_rows=SLICE)
        if kill:  # SIGKILL after range 4 is loaded, before its checkpoint
            both = f"accounts,{harness.source_name}/customers"  # the source's assets run together
            process = harness.materialize_cli(both, **{FAULT_ENV: "after_snapshot_slice:4:kill"})
            assert process.wait(timeout=300) != 0
        else:
            monkeypatch.setenv(FAULT_ENV, "after_snapshot_slice:4")
            assert not harness.materialize(raise_on_error=False).success
            monkeypatch.delenv(FAULT_ENV)
        copy = _copy_state(harness, "accounts")
        assert copy is not None and copy["ranges"] == 4  # ranges 0-3 are committed, range 4 died unrecorded
        done = int(str(copy["rows"]))
        assert copy["after"] is not None and done >= SLICE
        time.sleep(0.2)
        result = harness.materialize()
        again = _metadata(result, harness, "accounts")["rows read"]
        assert _copy_state(harness, "accounts") is None and _metadata(result, harness, "accounts")["copied"] is True
        harness.materialize()
    assert writer.errors == [] and writer.writes > 50
    # Only what the committed ranges did not cover is read again (the log's few changes aside).
    assert again <= 2000 + writer.writes - done + SLICE
    _drain(harness)
    _assert_exact(harness, "customers")
    columns = harness.source.columns("accounts")
    target = harness.target_rows_where("accounts", columns, "code", "_ingest_deleted_at IS NULL")
    assert sorted(target) == sorted(harness.source.rows("accounts", "code"))
