"""CDC streams over their lifetime (embedded PostgreSQL 18, DuckDB): a stream taken out of the catalog and put
back, a slot an operator dropped under `on_wal_gap: resync` and `fail`, and an incompatible type change accepted
with `ingest schema accept`. Each must end with the target equal to the source, row by row, and no other stream
of the source held up."""

from __future__ import annotations

import threading
import time

import pytest

from ingestion_assets.cli import main
from ingestion_assets.sources.postgres.cdc import drop_slot
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import CUSTOMERS, ORDERS, _assert_exact, _catalog, _failure, _metadata
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves


def _logs(harness: StreamHarness, run_id: str) -> str:
    return " ".join(e.user_message for e in harness.instance.all_logs(run_id))


@pytest.mark.parametrize("publication", ["ours", "own"])
def test_a_stream_put_back_in_the_catalog_is_copied_again_and_the_others_go_on(
    cdc: StreamHarness, publication: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its checkpoint is behind what the slot still holds: the product's publication dropped its table meanwhile
    (`ours`), or the runs of the other streams acknowledged the slot past it (`own`: a publication of the user's
    that kept publishing it). It takes a fresh copy, as a new stream does, not a WAL gap for the whole source."""
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    options = {}
    if publication == "own":
        options = {"publication": f"own_{harness.source_name}"}
        harness.source.execute(f"CREATE PUBLICATION own_{harness.source_name} FOR TABLE customers, orders")
    _catalog(harness, {"customers": {}, "orders": {}}, **options)
    harness.materialize()
    _catalog(harness, {"customers": {}}, **options)
    harness.source.execute("UPDATE customers SET name = 'x' WHERE id < 5; UPDATE orders SET note = 'y' WHERE id < 5")
    harness.source.execute(
        "DELETE FROM orders WHERE id BETWEEN 10 AND 19; INSERT INTO orders VALUES (5000, 'n', 1, '')"
    )
    harness.materialize()  # the slot is acknowledged past orders' checkpoint
    harness.source.execute("UPDATE orders SET status = 'gone by' WHERE id > 990; DELETE FROM orders WHERE id = 20")
    _catalog(harness, {"customers": {}, "orders": {}}, **options)
    harness.source.execute("UPDATE customers SET name = 'back' WHERE id = 7; UPDATE orders SET note = 'z' WHERE id = 1")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["cdc", "status", harness.source_name]) == 0  # no verdict against the slot: it serves customers
    assert "streams orders hold log positions" in capsys.readouterr().out
    try:
        result = harness.materialize(raise_on_error=False)
        assert result.success, _failure(result)
        orders, customers = _metadata(result, harness, "orders"), _metadata(result, harness, "customers")
        said = "was not in the publication" if publication == "ours" else "is behind the slot"
        assert orders["copied"] is True and said in orders["copy reason"]
        assert "copied" not in customers and "copy reason" not in customers
        assert f"{harness.source_name}.orders: copying its table again: its" in _logs(harness, result.run_id)
        harness.materialize()
        _assert_exact(harness, "orders")  # the rows deleted while it was out of the catalog are gone
        _assert_exact(harness, "customers")
    finally:
        if publication == "own":
            drop_slot(harness.source.url, f"ingest_{harness.source_name}")
            harness.source.execute(f"DROP PUBLICATION own_{harness.source_name}")


def test_a_dropped_slot_under_resync_is_made_again_and_every_stream_copied_exactly(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {"deletes": "soft"}}, on_wal_gap="resync")
    harness.materialize()
    slot = f"ingest_{harness.source_name}"
    harness.source.execute("UPDATE orders SET status = 'seen' WHERE id < 50")
    assert drop_slot(harness.source.url, slot)  # an operator drops it
    harness.source.execute(
        "DELETE FROM orders WHERE id BETWEEN 100 AND 149; UPDATE orders SET status = 'unseen' WHERE id > 900;"
        "DELETE FROM customers WHERE id > 190; INSERT INTO customers VALUES (500, 'new')"
    )
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    assert f"slot {slot!r} no longer exists" in _logs(harness, result.run_id)
    for stream in ("orders", "customers"):
        metadata = _metadata(result, harness, stream)
        assert metadata["mode"] == "snapshot" and slot in metadata["copy reason"], stream
    harness.source.execute("UPDATE orders SET note = 'after' WHERE id = 1")
    harness.materialize()
    _assert_exact(harness, "orders")  # the deletes made while the slot was gone are retired
    _assert_exact(harness, "customers")
    retired = f'SELECT count(*) FROM "{harness.source_name}".orders WHERE _ingest_deleted_at IS NOT NULL'
    assert harness.query_target(retired) == [(50,)]

    _catalog(harness, {"customers": {}, "orders": {"deletes": "soft"}}, on_wal_gap="fail")
    assert drop_slot(harness.source.url, slot)
    message = _failure(harness.materialize(raise_on_error=False))
    assert slot in message and "on_wal_gap: fail" in message and "cdc.on_wal_gap: resync" in message
    assert "no longer exists" in message and "drop the slot" not in message  # gone already: not advised again
    assert f"ingest state reset {harness.source_name}.orders" in message


def test_an_accepted_incompatible_type_change_retypes_the_target_and_the_stream_goes_on(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log still holds changes made before the ALTER, with values of the old type (text the new type cannot
    read): the stream's copy after the accept supersedes them, so they must not stop every later run."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE readings (id int PRIMARY KEY, v text, note text);"
        "INSERT INTO readings SELECT g, (g * 10)::text, 'r' || g FROM generate_series(1, 500) g;" + CUSTOMERS
    )
    _catalog(harness, {"readings": {}, "customers": {}})
    harness.materialize()
    harness.source.execute(
        "UPDATE readings SET v = 'n/a' WHERE id BETWEEN 30 AND 35; DELETE FROM readings WHERE id = 36"
    )
    harness.source.execute("UPDATE readings SET v = '0' WHERE v = 'n/a'")  # cleaned up before the ALTER
    harness.source.execute("ALTER TABLE readings ALTER COLUMN v TYPE int USING v::int")
    harness.source.execute(
        "UPDATE readings SET v = v + 1 WHERE id BETWEEN 10 AND 20; DELETE FROM readings WHERE id = 30"
    )
    message = _failure(harness.materialize(raise_on_error=False))
    assert f"ingest schema accept {harness.source_name}.readings" in message
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "accept", f"{harness.source_name}.readings"]) == 0
    harness.source.execute("UPDATE readings SET v = -1 WHERE id = 40; UPDATE customers SET name = 'on' WHERE id = 3")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    assert _metadata(result, harness, "readings")["copied"] is True
    harness.source.execute("UPDATE readings SET v = 99 WHERE id <= 3; INSERT INTO readings VALUES (600, 6, 'x')")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    _assert_exact(harness, "readings")
    _assert_exact(harness, "customers")
    typed = harness.query_target(
        f"SELECT data_type FROM information_schema.columns WHERE table_schema = '{harness.source_name}' "
        "AND table_name = 'readings' AND column_name = 'v'"
    )
    assert typed == [("INTEGER",)]


def test_a_type_change_made_while_a_live_run_reads_fails_it_naming_the_stream_and_the_next_run_copies(
    cdc: StreamHarness,
) -> None:
    """The run parses the log with the types it found at its start; a value of the new type it cannot read
    (text into int) fails the run naming the stream, and the next run copies the table with its new types."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE readings (id int PRIMARY KEY, v int);"
        "INSERT INTO readings SELECT g, g FROM generate_series(1, 200) g;" + CUSTOMERS
    )
    _catalog(harness, {"readings": {}, "customers": {}})
    harness.materialize()
    _catalog(harness, {"readings": {}, "customers": {}}, live_seconds=20, batch_seconds=0.3)
    slot = f"ingest_{harness.source_name}"

    def change_while_live() -> None:
        deadline = time.monotonic() + 30
        active = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
        while harness.query_source(active) != [(1,)] and time.monotonic() < deadline:
            time.sleep(0.05)  # the live run holds its replication session: its types are settled
        harness.source.execute(
            "ALTER TABLE readings ALTER COLUMN v TYPE text; UPDATE readings SET v = 'n/a' WHERE id = 7"
        )

    changer = threading.Thread(target=change_while_live)
    changer.start()
    try:
        message = _failure(harness.materialize(raise_on_error=False))
    finally:
        changer.join()
    assert f"stream {harness.source_name}.readings:" in message and "n/a" in message
    _catalog(harness, {"readings": {}, "customers": {}})
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    assert "'v' changed type integer -> text" in _metadata(result, harness, "readings")["copy reason"]
    _assert_exact(harness, "readings")
    _assert_exact(harness, "customers")


