"""What a destination can never hold fails at once, in `ingest check` and in the run, and is never retried."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import dlt
import duckdb
import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.errors import classify
from ingestion_assets_tests.helpers import SourceDb, StreamHarness

WIDTH_WORDS = "1596 source columns and the product's 5"


def test_a_table_wider_than_a_postgres_target_can_hold_is_refused_by_check_and_run(harness: StreamHarness) -> None:
    """Found by a README-only attack: 1,596 source columns passed `ingest check`, then the load's CREATE TABLE of
    1,601 columns (our five `_ingest_*` added) failed with 54011, which dlt labels transient: retried for
    minutes. Check and run now refuse with the numbers, and the run in one attempt."""
    others = ", ".join(f"c{i} int" for i in range(1, 1595))
    harness.source.execute(
        f"CREATE TABLE wide (id int PRIMARY KEY, updated_at timestamptz NOT NULL, {others});"
        "INSERT INTO wide (id, updated_at) VALUES (1, now())"
    )
    spec = {"table": "wide", "primary_key": "id", "cursor": "updated_at", "retries": {"max_attempts": 3}}
    harness.write_catalog({"wide": spec}, destination="postgres")
    problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    assert len(problems) == 1 and problems[0].startswith(f"stream {harness.source_name}.wide: {WIDTH_WORDS}")
    assert "make 1601 target columns, more than the 1600 a table of a PostgreSQL destination" in problems[0]
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    assert [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_RESTARTED] == []
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert WIDTH_WORDS in failure.step_failure_data.error.message
    assert harness.query_target(f"SELECT to_regclass('\"{harness.source_name}\".wide')") == [(None,)]


def _with_password(url: str) -> str:
    """dlt requires a password; the embedded server trusts loopback and ignores it."""
    parts = urlsplit(url)
    netloc = f"{parts.username}:unused@{parts.hostname}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def test_a_destination_error_dlt_calls_transient_is_judged_by_the_server_s_own_code(
    source_db: SourceDb, tmp_path: Path
) -> None:
    """dlt wraps every PostgreSQL OperationalError (a program limit, 54xxx, among them) and DuckDB's invalid input
    in DatabaseTransientException: the driver's error beneath decides; a lost session stays transient."""
    pipeline = dlt.pipeline(
        pipeline_name="limits",
        destination=dlt.destinations.postgres(_with_password(source_db.url)),
        dataset_name="limits",
        pipelines_dir=str(tmp_path / "pipelines"),
    )
    wide = ", ".join(f"c{i} int" for i in range(1601))
    with pipeline.sql_client() as client:
        with pytest.raises(Exception) as too_wide:  # dlt's class is the point
            client.execute_sql(f"CREATE TEMP TABLE too_wide ({wide})")
        assert "Transient" in type(too_wide.value).__name__  # dlt's label
        assert not classify(too_wide.value).transient
        with pytest.raises(Exception) as lost:
            client.execute_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        assert classify(lost.value).transient
    ducks = dlt.pipeline(
        pipeline_name="limits_duckdb",
        destination=dlt.destinations.duckdb(str(tmp_path / "t.duckdb")),
        dataset_name="limits",
        pipelines_dir=str(tmp_path / "pipelines"),
    )
    with ducks.sql_client() as client:
        with pytest.raises(Exception) as invalid:
            client.execute_sql("SELECT regexp_matches('a', '(')")  # a pattern that never parses
        assert "Transient" in type(invalid.value).__name__
        assert isinstance(invalid.value.__cause__, duckdb.InvalidInputException)
        assert not classify(invalid.value).transient
