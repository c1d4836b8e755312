"""After a run, compare the source's keys with the target's for the window the run covered.

Every source row at or before the checkpoint must be in the target (or parked as a dead letter) at a
version no older than the source's. A mismatch is reported as a failed asset check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.loading.metadata_columns import POSITION, sortable_text
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.versions import STALE, existing_keys
from ingestion_assets.sources.postgres.query import Position, ReadPlan, Window
from ingestion_assets.sources.postgres.reader import connect, copy_batches

SAMPLE = 10


@dataclass(frozen=True)
class Reconciliation:
    scope: str
    checked: int = 0
    missing: int = 0
    stale: int = 0
    parked: int = 0
    sample: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.missing == 0 and self.stale == 0


def reconcile(
    url: str,
    plan: ReadPlan,
    loader: Loader,
    window: Window | None,
    start: Position | None,
    end: Position | None,
    scope: str,
) -> Reconciliation | None:
    if scope == "off" or end is None:
        return None
    source = _source_keys(url, plan, window, None if scope == "full" else start, end)
    if source.num_rows == 0:
        return Reconciliation(scope)
    primary_key = loader.key  # compared under the target's names
    source = source.rename_columns(list(loader.names.columns(source.column_names)))
    with loader.client() as client:
        found = existing_keys(client, loader.destination.type, loader.target.table, primary_key, source)
    present = found if found is not None else source.slice(0, 0).append_column(STALE, pa.array([], pa.bool_()))
    missing_rows = source.join(present.select(list(primary_key)), keys=list(primary_key), join_type="left anti")
    missing_keys = set(record_keys(missing_rows, primary_key).to_pylist()) if missing_rows.num_rows else set()
    parked = missing_keys & loader.parked()
    stale = int(pc.sum(present[STALE]).as_py() or 0) if plan.cursor else 0
    unexplained = sorted(missing_keys - parked)
    return Reconciliation(scope, source.num_rows, len(unexplained), stale, len(parked), unexplained[:SAMPLE])


def _source_keys(url: str, plan: ReadPlan, window: Window | None, start: Position | None, end: Position) -> pa.Table:
    """Primary key and version of every source row in the window, after `start` and up to `end`."""
    conn = connect(url, "ingest-reconcile")
    try:
        statement = plan.keys_statement(conn, start, end, window)
    finally:
        conn.close()
    shape = plan.key_shape
    batches = list(copy_batches(url, statement, shape, "ingest-reconcile"))
    table = pa.Table.from_batches(batches) if batches else shape.arrow_schema.empty_table()
    columns = [table.column(c) for c in plan.cursor]
    version = columns[0] if len(columns) == 1 else (sortable_text(columns) if columns else pa.nulls(table.num_rows))
    return table.select(list(plan.primary_key)).append_column(POSITION, version)
