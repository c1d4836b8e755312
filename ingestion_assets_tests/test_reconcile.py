"""Reconciliation of polled tables: counts and key checksums per bucket, the key diff where they differ,
and hard deletes (deleted rows, changed primary keys, truncates) found and applied, on both destinations."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.streams.reconcile import RECONCILED_AT
from ingestion_assets_tests.helpers import StreamHarness

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 300) g;
"""
DESTINATIONS = ["duckdb", "postgres"]


def _catalog(harness: StreamHarness, destination: str = "duckdb", reconcile: Any = "window", rows: int = 100) -> None:
    harness.write_catalog(
        {
            "items": {
                "table": "items",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": rows,
                "retries": {"max_attempts": 1},
                "reconcile": reconcile,
            }
        },
        destination=destination,
    )


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")


def _figure(check: dg.AssetCheckEvaluation, label: str) -> Any:
    return check.metadata[label].value


def _target(harness: StreamHarness, where: str = "TRUE") -> list[tuple[Any, ...]]:
    return harness.target_rows_where("items", ["id", "name", "_ingest_deleted_at"], "id", where)


# Each destination with each mode once, between this test and the truncate one.
@pytest.mark.parametrize(("destination", "mode"), [("duckdb", "hard"), ("postgres", "soft")])
def test_hard_deletes_are_found_and_applied(harness_on_any: StreamHarness, destination: str, mode: str) -> None:
    harness = harness_on_any  # also against PostgreSQL 15 with INGEST_TEST_PG_URL
    harness.source.execute(ITEMS)
    _catalog(harness, destination, {"full_every_seconds": 0, "deletes": mode})
    assert _check(harness.materialize()).passed
    harness.source.execute("DELETE FROM items WHERE id IN (5, 77, 150)")  # a hard delete: polling cannot see it

    check = _check(harness.materialize())
    assert check.passed, check.metadata
    assert _figure(check, "in target only (deleted at the source)") == 3 and _figure(check, "deletions applied") == 3
    assert _figure(check, "sample of keys deleted at the source") == ["150", "5", "77"]
    assert _figure(check, "source rows compared") == 297 and _figure(check, "target rows compared") == 300
    if mode == "hard":
        harness.assert_target_equals_source("items", "items", "id")
    else:  # kept with their last values, flagged; the live rows equal the source
        gone = _target(harness, "_ingest_deleted_at IS NOT NULL")
        assert [(r[0], r[1]) for r in gone] == [(5, "item 5"), (77, "item 77"), (150, "item 150")]
        live = [(r[0], r[1]) for r in _target(harness, "_ingest_deleted_at IS NULL")]
        assert live == [(r[0], r[1]) for r in harness.source.rows("items", "id")]
    again = _check(harness.materialize())  # applied once: nothing left to find
    assert again.passed and _figure(again, "deletions applied") == 0 and _figure(again, "buckets differing") == 0


def test_a_changed_primary_key_retires_the_old_key(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, "postgres", {"scope": "full", "deletes": "hard"})
    harness.materialize()
    harness.source.execute("UPDATE items SET id = 1000, updated_at = statement_timestamp() WHERE id = 10")

    check = _check(harness.materialize())
    assert check.passed and _figure(check, "sample of keys deleted at the source") == ["10"]
    assert _figure(check, "deletions applied") == 1
    assert harness.assert_target_equals_source("items", "items", "id") == 300
    assert _target(harness, "id IN (10, 1000)") == [(1000, "item 10", None)]


@pytest.mark.parametrize(("destination", "mode"), [("duckdb", "soft"), ("postgres", "hard")])
def test_a_truncated_source_is_detected_and_applied(harness: StreamHarness, destination: str, mode: str) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, destination, {"full_every_seconds": 0, "deletes": mode})
    harness.materialize()
    harness.source.execute("TRUNCATE items")

    check = _check(harness.materialize())
    assert check.passed and _figure(check, "deletions applied") == 300 and _figure(check, "source rows compared") == 0
    live = _target(harness, "_ingest_deleted_at IS NULL")
    assert live == [] and len(_target(harness)) == (0 if mode == "hard" else 300)


