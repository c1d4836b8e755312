"""An accepted schema change whose migration fails on the target is not forgotten (found by a README-only attacker:
the failed run's record stored the new schema as if applied, so later runs loaded into the old column types and a
PostgreSQL numeric(5,2) rounded 1.2345 to 1.23 with status ok and reconcile clean)."""

from __future__ import annotations

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets_tests.helpers import StreamHarness


def _failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    event = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    return str(event.step_failure_data.error)


def test_an_accepted_change_whose_migration_failed_is_applied_again_by_the_next_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(
        "CREATE TABLE w3 (id int PRIMARY KEY, n numeric(5,2), updated_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO w3 (id, n) VALUES (1, 1.23), (2, 2.5)"
    )
    harness.write_catalog({"w3": {"table": "w3", "primary_key": "id", "cursor": "updated_at"}}, destination="postgres")
    harness.materialize()
    harness.source.execute(  # numeric widened; the NOT NULL cursor retyped incompatibly (its values cannot follow)
        "ALTER TABLE w3 ALTER n TYPE numeric(12,4); ALTER TABLE w3 ALTER updated_at TYPE timestamp;"
        "UPDATE w3 SET n = 12345.6789, updated_at = now() + interval '1 s' WHERE id = 1"
    )
    assert "ingest schema accept" in _failure(harness.materialize(raise_on_error=False))  # paused
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "accept", f"{harness.source_name}.w3"]) == 0
    for _ in range(2):  # the migration fails, and is tried again (it was forgotten, then loads hit the old type)
        assert 'column "updated_at" of relation "w3" contains null values' in _failure(
            harness.materialize(raise_on_error=False)
        )
    harness.source.execute("UPDATE w3 SET n = 1.2345, updated_at = now() + interval '2 s' WHERE id = 1")
    assert "contains null values" in _failure(harness.materialize(raise_on_error=False))  # still loud
    assert harness.query_target(f'SELECT id, n::text FROM "{harness.source_name}".w3 ORDER BY id') == [
        (1, "1.23"),  # as first loaded: never 1.2345 rounded into numeric(5,2)
        (2, "2.50"),
    ]
