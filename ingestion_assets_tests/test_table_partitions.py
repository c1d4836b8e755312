"""A polled table stream over a partitioned table: a partition attached (or created and filled) later with rows
older than the checkpoint's cursor is read whole in the next run; one detached or dropped is said, and the whole
table is compared (its rows deleted when `reconcile.deletes` says so). Multi-level partitioning too."""

from __future__ import annotations

import threading
from typing import Any

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.cli import main
from ingestion_assets_tests.helpers import StreamHarness

PARTS = """
CREATE TABLE parts (id bigint NOT NULL, updated_at timestamptz NOT NULL, region text NOT NULL, note text,
                    PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');
CREATE TABLE parts_us PARTITION OF parts FOR VALUES IN ('us', 'ca') PARTITION BY LIST (region);
CREATE TABLE parts_us_us PARTITION OF parts_us FOR VALUES IN ('us');
INSERT INTO parts SELECT g, '2026-01-01'::timestamptz + g * interval '1 minute', CASE WHEN g % 2 = 0 THEN 'eu'
    ELSE 'us' END, 'first' FROM generate_series(1, 40) g;
"""


def _catalog(harness: StreamHarness, reconcile: Any = None, wait_seconds: float = 5.0) -> None:
    spec: dict[str, Any] = {
        "table": "parts", "primary_key": ["id", "region"], "cursor": "updated_at", "slice_rows": 7,
        "retries": {"max_attempts": 1}, "late_commits": {"wait_seconds": wait_seconds},
    }
    if reconcile is not None:
        spec["reconcile"] = reconcile
    harness.write_catalog({"parts": spec})


def _check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")


