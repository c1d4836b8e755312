"""A gap a comparison finds (rows missing from the target, or older there) is read again by key in the same run;
what it cannot repair is owed: every later run compares the whole table and fails its check until it is closed.

Found by a README-only attack: a gap found once was forgotten, the next run compared only its own cursor window
and the check (and `ingest status`) went back to ok with the rows still missing."""

from __future__ import annotations

from typing import Any

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.cli import main
from ingestion_assets.streams.reconcile import OWED, UNCHECKED
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness, load_daily_events

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 300) g;
"""
LAST = "timestamptz '2024-01-01 00:05:00+00'"  # row 300's cursor: the first run's checkpoint


def _catalog(harness: StreamHarness, destination: str = "duckdb", reconcile: Any = "window") -> None:
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 100}
    harness.write_catalog({"items": {**spec, "retries": {"max_attempts": 1}, "reconcile": reconcile}}, destination)


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")


def _figure(check: dg.AssetCheckEvaluation, label: str) -> Any:
    return check.metadata[label].value


def _owed(harness: StreamHarness, partition: str | None = None) -> Any:
    checkpoint = harness.checkpoint("items", partition)
    assert checkpoint is not None
    return checkpoint.details.get(OWED)


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_late_rows_and_older_versions_are_read_again_in_the_run_that_finds_them(
    harness: StreamHarness, destination: str
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, destination, "full")
    assert _check(harness.materialize()).passed
    harness.source.execute(
        # committed after the run read, with cursors behind its checkpoint (an application clock, a copied time)
        "INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-01 00:00:05.5+00');"
        "UPDATE items SET name = 'changed', updated_at = updated_at + interval '1 ms' WHERE id IN (30, 31)"
    )

    check = _check(harness.materialize())
    assert check.passed, check.metadata
    assert _figure(check, "read again by key (repaired)") == 3
    assert _figure(check, "sample of repaired keys") == ["30", "31", "999"]
    assert _figure(check, "missing in target") == 0 and _figure(check, "older in target than in source") == 0
    assert "read again by key" in _figure(check, "repair")
    assert harness.assert_target_equals_source("items", "items", "id") == 301
    assert _owed(harness) is None
    again = _check(harness.materialize())
    assert again.passed and _figure(again, "buckets differing") == 0


def test_a_late_row_sharing_the_checkpoint_cursor_is_repaired_by_the_window_check(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()
    # a row committed late with the checkpoint's own cursor and a lower key: the keyset read is past it
    harness.source.execute(f"INSERT INTO items VALUES (0, 'tie', {LAST})")

    check = _check(harness.materialize())
    assert _figure(check, "scope") == "window" and check.passed, check.metadata
    assert _figure(check, "sample of repaired keys") == ["0"]
    harness.assert_target_equals_source("items", "items", "id")


def test_a_gap_over_the_cap_is_owed_until_a_full_comparison_closes_it(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()
    monkeypatch.setattr("ingestion_assets.streams.reconcile.repair.REPAIR_CAP", 2)
    harness.source.execute(
        f"INSERT INTO items SELECT -g, 'late ' || g, {LAST} FROM generate_series(1, 3) g;"
        "UPDATE items SET name = 'new', updated_at = statement_timestamp() WHERE id = 1"
    )
    first = _check(harness.materialize())  # the window from the checkpoint's cursor on sees the three
    assert not first.passed and _figure(first, "missing in target") == 3, first.metadata
    assert "more than the 2 a run reads again by key" in _figure(first, "owed")
    since = _owed(harness)["since"]

    for key in (2, 3):  # the window moves on, past the late rows: the owed gap still makes runs compare in full
        harness.source.execute(f"UPDATE items SET updated_at = statement_timestamp() WHERE id = {key}")
        later = _check(harness.materialize())
        assert _figure(later, "scope") == "full" and not later.passed, later.metadata
        assert _figure(later, "why the whole table") == "a gap an earlier comparison found is owed"
        assert _figure(later, "missing in target") == 3 and _owed(harness)["since"] == since
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert "check failed: reconciliation owed since" in err and "3 row(s) missing" in err

    monkeypatch.setattr("ingestion_assets.streams.reconcile.repair.REPAIR_CAP", 100_000)
    closed = _check(harness.materialize())  # a full comparison repairs them: the gap is closed
    assert closed.passed and _figure(closed, "read again by key (repaired)") == 3, closed.metadata
    assert _owed(harness) is None
    harness.assert_target_equals_source("items", "items", "id")
    assert _figure(_check(harness.materialize()), "scope") == "window"  # back to the cheap check


def test_a_refresh_clears_what_is_owed(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()
    monkeypatch.setattr("ingestion_assets.streams.reconcile.repair.REPAIR_CAP", 2)
    harness.source.execute(f"INSERT INTO items SELECT -g, 'late ' || g, {LAST} FROM generate_series(1, 3) g")
    assert not _check(harness.materialize()).passed and _owed(harness) is not None
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["refresh", f"{harness.source_name}.items", "--retain", "--later"]) == 0

    check = _check(harness.materialize())  # every row read again
    assert check.passed and _owed(harness) is None, check.metadata
    harness.assert_target_equals_source("items", "items", "id")


def test_a_time_partition_repairs_into_the_one_target_table(harness: StreamHarness) -> None:
    load_daily_events(harness, {"full_every_seconds": 0})
    harness.source.execute(  # late into the first day, behind its checkpoint; an older version on the second day
        "INSERT INTO events VALUES (500, 'late', '2024-01-01 03:00:00.5+00');"
        "UPDATE events SET v = 'changed', updated_at = updated_at + interval '1 ms' WHERE id = 150"
    )

    first = _check(harness.materialize(partition="2024-01-01"))
    assert first.passed and _figure(first, "sample of repaired keys") == ["500"], first.metadata
    second = _check(harness.materialize(partition="2024-01-02"))
    assert second.passed and _figure(second, "sample of repaired keys") == ["150"], second.metadata
    harness.assert_target_equals_source("events", "events", "id")
    checkpoint = harness.checkpoint("events", "2024-01-01")
    assert checkpoint is not None and OWED not in checkpoint.details


def test_ingest_reconcile_repairs_what_it_finds(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, reconcile={"full_every_seconds": 3600})
    harness.materialize()
    harness.source.execute("INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-01 00:00:05.5+00')")
    assert _check(harness.materialize()).passed  # the window check cannot see a row so far behind its checkpoint
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    stream = f"{harness.source_name}.items"

    assert main(["reconcile", stream, "--no-repair"]) == 1
    out = capsys.readouterr().out
    assert "1 missing" in out and "0 read again by key (repaired)" in out and "not repaired: --no-repair" in out
    assert main(["reconcile", stream]) == 0
    out = capsys.readouterr().out
    assert "0 missing" in out and "1 read again by key (repaired)" in out and "repaired: 999" in out
    harness.assert_target_equals_source("items", "items", "id")


def test_a_comparison_that_failed_is_owed_and_done_in_full_by_the_next_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()

    def lost(request: Any) -> Any:  # the source's server went away mid-comparison (cannot be made to happen here)
        raise psycopg2.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("ingestion_assets.streams.reconcile.cadence.reconcile", lost)
    harness.source.execute("INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-01 00:00:05.5+00')")
    failed = _check(harness.materialize())
    assert not failed.passed and "server closed the connection" in _figure(failed, "owed"), failed.metadata
    monkeypatch.undo()

    check = _check(harness.materialize())  # owed: the whole table, which finds and repairs the late row
    assert _figure(check, "scope") == "full" and check.passed, check.metadata
    assert _figure(check, "sample of repaired keys") == ["999"] and _owed(harness) is None
    harness.assert_target_equals_source("items", "items", "id")


@pytest.mark.parametrize("new_rows", [False, True])
def test_rows_deleted_from_the_target_behind_its_back_are_found_and_read_again(
    harness: StreamHarness, new_rows: bool
) -> None:
    """Rows deleted from the target by hand (or an older copy of the table restored): `ingest status` said `target
    short` once, the next run's window check passed, and from then on the lower count was the new normal, the rows
    missing for good (found by README-only attacks; counting after the load, new rows hid the loss). The run counts
    the target before it loads: fewer rows than the last run left, it compares the whole table and repairs."""
    import duckdb

    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()
    with duckdb.connect(str(harness.warehouse)) as con:
        con.execute(f'DELETE FROM "{harness.source_name}".items WHERE id BETWEEN 10 AND 19')
    if new_rows:  # more rows arrive than were lost: the count after the load would have grown
        harness.source.execute("INSERT INTO items SELECT g, 'new', now() FROM generate_series(301, 320) g")
    check = _check(harness.materialize())
    assert check.passed and _figure(check, "scope") == "full", check.metadata
    assert "10 fewer than the last run left" in _figure(check, "why the whole table"), check.metadata
    assert _figure(check, "read again by key (repaired)") == 10
    harness.assert_target_equals_source("items", "items", "id")
    assert _owed(harness) is None
    check = _check(harness.materialize())
    assert check.passed and _figure(check, "scope") == "window"


def test_a_key_of_infinity_is_repaired_like_any_other(harness: StreamHarness) -> None:
    """A timestamptz key of infinity among the rows to read again crashed the repair (OverflowError, permanent, every
    run) and no other row was repaired (found by a README-only attack)."""
    harness.source.execute(
        "CREATE TABLE stamps (id timestamptz PRIMARY KEY, v text, updated_at bigint NOT NULL);"
        "INSERT INTO stamps SELECT timestamptz '2024-01-01+00' + g * interval '1 s', 'v', 100 + g"
        " FROM generate_series(1, 20) g"
    )
    spec = {"table": "stamps", "primary_key": "id", "cursor": "updated_at", "reconcile": "full"}
    harness.write_catalog({"stamps": {**spec, "retries": {"max_attempts": 1}}})
    harness.materialize()
    harness.source.execute(
        "INSERT INTO stamps VALUES ('infinity', 'late', 1), ('-infinity', 'late', 2), ('2020-01-01+00', 'late', 3)"
    )
    check = _check(harness.materialize())
    assert check.passed and _figure(check, "read again by key (repaired)") == 3, check.metadata
    loaded = harness.query_target(f'SELECT v FROM "{harness.source_name}".stamps WHERE updated_at < 10 ORDER BY 1')
    assert _figure(check, "missing in target") == 0 and loaded == [("late",)] * 3


def test_a_gap_a_past_time_partition_owes_keeps_status_failed_after_other_partitions_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A past window's comparison owed a gap; the next run (another window) passed its own check and `ingest status`
    said ok, with the gap still there (found by a README-only attack): status reads every partition's checkpoint."""
    load_daily_events(harness, {"full_every_seconds": 0})
    # the source's cursor went backwards: the target's version is newer, which no repair settles (owed)
    harness.source.execute("UPDATE events SET updated_at = updated_at - interval '1 minute' WHERE id = 5")
    assert not _check(harness.materialize(partition="2024-01-01")).passed
    assert _check(harness.materialize(partition="2024-01-02")).passed
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert "reconciliation owed by 1 partition(s): partition 2024-01-01" in err, err


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_ingest_reconcile_source_wins_loads_the_source_over_a_newer_target_row(
    harness: StreamHarness, destination: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source restored from a backup (its cursors went backwards): the version guard keeps the target's newer rows
    and every check fails. Only a person can say the source is right: `--source-wins` loads its version over them."""
    harness.source.execute(ITEMS)
    _catalog(harness, destination, "full")
    harness.materialize()
    harness.source.execute("UPDATE items SET name = 'restored', updated_at = updated_at - interval '1 hour' WHERE id = 7")
    table = f'"{harness.source_name}".items'
    harness.execute_target(  # and a hand edit of the target, as if from the future
        f"UPDATE {table} SET name = 'ahead', _ingest_position = _ingest_position + INTERVAL '1 hour' WHERE id = 8"
    )
    check = _check(harness.materialize())
    assert not check.passed and _figure(check, "newer in target than in source") == 2, check.metadata
    assert "--source-wins" in _figure(check, "what to do")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    stream = f"{harness.source_name}.items"

    assert main(["reconcile", stream]) == 1  # without asking: the target's row stays
    assert "2 newer in the target" in capsys.readouterr().out
    assert main(["reconcile", stream, "--source-wins"]) == 0
    out = capsys.readouterr().out
    assert "0 newer in the target" in out and "2 read again by key (repaired)" in out, out
    # said apart: these were no gap the repair closed but the target's newer rows, replaced by older ones
    assert "2 row(s) newer in the target than in the source were replaced by the source's version" in out, out
    harness.assert_target_equals_source("items", "items", "id")
    assert _check(harness.materialize()).passed and _owed(harness) is None  # the gap the runs owed is closed


def test_a_time_partition_newer_in_the_target_is_fixed_by_source_wins(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ingest refresh` refuses partitioned streams; a partition whose target row is newer had no fix."""
    load_daily_events(harness, {"full_every_seconds": 0})
    harness.execute_target(
        f'UPDATE "{harness.source_name}".events SET v = \'ahead\', '
        "_ingest_position = _ingest_position + INTERVAL '1 minute' WHERE id = 20"
    )
    check = _check(harness.materialize(partition="2024-01-01"))
    assert not check.passed and "--partition 2024-01-01 --source-wins" in _figure(check, "what to do")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    stream = f"{harness.source_name}.events"
    assert main(["reconcile", stream, "--partition", "2024-01-01", "--source-wins"]) == 0
    out = capsys.readouterr().out
    assert "1 read again by key (repaired)" in out and "1 row(s) newer in the target than in the source were replaced" in out, out
    harness.assert_target_equals_source("events", "events", "id")
    assert _check(harness.materialize(partition="2024-01-01")).passed


@pytest.mark.parametrize("fault", ["before_check:0:kill", "after_checkpoint:0:kill"])
def test_a_run_killed_before_its_check_leaves_its_window_to_the_next_check(
    harness: StreamHarness, fault: str
) -> None:
    """A run killed after its loads, before (or during) its window check: the next run compared only its own window,
    so a row committed behind the killed run's position (an application clock) was never read again, status ok
    (README-only attack). The checkpoint keeps where the unchecked loads begin until a check has run."""
    harness.source.execute(ITEMS)
    _catalog(harness)
    harness.materialize()
    harness.source.execute(
        "UPDATE items SET name = 'moved', updated_at = timestamptz '2024-01-02 00:00:01+00' WHERE id = 10;"
        "UPDATE items SET name = 'moved', updated_at = timestamptz '2024-01-02 00:00:03+00' WHERE id = 11"
    )
    killed = harness.materialize_cli("items", **{FAULT_ENV: fault})
    assert killed.wait(timeout=180) != 0
    # committed after that read, behind its checkpoint: only the killed run's own window check could find it
    harness.source.execute("INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-02 00:00:02+00')")
    harness.source.execute("UPDATE items SET name = 'next', updated_at = timestamptz '2024-01-03 00:00:00+00' WHERE id = 1")

    check = _check(harness.materialize())
    assert check.passed and "999" in _figure(check, "sample of repaired keys"), check.metadata
    harness.assert_target_equals_source("items", "items", "id")
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None and UNCHECKED not in checkpoint.details  # checked: the next run starts afresh


def test_a_run_whose_only_work_was_a_repair_counts_the_rows_it_wrote(harness: StreamHarness) -> None:
    """Found by a README-only attack: a run that read nothing new but repaired rows said `no changes: nothing new
    in the source` and `rows written 0`, although it had written the rows it read again by key."""
    harness.source.execute(ITEMS)
    _catalog(harness, reconcile="full")
    harness.materialize()
    harness.source.execute("INSERT INTO items VALUES (999, 'late', timestamptz '2024-01-01 00:00:05.5+00')")
    result = harness.materialize()
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__items")[0].metadata
    assert metadata["rows read"].value == 0 and metadata["rows written"].value == 1, metadata
    assert metadata["rows repaired"].value == 1
    assert metadata["summary"].value == "incremental of items: 0 rows read, 1 written (1 repaired: read again by key)"
    assert harness.assert_target_equals_source("items", "items", "id") == 301
    metadata = harness.materialize().asset_materializations_for_node(f"{harness.source_name}__items")[0].metadata
    assert metadata["summary"].value.startswith("no changes: nothing new in the source"), metadata
