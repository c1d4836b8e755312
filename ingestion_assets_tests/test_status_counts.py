"""What a run records as the rows its target should hold, which `ingest status` and the next run compare with: a
CDC run does not take rows deleted from its target outside ingest as the new normal, a CDC run that fails after
committing records its counts, and a table run killed after committing slices leaves the next run comparing the
whole table."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ingestion_assets.cli import main
from ingestion_assets.sources.postgres.cdc import drop_slot
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness


@pytest.fixture
def cdc(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamHarness]:
    harness.source.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);"
        "INSERT INTO orders SELECT g, 'n' FROM generate_series(1, 200) g;"
    )
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id"}},
        mode="cdc",
        cdc={"max_seconds": 2, "retries": {"max_attempts": 1}},
    )
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    try:
        yield harness
    finally:
        drop_slot(harness.source.url, f"ingest_{harness.source_name}")
        harness.source.execute(f"DROP PUBLICATION IF EXISTS ingest_{harness.source_name}")


def _status(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["status", "--json"])
    (line,) = json.loads(capsys.readouterr().out)
    return code, line


def test_rows_deleted_by_hand_from_a_cdc_target_stay_reported_after_the_next_cdc_run(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the status review: a CDC run recorded its target's count as it found it, so 50 rows deleted from the
    target by hand were `target short` only until the next CDC run, which recorded 160 as the new normal: status then
    said `ok` and the rows were lost for good without a word. Now the run counts the target before applying the log,
    warns, and keeps them owed (`rows missing`) until a refresh copies the table again; the log's own deletes and
    inserts in that run are no loss."""
    harness = cdc
    harness.materialize()
    table = f'"{harness.source_name}".orders'
    harness.execute_target(f"DELETE FROM {table} WHERE id <= 50")
    harness.source.execute(
        "INSERT INTO orders SELECT g, 'new' FROM generate_series(201, 210) g; DELETE FROM orders WHERE id = 100"
    )

    result = harness.materialize()
    (materialization,) = result.asset_materializations_for_node(f"{harness.source_name}__cdc")
    assert materialization.metadata["dagster/row_count"].value == 159
    assert materialization.metadata["rows missing"].value == 50
    assert "50 row(s) deleted from the target outside ingest are still missing" in str(
        materialization.metadata["summary"].value
    )
    code, line = _status(capsys)
    assert (code, line["status"], line["rows_in_target"], line["rows_after_last_run"]) == (1, "target short", 159, 209)

    harness.materialize()  # nothing new: still owed, not forgotten
    code, line = _status(capsys)
    assert (code, line["status"], line["rows_in_target"], line["rows_after_last_run"]) == (1, "target short", 159, 209)

    assert main(["refresh", f"{harness.source_name}.orders"]) == 0
    capsys.readouterr()
    harness.assert_target_equals_source("orders", "orders", "id")
    code, line = _status(capsys)
    assert (code, line["status"], line["rows_in_target"], line["rows_after_last_run"]) == (0, "ok", 209, 209)


def test_a_cdc_run_that_fails_after_committing_records_what_its_target_holds(
    cdc: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the status review: a CDC run that failed after committing a batch recorded no count, so status and the
    next run compared with the count from before it: the 100 rows it loaded hid 60 deleted by hand (status `ok`, the
    next run took 240 as normal). Now the failed run records the count it left (300)."""
    harness = cdc
    harness.materialize()
    harness.source.execute("INSERT INTO orders SELECT g, 'new' FROM generate_series(201, 300) g")
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:0")
    result = harness.materialize(raise_on_error=False)
    monkeypatch.delenv(FAULT_ENV)
    assert not result.success and harness.target_count("orders") == 300
    harness.execute_target(f'DELETE FROM "{harness.source_name}".orders WHERE id > 240')

    code, line = _status(capsys)
    assert (code, line["status"], line["rows_in_target"], line["rows_after_last_run"]) == (1, "failed", 240, 300)
    assert "holds 240 rows, but the last run left 300 in it" in str(line["detail"])
    harness.materialize()
    code, line = _status(capsys)
    assert (code, line["status"], line["rows_in_target"], line["rows_after_last_run"]) == (1, "target short", 240, 300)


def test_a_table_run_killed_after_committing_slices_leaves_the_next_run_comparing_the_whole_table(
    harness: StreamHarness,
) -> None:
    """Found by the status review: a run killed (kill -9) after committing slices recorded no count, so rows then
    deleted from the target by hand (fewer than its slices added) left the target above the count before it: the
    next run saw no shrink, compared only its window and recorded the smaller count as normal (lost for good, status
    `ok`). Now the next run knows the count is unknown, compares the whole table and reads the missing rows again."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, 'old', timestamptz '2024-01-01' + g * interval '1 s' FROM generate_series(1, 30) g"
    )
    harness.write_catalog(
        {
            "items": {
                "table": "items",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 20,
                "retries": {"max_attempts": 1},
            }
        }
    )
    harness.materialize()
    harness.source.execute(
        "INSERT INTO items SELECT g, 'new', timestamptz '2024-02-01' + g * interval '1 s' FROM generate_series(31, 130) g"
    )
    killed = harness.materialize_cli("items", **{FAULT_ENV: "after_checkpoint:2:kill"})
    assert killed.wait(timeout=180) != 0
    assert harness.target_count("items") == 90  # 30, and three slices of 20
    harness.execute_target(f'DELETE FROM "{harness.source_name}".items WHERE id <= 10 OR id BETWEEN 31 AND 40')

    result = harness.materialize()
    (materialization,) = result.asset_materializations_for_node(f"{harness.source_name}__items")
    assert materialization.metadata["rows repaired"].value == 20
    harness.assert_target_equals_source("items", "items", "id")
