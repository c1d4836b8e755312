"""`ingest dlq replay` of a CDC stream: the parked changes' rows are read again from the source table and load at
the log position the stream applied (above every change in the target, below every change still in the log),
under the source's slot lock; every destination CDC loads. Compared with the source row by row."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingestion_assets.cli import main
from ingestion_assets.sources.postgres.cdc.slot_lock import reading_slot
from ingestion_assets_tests.destination_targets import MariaDb, lake_rows, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import FAST
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc", "mariadb"]  # fixtures: the slot and publication a test leaves are dropped; MariaDB databases

ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), memo text, at timestamptz);
INSERT INTO orders SELECT g, g * 1.5, 'memo ' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 h'
FROM generate_series(1, 5) g;
"""
COLUMNS = ["id", "amount", "memo", "at"]
Rows = Callable[[], list[tuple[Any, ...]]]


def _setup(request: pytest.FixtureRequest, harness: StreamHarness, kind: str, tmp_path: Path) -> Rows:
    """The orders stream in `mode: cdc` into `kind`; returns a reader of the target's rows (COLUMNS, by id)."""
    harness.source.execute(ORDERS)
    postgres = kind == "postgres"
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id"}},
        destination="postgres" if postgres else "duckdb",
        mode="cdc",
        cdc={**FAST, "lock_wait_seconds": 1},
    )
    if kind == "mariadb":
        db: MariaDb = request.getfixturevalue("mariadb")
        db.datasets.append(harness.source_name)
        use_destination(harness, db.destination())
        return lambda: db.rows(harness.source_name, "orders", COLUMNS, "id")
    if kind == "delta":
        use_destination(harness, {"type": "filesystem", "bucket_url": str(tmp_path / "lake"), "table_format": kind})
        url = str(tmp_path / "lake" / harness.source_name / "orders")
        return lambda: lake_rows(kind, url, COLUMNS, "id")
    return lambda: harness.target_rows("orders", COLUMNS, "id")


def _cli(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)


