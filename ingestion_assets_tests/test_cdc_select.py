"""`dagster asset materialize --select` of some streams of a CDC source: the source runs whole (one slot, one
log), the streams not selected keep their changes and checkpoints. On the embedded PostgreSQL and a DuckDB file."""

from __future__ import annotations

from ingestion_assets.catalog import load_catalog
from ingestion_assets.observe.status import stream_statuses
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_reserved_columns import TABLES, _catalog, _events_exact, _orders_exact
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves


def test_selecting_one_stream_of_a_cdc_source_runs_the_source_and_keeps_the_others_changes(cdc: StreamHarness) -> None:
    """`--select` of one stream of a CDC source failed before any run with Dagster's subset error (a stack trace):
    the source is one multi-asset, as it reads one slot. It now runs the source; the streams not selected keep
    their changes and checkpoints."""
    harness = cdc
    harness.source.execute(TABLES.replace("_ingest_position", "position"))
    _catalog(harness, "orders", "events")
    harness.materialize()
    before = harness.checkpoint("events")
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id < 5; UPDATE events SET kind = 'x' WHERE id < 4")
    process = harness.materialize_cli("orders")
    harness.wait_ok(process)
    assert "applied the changes of " in harness.log_text(process)
    _orders_exact(harness)
    _events_exact(harness)  # applied and checkpointed by the same run
    after = harness.checkpoint("events")
    assert before is not None and after is not None and after.position != before.position
    harness.source.execute("UPDATE events SET kind = 'y' WHERE id = 5; DELETE FROM orders WHERE id = 2")
    result = harness.materialize("events")
    assert result.success
    harness.materialize()
    _orders_exact(harness)
    _events_exact(harness)


def test_a_stream_its_source_runs_without_selecting_it_is_not_shown_as_never_synced(cdc: StreamHarness) -> None:
    """The first run selects one stream: the other is copied and checkpointed without a materialization. `ingest
    status` said `never synced` (needing attention) for it (found by a README-only attack)."""
    harness = cdc
    harness.source.execute(TABLES.replace("_ingest_position", "position"))
    _catalog(harness, "orders", "events")
    assert harness.materialize("orders").success
    _events_exact(harness)
    statuses = {
        s.stream: s
        for s in stream_statuses(harness.settings, load_catalog(harness.settings.catalog_path), harness.instance)
    }
    events = statuses[f"{harness.source_name}.events"]
    assert events.status == "ok", events
    assert "not materialized in Dagster yet" in events.detail