def test_columns_of_a_domain_retyped_to_other_types_retype_the_target(cdc: StreamHarness) -> None:
    """A domain lands as its base type (numeric(10,2), int): a change to or from a domain retypes the target by
    what it holds, not by the domain's name, so a value of the new type loads instead of failing every run."""
    harness = cdc
    harness.source.execute(
        "CREATE DOMAIN posnum AS numeric(10,2) CHECK (value > 0); CREATE DOMAIN smallcount AS int;"
        "CREATE DOMAIN label AS text;"
        "CREATE TABLE exotic (id int PRIMARY KEY, p posnum, c smallcount, n int);"
        "INSERT INTO exotic SELECT g, g + 0.5, g, g FROM generate_series(1, 50) g;" + CUSTOMERS
    )
    _catalog(harness, {"exotic": {}, "customers": {}})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE exotic ALTER COLUMN p TYPE text; ALTER TABLE exotic ALTER COLUMN c TYPE bigint;"
        "ALTER TABLE exotic ALTER COLUMN n TYPE label;"
        "UPDATE exotic SET p = 'not a number', c = 5000000000, n = 'many' WHERE id = 2"
    )
    result = harness.materialize(raise_on_error=False)  # each a widening of the domain's base type: no pause
    assert result.success, _failure(result)
    assert _metadata(result, harness, "exotic")["copied"] is True
    harness.source.execute("UPDATE exotic SET p = 'also text' WHERE id = 3; UPDATE customers SET name = 'on'")
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    _assert_exact(harness, "exotic")
    _assert_exact(harness, "customers")
    typed = harness.query_target(
        f"SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
        f"'{harness.source_name}' AND table_name = 'exotic' AND column_name IN ('p', 'c', 'n') ORDER BY 1"
    )
    assert typed == [("c", "BIGINT"), ("n", "VARCHAR"), ("p", "VARCHAR")]