def test_without_detection_deletes_are_reported_not_applied(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, reconcile="full")
    harness.materialize()
    harness.source.execute("DELETE FROM items WHERE id = 42")

    check = _check(harness.materialize())
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN  # deleted: explained, not applied
    assert _figure(check, "in target only (deleted at the source)") == 1 and _figure(check, "deletions applied") == 0
    assert "ingest reconcile" in _figure(check, "what to do")
    assert len(_target(harness)) == 300
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    main(["status"])  # says the check failed and, as the check does, what to run (it named no command before)
    out = capsys.readouterr()
    assert "--apply-deletes" in out.out + out.err
    # the comparison it names applies them: the status and the UI show its verdict, not the run's (attack26: status
    # said `check failed ... 1 row(s) are gone` until the next run)
    assert main(["reconcile", f"{harness.source_name}.items", "--apply-deletes"]) == 0
    capsys.readouterr()
    assert main(["status"]) == 0
    assert "check failed" not in capsys.readouterr().out
    latest = harness.instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(harness.key("items"), "reconciliation")]
    )
    (record,) = latest.values()
    evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
    assert evaluation is not None and evaluation.passed and evaluation.metadata["by"].value == "ingest reconcile"


@pytest.mark.parametrize("destination", DESTINATIONS)
def test_stale_and_newer_rows_in_the_target_are_told_apart(harness: StreamHarness, destination: str) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, destination, "full")
    harness.materialize()
    table = f'"{harness.source_name}".items'
    harness.execute_target(  # behind the product's back: one row older, one newer than the source
        f"UPDATE {table} SET name = 'old', _ingest_position = _ingest_position - INTERVAL '1 hour' WHERE id = 20",
        f"UPDATE {table} SET name = 'future', _ingest_position = _ingest_position + INTERVAL '1 hour' WHERE id = 21",
    )
    # a new version the checkpoint already covers (a late commit): polling never reads it
    harness.source.execute("UPDATE items SET name = 'late', updated_at = updated_at + interval '1 ms' WHERE id = 30")

    check = _check(harness.materialize())
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    # the older ones are read again by key in the same run; the newer one cannot be (the version guard keeps it)
    assert _figure(check, "older in target than in source") == 0 and _figure(check, "read again by key (repaired)") == 2
    assert _figure(check, "sample of repaired keys") == ["20", "30"]
    assert _figure(check, "newer in target than in source") == 1 and _figure(check, "sample of newer keys") == ["21"]
    assert _figure(check, "missing in target") == 0 and _figure(check, "in target only (deleted at the source)") == 0
    assert "1 row(s) newer in the target" in _figure(check, "owed")
    assert _target(harness, "id IN (20, 21, 30)") == [(20, "item 20", None), (21, "future", None), (30, "late", None)]


