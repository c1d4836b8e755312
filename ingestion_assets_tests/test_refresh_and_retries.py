"""Full refresh that cannot half-replace, retries that resume and know when to stop."""

from __future__ import annotations

import dagster as dg
import pytest

from ingestion_assets.cli import main
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item ' || g, g * 1.5, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 3000) g;
"""


def _catalog(harness: StreamHarness, disposition: str = "merge", **retries: object) -> None:
    harness.write_catalog(
        {
            "items": {
                "table": "items",
                "primary_key": "id",
                "cursor": "updated_at",
                "write_disposition": disposition,
                "slice_rows": 500,
                "retries": {"max_attempts": 1, "delay_seconds": 0.1, **retries},
            }
        }
    )


def _generations(harness: StreamHarness) -> list[tuple[int, int]]:
    return [
        (int(g), int(n))
        for g, n in harness.query_target(
            f'SELECT _ingest_generation_id, count(*) FROM "{harness.source_name}".items GROUP BY 1 ORDER BY 1'
        )
    ]


def test_replace_loads_a_new_generation_and_swaps_it_in_only_when_complete(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, "replace")
    harness.materialize()
    assert _generations(harness) == [(1, 3000)]
    first = 1
    harness.assert_target_equals_source("items", "items", "id")

    harness.source.execute("DELETE FROM items WHERE id <= 100; UPDATE items SET name = 'renamed' WHERE id > 2900")
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:2")  # the refresh dies after three of six slices
    assert not harness.materialize(raise_on_error=False).success
    assert _generations(harness) == [(first, 3000)]  # the previous table is intact and queryable
    assert harness.target_count("items") == 3000

    monkeypatch.setenv(FAULT_ENV, "before_swap:0")  # the read completes, the process dies before the swap
    assert not harness.materialize(raise_on_error=False).success
    assert _generations(harness) == [(first, 3000)]

    monkeypatch.delenv(FAULT_ENV)
    harness.materialize()
    assert _generations(harness) == [(first + 1, 2900)]  # swapped: deleted rows are gone
    harness.assert_target_equals_source("items", "items", "id")
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None and checkpoint.details["generation"] == first + 1
    assert "refresh" not in checkpoint.details

    harness.materialize()  # every run of a replace stream is a refresh
    assert _generations(harness) == [(first + 2, 2900)]


def test_refresh_remove_and_retain_from_the_cli(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    assert _generations(harness) == [(1, 3000)]
    harness.source.execute("DELETE FROM items WHERE id <= 10")

    assert main(["refresh", f"{harness.source_name}.items", "--retain", "--later"]) == 0
    assert "refresh requested (retain)" in capsys.readouterr().out
    harness.materialize()
    assert _generations(harness) == [(1, 10), (2, 2990)]  # retained: rows gone from the source stay
    assert harness.target_count("items") == 3000

    assert main(["refresh", f"{harness.source_name}.items", "--later"]) == 0
    harness.materialize()
    assert _generations(harness) == [(3, 2990)]
    harness.assert_target_equals_source("items", "items", "id")
    harness.source.execute("UPDATE items SET name = 'after refresh', updated_at = now() WHERE id = 11")
    harness.materialize()  # back to incremental, from the refresh's final position
    harness.assert_target_equals_source("items", "items", "id")
    assert _generations(harness) == [(3, 2990)]


def test_attempts_without_progress_stop_retrying_with_a_diagnostic(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, max_attempts=6, max_no_progress=2)
    monkeypatch.setenv(FAULT_ENV, "before_load:0")  # every attempt dies before its first commit
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    starts = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START]
    restarts = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_RESTARTED]
    assert len(starts) + len(restarts) == 2  # stopped after 2 attempts, not 6
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = str(failure.step_failure_data.error)
    assert "made no progress in 2 attempts in a row" in message and "slice_rows" in message


def test_attempts_that_make_progress_keep_retrying_from_their_checkpoint(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, max_attempts=4, max_no_progress=1)
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:1")  # each attempt commits two slices, then fails
    result = harness.materialize(raise_on_error=False)
    # attempts 1-3 each commit two slices of 500 and fail; attempt 4 finds nothing new and succeeds
    assert result.success
    restarts = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_RESTARTED]
    assert len(restarts) == 3
    harness.assert_target_equals_source("items", "items", "id")


@pytest.mark.parametrize("how", ["replace", "refresh"])
def test_a_refresh_of_an_emptied_table_empties_the_target_and_runs_on(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, "replace" if how == "replace" else "merge")
    harness.materialize()
    assert harness.target_count("items") == 3000
    harness.source.execute("TRUNCATE items")
    if how == "refresh":
        for key, value in harness.cli_env().items():
            monkeypatch.setenv(key, value)
        assert main(["refresh", f"{harness.source_name}.items", "--later"]) == 0
    harness.materialize()
    assert harness.target_count("items") == 0  # the refresh read nothing: the target holds nothing
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None and "refresh" not in checkpoint.details and checkpoint.details["generation"] == 2
    harness.source.execute("INSERT INTO items VALUES (7, 'back', 1, now())")
    harness.materialize()
    harness.assert_target_equals_source("items", "items", "id")


def test_a_replace_stream_of_a_table_that_was_always_empty_creates_an_empty_target(harness: StreamHarness) -> None:
    harness.source.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), updated_at timestamptz NOT NULL)")
    _catalog(harness, "replace")
    harness.materialize()
    harness.materialize()
    assert harness.target_count("items") == 0


def test_a_permanent_source_error_fails_at_once_with_the_servers_words(harness: StreamHarness) -> None:
    """A refused privilege will fail the same way every time: no backoff, no 'lower slice_rows'."""
    harness.source.execute(ITEMS)
    role = f"r_{harness.source_name}"
    harness.source.execute(f'CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA "{harness.source.schema}" TO {role}')
    try:
        _catalog(harness, max_attempts=4)
        (harness.tmp_path / "source_url").write_text(harness.source.url.replace("postgres@", f"{role}@"))
        result = harness.materialize(raise_on_error=False)
        assert not result.success
        restarts = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_RESTARTED]
        assert restarts == []
        failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
        message = str(failure.step_failure_data.error.message)
        assert "permission denied for table items" in message and "a permanent error, not retried" in message
        assert "grant the connecting user" in message and "slice_rows" not in message
    finally:
        harness.source.execute(f'REVOKE ALL ON SCHEMA "{harness.source.schema}" FROM {role}; DROP ROLE {role}')


def test_no_progress_counts_one_retry_sequence_not_every_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(ITEMS)
    _catalog(harness, max_attempts=1, max_no_progress=2)
    monkeypatch.setenv(FAULT_ENV, "before_load:0")
    for _ in range(3):  # three unrelated runs, each failing once without progress
        result = harness.materialize(raise_on_error=False)
        failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
        assert "injected fault" in str(failure.step_failure_data.error)
        assert "made no progress" not in str(failure.step_failure_data.error)


def test_a_failed_run_that_committed_nothing_keeps_the_datas_commit_time(harness: StreamHarness) -> None:
    """Its failure note is a checkpoint (it counts attempts), but `ingest state show` and the status lag say when
    the rows were committed, not when the failure was noted."""
    from ingestion_assets.state.checkpoints import latest_checkpoint

    harness.source.execute(ITEMS)
    _catalog(harness, max_attempts=1)
    harness.materialize()
    good = latest_checkpoint(harness.instance, harness.key("items"))
    assert good is not None and good.data_committed_at == good.committed_at
    harness.source.execute("ALTER TABLE items RENAME TO items_gone")
    assert not harness.materialize(raise_on_error=False).success
    noted = latest_checkpoint(harness.instance, harness.key("items"))
    assert noted is not None and noted.committed_at > good.committed_at and "last_error" in noted.details
    assert noted.data_committed_at == good.committed_at and noted.position == good.position
    assert not harness.materialize(raise_on_error=False).success  # a second failure keeps it too
    again = latest_checkpoint(harness.instance, harness.key("items"))
    assert again is not None and again.data_committed_at == good.committed_at
    harness.source.execute("ALTER TABLE items_gone RENAME TO items; INSERT INTO items VALUES (9001, 'new', 1, now())")
    harness.materialize()
    fresh = latest_checkpoint(harness.instance, harness.key("items"))
    assert fresh is not None and fresh.data_committed_at == fresh.committed_at > again.committed_at