@pytest.mark.slow  # ~25 s: the refresh runs `dagster asset materialize` as the CLI does
def test_refresh_of_a_cdc_stream_copies_its_table_again_and_the_others_go_on(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: `ingest refresh` of a CDC stream recorded a refresh request, then
    failed with Dagster's DagsterInvalidSubsetError (the source's streams are one asset). It now copies the
    stream's table again in a run of its source, or refuses `--retain` before recording anything."""
    import duckdb

    from ingestion_assets.state.checkpoints import latest_checkpoint

    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    with duckdb.connect(str(harness.warehouse)) as con:  # a target changed outside the product
        con.execute(f"UPDATE \"{harness.source_name}\".orders SET note = 'tampered' WHERE id < 5")
        con.execute(f'DELETE FROM "{harness.source_name}".orders WHERE id = 10')
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    before = latest_checkpoint(harness.instance, harness.key("orders"), None)
    with pytest.raises(SystemExit, match=r"is a CDC stream: --retain does not apply"):
        main(["refresh", f"{harness.source_name}.orders", "--retain"])
    after = latest_checkpoint(harness.instance, harness.key("orders"), None)
    assert after is not None and before is not None and after.storage_id == before.storage_id  # nothing recorded
    harness.source.execute("UPDATE customers SET name = 'on' WHERE id = 3; UPDATE orders SET note = 'n' WHERE id = 7")
    assert main(["refresh", f"{harness.source_name}.orders"]) == 0
    out = capsys.readouterr().out
    assert "copies its table again" in out and "the table's copy beside the log is complete" in out
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")
    harness.source.execute("UPDATE orders SET note = 'later' WHERE id = 1")
    result = harness.materialize()
    assert "copied" not in _metadata(result, harness, "orders")
    _assert_exact(harness, "orders")


def test_type_changes_that_rewrite_values_copy_the_table_again(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README-only attack's type changes (timestamptz(0) rounds, a timestamp made timestamptz is read in the
    session's time zone, numeric(10,0) rounds) rewrite every row and the log carries none of it: the run that
    applies them copies the table again (checked: the table streams read on from their checkpoint instead)."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE typechg (id int PRIMARY KEY, ts timestamptz, mon numeric(10,3), lt timestamp);"
        "INSERT INTO typechg SELECT g, timestamptz '2024-01-01 00:00:00.987654+00', 1.5 + g,"
        " timestamp '2024-01-01 16:00:00' FROM generate_series(1, 300) g;"
    )
    _catalog(harness, {"typechg": {}})
    harness.materialize()
    harness.source.execute(
        "SET timezone = 'America/New_York'; ALTER TABLE typechg ALTER COLUMN ts TYPE timestamptz(0),"
        " ALTER COLUMN mon TYPE numeric(10,0), ALTER COLUMN lt TYPE timestamptz; RESET timezone"
    )
    assert not harness.materialize(raise_on_error=False).success  # paused: incompatible changes
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "accept", f"{harness.source_name}.typechg"]) == 0
    result = harness.materialize(raise_on_error=False)
    assert result.success, _failure(result)
    assert _metadata(result, harness, "typechg")["copied"] is True
    _assert_exact(harness, "typechg")
