"""A run with nothing new to read imports no dlt: its checks and checkpoint go through the destination's own
client (DuckDB, psycopg2). dlt (with sqlglot, and its configuration resolution) comes in with dlt's schema (a new
table or column), a dead letter or a load through dlt, and was most of what a no-change run cost over Dagster's
floor. An incremental run whose rows fit the target table's columns loads them without dlt too (DuckDB's direct
merge, PostgreSQL's COPY + merge)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ingestion_assets_tests.helpers import StreamHarness

# Every Python process of the run (the CLI and its step process) loads this first: it records who imports dlt.
PROBE = """
import importlib.abc, os, sys, traceback
class _Record(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("dlt", "sqlglot"):
            asked = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "ingestion_assets" in f.filename]
            with open(os.environ["NO_DLT_RECORD"], "a") as out:
                out.write(f"{name} by {asked[-4:]}\\n")
            sys.meta_path.remove(self)  # once is enough, and the run goes on
        return None
sys.meta_path.insert(0, _Record())
"""


@pytest.mark.parametrize("change", ["nothing", "updates and inserts"])
@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_run_that_needs_no_new_column_imports_no_dlt(
    harness: StreamHarness, tmp_path: Path, destination: str, change: str
) -> None:
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, 'item ' || g, timestamptz '2024-01-01' + g * interval '1 s'"
        " FROM generate_series(1, 50) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}}, destination)
    harness.wait_ok(harness.materialize_cli("items"))  # the first run loads (with dlt)
    before = harness.checkpoint("items")
    assert before is not None
    if change != "nothing":
        harness.source.execute(
            "UPDATE items SET name = 'changed', updated_at = updated_at + interval '1 day' WHERE id % 7 = 0;"
            "INSERT INTO items SELECT g, 'new ' || g, timestamptz '2024-02-01' + g * interval '1 s'"
            " FROM generate_series(51, 60) g"
        )
    _materialize_refusing_dlt(harness, tmp_path, "items")
    after = harness.checkpoint("items")
    assert after is not None and after.run_id != before.run_id  # the run checkpointed
    assert (after.position == before.position) == (change == "nothing")
    harness.assert_target_equals_source("items", "items", order_by="id")


def test_a_files_run_with_no_new_file_imports_no_dlt(harness: StreamHarness, tmp_path: Path) -> None:
    drops = tmp_path / "drops"
    drops.mkdir()
    (drops / "a.csv").write_text("id,name\n1,one\n2,two\n")
    harness.catalog_path = tmp_path / "catalog.yaml"
    harness.catalog_path.write_text(
        f"destination: {{type: duckdb, path: {harness.warehouse}}}\n"
        f"sources:\n  {harness.source_name}:\n    type: files\n    url: {drops}\n"
        '    streams:\n      rows: {path: "*.csv", primary_key: id}\n'
    )
    harness.wait_ok(harness.materialize_cli("rows"))  # the first run loads (with dlt)
    before = harness.checkpoint("rows")
    _materialize_refusing_dlt(harness, tmp_path, "rows")
    after = harness.checkpoint("rows")
    assert before is not None and after is not None and after.run_id != before.run_id
    assert harness.query_target(f'SELECT id, name FROM "{harness.source_name}".rows ORDER BY id') == [
        (1, "one"),
        (2, "two"),
    ]


def _materialize_refusing_dlt(harness: StreamHarness, tmp_path: Path, stream: str) -> None:
    """`dagster asset materialize` of `stream` with the import probe in every process: nothing imported dlt."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    record = tmp_path / "dlt_imports.txt"
    path = os.pathsep.join(p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p)
    harness.wait_ok(harness.materialize_cli(stream, PYTHONPATH=path, NO_DLT_RECORD=str(record)))
    assert not record.exists(), record.read_text()