def _parked(harness: StreamHarness, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The keys `ingest dlq list` shows (it reads every destination's dead letters)."""
    capsys.readouterr()
    assert main(["dlq", "list", f"{harness.source_name}.orders"]) == 0
    return sorted(re.findall(r"^  key (\S+)", capsys.readouterr().out, re.MULTILINE))


def _replay(harness: StreamHarness, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["dlq", "replay", f"{harness.source_name}.orders"])
    return code, capsys.readouterr().out


def _park_two(harness: StreamHarness, capsys: pytest.CaptureFixture[str]) -> None:
    """Copied, then an update of a copied row and an insert the target cannot take (NaN has no decimal value)."""
    harness.materialize()
    harness.source.execute("UPDATE orders SET amount = 'NaN', memo = 'nan' WHERE id = 2")
    harness.source.execute("INSERT INTO orders VALUES (6, 'NaN', 'new', '2024-02-01 00:00:00+00')")
    harness.materialize()
    assert _parked(harness, capsys) == ["2", "6"]


@pytest.mark.parametrize(
    "kind",
    [
        "duckdb",
        "postgres",
        pytest.param("mariadb", marks=pytest.mark.slow),
        pytest.param("delta", marks=pytest.mark.slow),
    ],
)
def test_parked_cdc_changes_replay_from_the_source_and_the_log_goes_on_after_them(
    request: pytest.FixtureRequest,
    cdc: StreamHarness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """The replay loaded a timestamp into the CDC target's decimal log position and failed. Each replayed row
    must replace the copied version of its key, and every change after the replay must still apply over it."""
    harness = cdc
    rows = _setup(request, harness, kind, tmp_path)
    _cli(harness, monkeypatch)
    _park_two(harness, capsys)
    assert [r for r in rows() if r[0] == 2] == [(2, 3, "memo 2", harness.source.rows("orders", "id")[1][3])]

    # Fixed at the source; the fixing changes wait in the log: only the replay brings the rows in now.
    harness.source.execute("UPDATE orders SET amount = 20, memo = 'fixed' WHERE id = 2")
    harness.source.execute("UPDATE orders SET amount = 60 WHERE id = 6")
    code, said = _replay(harness, capsys)
    assert code == 0, said
    assert "2 dead letter(s) read again: 2 released, 0 still bad" in said
    assert _parked(harness, capsys) == []
    assert rows() == harness.source.rows("orders", "id")

    # The log after the replay: the fixing changes (already in the target), then newer ones, a delete among them.
    harness.source.execute("UPDATE orders SET memo = 'later' WHERE id = 2; DELETE FROM orders WHERE id = 6")
    harness.source.execute("INSERT INTO orders VALUES (7, 7, 'seven', NULL)")
    harness.materialize()
    assert rows() == harness.source.rows("orders", "id")
    assert _parked(harness, capsys) == []


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_a_replay_keeps_a_newer_version_of_the_key_and_brings_back_no_deleted_row(
    request: pytest.FixtureRequest,
    cdc: StreamHarness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """A parked key whose row a newer change already replaced in the target keeps that row; one whose row the
    source deleted since stays parked for a person (no version of it is left to compare with)."""
    harness = cdc
    rows = _setup(request, harness, kind, tmp_path)
    _cli(harness, monkeypatch)
    _park_two(harness, capsys)
    table = f'"{harness.source_name}".orders'
    # Key 2: the target holds a version newer than any the stream's checkpoint covers (a change applied after it).
    harness.execute_target(f"UPDATE {table} SET memo = 'newer', _ingest_position = _ingest_position * 10 WHERE id = 2")
    newer = [r for r in rows() if r[0] == 2]
    harness.source.execute("UPDATE orders SET amount = 20 WHERE id = 2")  # fixed, still in the log
    harness.source.execute("DELETE FROM orders WHERE id = 6")  # gone before the replay: nothing to load
    code, said = _replay(harness, capsys)
    assert code == 1, said
    assert "2 dead letter(s) read again: 1 released, 0 still bad (parked again with today's error), 1 gone" in said
    assert [r for r in rows() if r[0] == 2] == newer  # kept: the target's version is newer
    assert [r[0] for r in rows()] == [1, 2, 3, 4, 5]  # 6 not brought back
    assert _parked(harness, capsys) == ["6"]


def test_a_replay_waits_for_the_run_holding_the_slot_and_replays_nothing_without_it(
    request: pytest.FixtureRequest,
    cdc: StreamHarness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run applying the log between the replay's read and its load could delete a row the load then brings
    back: the replay holds the run's lock, and says who has it when it cannot get it."""
    harness = cdc
    rows = _setup(request, harness, "duckdb", tmp_path)
    _cli(harness, monkeypatch)
    _park_two(harness, capsys)
    before = rows()
    harness.source.execute("UPDATE orders SET amount = 20 WHERE amount = 'NaN'")
    slot = f"ingest_{harness.source_name}"
    with reading_slot(harness.source.url, slot, 1, run_id="run-4711"), pytest.raises(SystemExit) as failed:
        main(["dlq", "replay", f"{harness.source_name}.orders"])
    message = str(failed.value)
    assert "held by Dagster run run-4711" in message and "Nothing was replayed" in message, message
    assert rows() == before
    assert _parked(harness, capsys) == ["2", "6"]
    code, said = _replay(harness, capsys)
    assert code == 0 and rows() == harness.source.rows("orders", "id"), said


def test_a_column_that_cannot_land_stops_the_replay_in_one_line_and_replays_nothing(
    request: pytest.FixtureRequest,
    cdc: StreamHarness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A column added since the last run whose name the target already holds in another spelling: the replay
    ended in a traceback (its error is no failure `ingest dlq replay` expected)."""
    harness = cdc
    rows = _setup(request, harness, "duckdb", tmp_path)
    _cli(harness, monkeypatch)
    _park_two(harness, capsys)
    before = rows()
    harness.source.execute('ALTER TABLE orders ADD COLUMN "Memo" text')  # DuckDB's names ignore case: memo
    with pytest.raises(SystemExit) as failed:
        main(["dlq", "replay", f"{harness.source_name}.orders"])
    message = str(failed.value)
    assert message.startswith(f"error: {harness.source_name}.orders: dlq replay failed: "), message
    assert "'memo' and 'Memo' both land as column 'memo'" in message and "\n" not in message, message
    assert rows() == before
    assert _parked(harness, capsys) == ["2", "6"]