def _metadata(harness: StreamHarness, result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__parts")[0]
    return {k: v.value for k, v in materialization.metadata.items()}


def test_partitions_attached_later_with_old_cursors_are_read_whole(harness: StreamHarness) -> None:
    harness.source.execute(PARTS)
    _catalog(harness)
    harness.materialize()
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 40

    harness.source.execute(
        """
        CREATE TABLE parts_ap (LIKE parts INCLUDING ALL);
        INSERT INTO parts_ap SELECT 500 + g, '2025-06-01'::timestamptz + g * interval '1 second', 'ap', 'attached'
            FROM generate_series(1, 5) g;
        ALTER TABLE parts ATTACH PARTITION parts_ap FOR VALUES IN ('ap');
        CREATE TABLE parts_us_ca (LIKE parts INCLUDING ALL);
        INSERT INTO parts_us_ca SELECT 600 + g, '2025-01-01'::timestamptz, 'ca', 'deep' FROM generate_series(1, 3) g;
        ALTER TABLE parts_us ATTACH PARTITION parts_us_ca FOR VALUES IN ('ca');
        CREATE TABLE parts_sa PARTITION OF parts FOR VALUES IN ('sa');
        INSERT INTO parts_sa SELECT 700 + g, '2025-02-01'::timestamptz, 'sa', 'created' FROM generate_series(1, 9) g;
        """
    )
    result = harness.materialize()
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 40 + 5 + 3 + 9
    assert _check(result).passed
    said = str(_metadata(harness, result))
    assert "parts_ap" in said and "parts_us_ca" in said and "parts_sa" in said and "read whole" in said
    kept = harness.checkpoint("parts")
    assert kept is not None and "parts_ap" in " ".join(kept.details["partitions"])

    # read once: the next run reads only what changed
    harness.source.execute("UPDATE parts SET note = 'moved', updated_at = now() WHERE id = 501")
    result = harness.materialize()
    assert _metadata(harness, result)["rows read"] == 1
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 57


def test_a_detached_partition_is_said_and_its_rows_deleted_when_asked(harness: StreamHarness) -> None:
    harness.source.execute(PARTS)
    _catalog(harness, reconcile={"full_every_seconds": 86400, "deletes": "hard"})
    harness.materialize()
    harness.source.execute("ALTER TABLE parts DETACH PARTITION parts_eu")
    result = harness.materialize()
    said = str(_metadata(harness, result))
    assert "parts_eu" in said and "detached or dropped" in said
    check = _check(result)
    assert check.passed, check.metadata
    assert check.metadata["deletions applied"].value == 20
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 20


def test_a_dropped_partition_fails_the_check_each_run_until_its_rows_are_deleted(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(PARTS)
    _catalog(harness)
    harness.materialize()
    harness.source.execute("DROP TABLE parts_us_us")
    result = harness.materialize()
    assert "parts_us_us" in str(_metadata(harness, result))
    check = _check(result)
    assert not check.passed
    assert check.metadata["in target only (deleted at the source)"].value == 20
    # not a one-off: the next run (nothing new to read) compares the whole table again and still fails the check
    result = harness.materialize()
    again = _check(result)
    assert not again.passed and again.metadata["in target only (deleted at the source)"].value == 20
    assert "--apply-deletes" in _metadata(harness, result)["partitions moved"]
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["reconcile", f"{harness.source_name}.parts", "--apply-deletes"]) == 0
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 20
    result = harness.materialize()
    assert _check(result).passed and _check(result).metadata["scope"].value == "full"
    kept = harness.checkpoint("parts")
    assert kept is not None and "partitions_gone" not in kept.details
    result = harness.materialize()  # settled: the window is compared again
    assert _check(result).passed and _check(result).metadata["scope"].value == "window"


def test_a_run_failing_while_it_reads_an_attached_partition_reads_it_again(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint records a partition as read only once all its rows are loaded: the retry reads it whole."""
    harness.source.execute(PARTS)
    _catalog(harness)
    harness.materialize()
    harness.source.execute(
        """
        CREATE TABLE parts_ap (LIKE parts INCLUDING ALL);
        INSERT INTO parts_ap SELECT 500 + g, '2025-06-01'::timestamptz + g * interval '1 second', 'ap', 'attached'
            FROM generate_series(1, 20) g;
        ALTER TABLE parts ATTACH PARTITION parts_ap FOR VALUES IN ('ap');
        """
    )
    monkeypatch.setenv("INGEST_FAULT", "after_partition_load:1")  # two slices (14 rows) of it loaded, then a crash
    assert not harness.materialize(raise_on_error=False).success
    kept = harness.checkpoint("parts")
    assert kept is not None and not any("parts_ap" in name for name in kept.details["partitions"])
    monkeypatch.delenv("INGEST_FAULT")
    harness.materialize()
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 60
    kept = harness.checkpoint("parts")
    assert kept is not None and any("parts_ap" in name for name in kept.details["partitions"])


@pytest.mark.parametrize("how", ["made again", "changed while detached"])
def test_a_partition_made_again_or_changed_while_detached_is_read_whole_again(harness: StreamHarness, how: str) -> None:
    """Under the same name, with the same cursors: a partition dropped and made again with other values, or detached,
    written and attached again, was not read again (leaves were known by name) and the target kept the old rows
    with status ok (found by a README-only attack). Each leaf's oid and pg_inherits row tell them apart."""
    harness.source.execute(PARTS)
    _catalog(harness)
    harness.materialize()
    if how == "made again":
        statements = (
            "CREATE TABLE saved AS SELECT * FROM parts_eu; DROP TABLE parts_eu;"
            "CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');"
            "INSERT INTO parts_eu SELECT id, updated_at, region, 'recreated ' || id FROM saved"
        )
    else:
        statements = (
            "ALTER TABLE parts DETACH PARTITION parts_eu;"
            "INSERT INTO parts_eu VALUES (900, '2024-01-01', 'eu', 'late while detached');"
            "UPDATE parts_eu SET note = 'changed while detached' WHERE id IN (SELECT min(id) FROM parts_eu);"
            "ALTER TABLE parts ATTACH PARTITION parts_eu FOR VALUES IN ('eu')"
        )
    harness.source.execute(statements)
    result = harness.materialize()
    assert "parts_eu" in str(_metadata(harness, result))
    harness.assert_target_equals_source("parts", "parts", "id, region")


@pytest.mark.parametrize("deletes", ["hard", "report"])
def test_rows_deleted_while_a_partition_was_detached_are_found(harness: StreamHarness, deletes: str) -> None:
    """Detached, some rows deleted, attached again between runs: reading the partition whole again loads what it
    holds but cannot see what left it, so the target kept the deleted rows with the check passing (found by a
    README-only attack). The whole table is compared, as for a partition gone, until none of those rows is left."""
    harness.source.execute(PARTS)
    _catalog(harness, reconcile={"full_every_seconds": 86400, "deletes": deletes})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE parts DETACH PARTITION parts_eu;"
        "DELETE FROM parts_eu WHERE id <= 10;"
        "ALTER TABLE parts ATTACH PARTITION parts_eu FOR VALUES IN ('eu')"
    )
    result = harness.materialize()
    check = _check(result)
    assert "attached again" in _metadata(harness, result)["partitions moved"]
    assert check.metadata["scope"].value == "full"
    if deletes == "hard":
        assert check.passed and check.metadata["deletions applied"].value == 5
        assert harness.assert_target_equals_source("parts", "parts", "id, region") == 35
        return
    assert not check.passed and check.metadata["in target only (deleted at the source)"].value == 5
    again = _check(harness.materialize())  # not a one-off: each run compares the whole table until they are gone
    assert not again.passed and again.metadata["scope"].value == "full"


@pytest.mark.parametrize("commits", ["during the run", "after the run"])
def test_rows_a_transaction_in_flight_writes_into_an_attached_partition_are_read(
    harness: StreamHarness, commits: str
) -> None:
    """A partition attached, then filled with old rows by a transaction still open when the run read it: the read
    could not see them, the partition was recorded as read and their old cursors kept every later run from them,
    status ok. The writers in flight in the read's snapshot are waited for; a partition one of them wrote into is
    read whole again (that run, or the next one if it is still open)."""
    harness.source.execute(PARTS)
    _catalog(harness, wait_seconds=2.0 if commits == "during the run" else 0.2)
    harness.materialize()
    harness.source.execute(
        "CREATE TABLE parts_ap (LIKE parts INCLUDING ALL);"
        "ALTER TABLE parts ATTACH PARTITION parts_ap FOR VALUES IN ('ap')"
    )
    loader = psycopg2.connect(harness.source.url, application_name="history-load")
    try:
        with loader.cursor() as cur:
            cur.execute(f'SET search_path = "{harness.source.schema}"')
            cur.execute(
                "INSERT INTO parts_ap SELECT 500 + g, '2024-01-01'::timestamptz, 'ap', 'history' "
                "FROM generate_series(1, 12) g"
            )
        if commits == "during the run":
            timer = threading.Timer(0.8, loader.commit)
            timer.start()
            harness.materialize()
            timer.join()
        else:
            harness.materialize()
            loader.commit()
            harness.materialize()
    finally:
        loader.close()
    assert harness.assert_target_equals_source("parts", "parts", "id, region") == 52
    # settled: read once more at most, then only what changes
    harness.materialize()
    result = harness.materialize()
    assert _metadata(harness, result)["rows read"] == 0
