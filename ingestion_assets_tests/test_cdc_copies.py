"""CDC copies that resume (issue 13): a table copied beside the log goes in checkpointed key ranges, so a copy
killed at range N goes on after the last committed range instead of starting again, exactly, with the source
application writing in copied and uncopied ranges all along (embedded PostgreSQL 18)."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings
from ingestion_assets.stack.embedded import EmbeddedPostgres
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import SourceDb, StreamHarness
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


@pytest.fixture
def own_source(tmp_path: Path) -> Iterator[SourceDb]:
    """A source server of its own (nothing else writes WAL there, Dagster's storage included) whose commits wait
    for a synchronous standby that never answers, for the sessions that ask for it (synchronous_commit = on);
    every other session commits locally."""
    root = Path(tempfile.mkdtemp(prefix="ingest-syncrep-"))
    server = EmbeddedPostgres(root / "pg")
    try:
        url = server.ensure_running().ensure_database("shop")
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
            cur.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            cur.execute("SELECT pg_reload_conf()")
        conn.close()
        db = SourceDb(url=url, schema="app")
        db.create_schema()
        yield db
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


# unpublished: slow (the wait for older writers covers it; it passed before the fix too)
@pytest.mark.parametrize("published", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_copy_never_sets_back_a_commit_it_cannot_see_yet(
    tmp_path: Path,
    session_settings: Settings,
    instance: dg.DagsterInstance,
    own_source: SourceDb,
    published: bool,
) -> None:
    """A commit is decoded once its record is flushed, but stays invisible to new snapshots while its session
    waits for a synchronous standby. A copy must not copy the row as it was before it: neither after its log
    catch-up applied the commit (published) nor when the commit wrote the table before it was published (found
    in CI as a flaky test: the same window, microseconds long, without a standby)."""
    source = own_source
    harness = StreamHarness(tmp_path=tmp_path, home=session_settings.home, instance=instance, source=source)
    source.execute(CUSTOMERS + "CREATE TABLE orders (id int PRIMARY KEY, name text);")
    source.execute("INSERT INTO orders SELECT g, 'o' || g FROM generate_series(1, 50) g")
    both = {"orders": {}, "customers": {}}
    _catalog(harness, both if published else {"orders": {}}, snapshot_slice_rows=50)
    harness.materialize()  # the slot exists, the tables are copied
    if published:
        harness.execute_target(f'DROP TABLE "{harness.source_name}".customers')  # the next run copies it again
    waiting = psycopg2.connect(source.url)
    with waiting.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
        cur.execute(f"UPDATE \"{source.schema}\".customers SET name = 'after' WHERE id = 7")
    committing = threading.Thread(target=waiting.commit)  # flushed, then waits for the standby
    committing.start()
    try:
        time.sleep(0.5)
        assert source.rows("customers", "id")[6] == (7, "c7")  # committed, not visible yet
        release = threading.Timer(4.0, lambda: source.execute(f"SELECT pg_cancel_backend({pid})"))
        release.start()  # the standby wait ends: the commit becomes visible
        _catalog(harness, both, snapshot_slice_rows=50)
        harness.materialize()  # customers' copy, while the commit is invisible
        release.join()
    finally:
        committing.join(timeout=30)
        waiting.close()
    assert source.rows("customers", "id")[6] == (7, "after")
    _assert_exact(harness, "customers")
    _assert_exact(harness, "orders")


def test_a_history_range_copied_on_an_idle_source_keeps_its_rows(
    tmp_path: Path, session_settings: Settings, instance: dg.DagsterInstance, own_source: SourceDb
) -> None:
    """On a source that writes nothing else, a range's snapshot can be taken at the very WAL position the
    streams are checkpointed at: the range's rows must stay (their version sits just below that position)."""
    source = own_source
    harness = StreamHarness(tmp_path=tmp_path, home=session_settings.home, instance=instance, source=source)
    source.execute(CUSTOMERS)
    _catalog(harness, {"customers": {}}, history_chunk=1000)
    harness.instance.add_dynamic_partitions(f"{harness.source_name}__cdc", [LIVE])
    harness.materialize(partition=LIVE)  # the slot and the planned range; nothing copied
    source.execute("UPDATE customers SET name = 'x' WHERE id = 1")
    harness.materialize(partition=LIVE)  # checkpointed at the end of that commit: the server's last WAL
    harness.materialize(partition="0-999")
    _assert_exact(harness, "customers")


def test_the_first_copy_says_which_open_transaction_it_waits_for(cdc: StreamHarness) -> None:
    """Creating the slot waits for every transaction open at the source: a session left idle in a transaction
    that wrote holds the first run, which says so (pid, state, age) instead of looking hung; and a first run says
    it copies a new stream, not that it goes on with a copy an earlier run began."""
    harness = cdc
    harness.source.execute(CUSTOMERS + "CREATE TABLE notes (id int);")
    _catalog(harness, {"customers": {}})
    holder = psycopg2.connect(harness.source.url)
    with holder.cursor() as cur:
        cur.execute(f'INSERT INTO "{harness.source.schema}".notes VALUES (1)')
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    told = (
        "SELECT 1 FROM pg_stat_activity WHERE application_name = 'ingest-cdc-wait' AND state = 'idle' "
        "AND query LIKE '%backend_xid%'"
    )

    def end_once_told() -> None:  # the run read pg_stat_activity: its message follows
        deadline = time.monotonic() + 60
        while not harness.query_source(told) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        holder.rollback()

    ender = threading.Thread(target=end_once_told)
    ender.start()
    try:
        result = harness.materialize()
    finally:
        ender.join()
        holder.close()
    logs = " ".join(e.user_message for e in harness.instance.all_logs(result.run_id))
    assert f"creating replication slot ingest_{harness.source_name} for the first copy: waiting for" in logs
    assert f"pid {pid} (xid " in logs and "idle in transaction, transaction open" in logs
    assert "an earlier run began" not in logs
    assert f"{harness.source_name}.customers: copying its table (new to the source" in logs
    _assert_exact(harness, "customers")