def test_the_checksum_catches_a_delete_and_an_insert_in_one_bucket(harness: StreamHarness) -> None:
    harness.source.execute(ITEMS)
    harness.source.execute("DELETE FROM items WHERE id > 40")  # 40 rows: one bucket
    _catalog(harness, reconcile="full")
    harness.materialize()
    # the same count on both sides: one row gone, one row added with a version the checkpoint covers
    harness.source.execute("DELETE FROM items WHERE id = 3")
    harness.source.execute("INSERT INTO items VALUES (999, 'backdated', timestamptz '2024-01-01 00:00:05+00')")

    check = _check(harness.materialize())
    assert _figure(check, "source rows compared") == _figure(check, "target rows compared") == 40
    assert _figure(check, "buckets compared") == 1 and _figure(check, "buckets differing") == 1
    assert _figure(check, "sample of repaired keys") == ["999"] and _figure(check, "missing in target") == 0
    assert _figure(check, "sample of keys deleted at the source") == ["3"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN  # the delete, reported


def test_the_window_check_runs_every_run_and_the_full_one_on_its_cadence(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, reconcile={"full_every_seconds": 3600, "deletes": "hard"})
    first = _check(harness.materialize())
    assert _figure(first, "scope") == "full"  # never compared in full: due
    stamp = harness.checkpoint("items").details[RECONCILED_AT]  # type: ignore[union-attr]

    harness.source.execute("DELETE FROM items WHERE id = 7")
    harness.source.execute("UPDATE items SET name = 'changed', updated_at = statement_timestamp() WHERE id = 8")
    second = _check(harness.materialize())
    assert _figure(second, "scope") == "window" and second.passed
    assert _figure(second, "source rows compared") == 2  # the row read, and the one at the start (inclusive)
    assert harness.checkpoint("items").details[RECONCILED_AT] == stamp  # type: ignore[union-attr]
    assert len(_target(harness, "id = 7")) == 1  # not due yet: the delete waits

    harness.source.execute("UPDATE items SET name = 'newer', updated_at = statement_timestamp() WHERE id = 9")
    for key, value in harness.cli_env().items():  # on demand, without waiting for the cadence
        monkeypatch.setenv(key, value)
    assert main(["reconcile", f"{harness.source_name}.items"]) == 1
    out = capsys.readouterr().out
    assert "1 in the target only (deleted at the source), 0 deleted" in out
    assert "1 not yet synced" in out  # row 9 changed after the last run: the next run reads it
    assert main(["reconcile", f"{harness.source_name}.items", "--apply-deletes"]) == 0
    assert "1 in the target only (deleted at the source), 1 deleted" in capsys.readouterr().out
    harness.materialize()
    harness.assert_target_equals_source("items", "items", "id")


PARKED = """
CREATE TABLE readings (id int PRIMARY KEY, amount numeric(10,2), updated_at timestamptz NOT NULL);
INSERT INTO readings SELECT g, g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 200) g;
UPDATE readings SET amount = 'NaN' WHERE id = 7;
"""


def test_rows_parked_as_dead_letters_are_not_missing(harness: StreamHarness) -> None:
    harness.source.execute(PARKED)
    harness.write_catalog(
        {
            "readings": {
                "table": "readings",
                "primary_key": "id",
                "cursor": "updated_at",
                "reconcile": {"full_every_seconds": 0, "deletes": "hard"},
            }
        }
    )
    harness.materialize()
    # a loaded row whose next version cannot load: the target keeps the old one, the new one is parked
    harness.source.execute("UPDATE readings SET amount = 'NaN', updated_at = statement_timestamp() WHERE id = 8")
    harness.source.execute("DELETE FROM readings WHERE id = 9")
    check = _check(harness.materialize())
    assert check.passed, check.metadata
    assert _figure(check, "parked as dead letters") == 2 and _figure(check, "missing in target") == 0
    assert _figure(check, "older in target than in source") == 0 and _figure(check, "deletions applied") == 1
    kept = harness.target_rows_where("readings", ["id", "amount"], "id", "id BETWEEN 7 AND 10")
    assert [r[0] for r in kept] == [8, 10]  # 7 never loaded, 8 keeps its last good version, 9 is gone


ACCOUNTS = """
CREATE TABLE accounts (region text, number int, owner uuid NOT NULL, updated_at timestamptz NOT NULL,
                       PRIMARY KEY (region, number));
INSERT INTO accounts SELECT r, g, md5(r || g)::uuid, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 150) g, unnest(ARRAY['eu', 'us', 'Ünïcode']) r;
"""


@pytest.mark.parametrize("destination", DESTINATIONS)
def test_a_composite_text_key_is_bucketed_by_hash(harness: StreamHarness, destination: str) -> None:
    harness.source.execute(ACCOUNTS)
    spec = {"table": "accounts", "primary_key": ["region", "number"], "cursor": "updated_at"}
    harness.write_catalog({"accounts": {**spec, "reconcile": {"scope": "full", "deletes": "hard"}}}, destination)
    harness.materialize()
    harness.source.execute("DELETE FROM accounts WHERE number = 7 AND region <> 'eu'")
    harness.source.execute(  # a late version the checkpoint covers
        "UPDATE accounts SET owner = gen_random_uuid(), updated_at = updated_at + interval '1 ms' "
        "WHERE region = 'eu' AND number = 9"
    )
    check = _check(harness.materialize())
    assert _figure(check, "buckets compared") > 1 and _figure(check, "deletions applied") == 2, check.metadata
    assert _figure(check, "sample of keys deleted at the source") == ["us|7", "Ünïcode|7"]
    assert _figure(check, "sample of repaired keys") == ["eu|9"] and check.passed, check.metadata
    harness.assert_target_equals_source("accounts", "accounts", "region, number")


def test_a_row_whose_cursor_is_null_fails_the_window_check(harness: StreamHarness) -> None:
    """Found by the README-only attack: a NULL cursor sorts lowest, so a row inserted (or updated) with a NULL
    cursor after the first run is never read, and the default window check passed: the row was lost unnoticed."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, updated_at timestamptz);"
        "INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'"
        " FROM generate_series(1, 300) g"
    )
    _catalog(harness)
    assert _check(harness.materialize()).passed
    harness.source.execute(
        "INSERT INTO items VALUES (301, 'no cursor', NULL);"
        "UPDATE items SET name = 'moved back', updated_at = NULL WHERE id = 5;"
        "UPDATE items SET name = 'read', updated_at = now() WHERE id = 6"
    )
    check = _check(harness.materialize())
    assert not check.passed
    assert _figure(check, "sample of repaired keys") == ["301"], check.metadata  # inserted behind the checkpoint
    assert _figure(check, "sample of newer keys") == ["5"], check.metadata  # its cursor went back to NULL


NO_KEY_CONSTRAINT = """
CREATE TABLE loose (id int, region text, name text NOT NULL, updated_at timestamptz NOT NULL);  -- no primary key
INSERT INTO loose SELECT g, 'eu', 'row ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 200) g;
INSERT INTO loose VALUES (NULL, 'eu', 'no id', '2024-01-01 00:00:10.5+00'),
    (NULL, NULL, 'none', '2024-01-01 00:01:00.5+00'), (1000, NULL, 'no region', '2024-01-01 00:02:00.5+00');
"""


@pytest.mark.parametrize(
    ("destination", "key", "null_keys"), [("duckdb", "id", 2), ("postgres", "id", 2), ("duckdb", ["id", "region"], 3)]
)
def test_rows_with_a_null_key_are_counted_apart_not_compared(
    harness: StreamHarness,
    destination: str,
    key: Any,
    null_keys: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found by a README-only attacker: a table without a primary key holding a row whose declared key column is NULL
    (parked, the rest loads, as the README says) made every comparison fail, `int() argument must be ... not
    'NoneType'`, the run and `ingest reconcile` with it. Such rows are counted apart on the window and full scopes."""
    harness.source.execute(NO_KEY_CONSTRAINT)
    spec = {"table": "loose", "primary_key": key, "cursor": "updated_at", "retries": {"max_attempts": 1}}
    harness.write_catalog({"loose": {**spec, "reconcile": {"full_every_seconds": 0, "deletes": "hard"}}}, destination)
    check = _check(harness.materialize())  # the first run's full comparison
    assert check.passed, check.metadata
    assert _figure(check, "source rows with a NULL key (not compared; parked as dead letters)") == null_keys
    assert _figure(check, "source rows compared") == 203 - null_keys and _figure(check, "missing in target") == 0
    harness.source.execute("DELETE FROM loose WHERE id = 5")
    harness.source.execute("INSERT INTO loose VALUES (NULL, 'eu', 'late', statement_timestamp())")
    check = _check(harness.materialize())
    assert check.passed and _figure(check, "deletions applied") == 1, check.metadata
    assert _figure(check, "source rows with a NULL key (not compared; parked as dead letters)") == null_keys + 1

    harness.write_catalog({"loose": {**spec, "reconcile": "window"}}, destination)
    harness.source.execute("INSERT INTO loose VALUES (NULL, 'eu', 'later', statement_timestamp())")
    check = _check(harness.materialize())  # the window's comparison
    assert check.passed and _figure(check, "missing in target") == 0, check.metadata
    # the window starts at the last run's checkpoint, the 'late' row's cursor: both rows without an id are in it
    assert _figure(check, "source rows with a NULL key (not compared; parked as dead letters)") == 2
    for name, value in harness.cli_env().items():
        monkeypatch.setenv(name, value)
    assert main(["reconcile", f"{harness.source_name}.loose", "--every-key"]) == 0
    out = capsys.readouterr().out
    assert f"{null_keys + 2} source row(s) with a NULL key not compared" in out and "0 missing" in out, out
    loaded = harness.target_rows_where("loose", ["id", "region", "name"], "id", "TRUE")
    keyed = [(g, "eu", f"row {g}") for g in range(1, 201) if g != 5]
    assert loaded == keyed + ([(1000, None, "no region")] if key == "id" else [])
