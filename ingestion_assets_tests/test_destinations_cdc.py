"""CDC soft deletes into the second SQL target and a lake: the deleted row keeps its last values and gets
`_ingest_deleted_at`, whether its values came in the same batch or only the target holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingestion_assets_tests.destination_targets import MariaDb, lake_rows, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc", "mariadb"]

ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount numeric(12,2), note text);
INSERT INTO orders SELECT g, 'new', g * 1.5, 'n' || g FROM generate_series(1, 200) g;
"""
FAST = {"max_changes": 300, "max_seconds": 1, "max_batches_per_run": 50, "retries": {"max_attempts": 1}}
COLUMNS = ["id", "status", "amount", "note", "_ingest_deleted_at"]


def _rows(request: pytest.FixtureRequest, harness: StreamHarness, kind: str, tmp_path: Path) -> Any:
    """Point the catalog at `kind`; returns a reader of the target's rows (COLUMNS, by id)."""
    if kind == "mariadb":
        db: MariaDb = request.getfixturevalue("mariadb")
        db.datasets.append(harness.source_name)
        use_destination(harness, db.destination())
        return lambda: db.rows(harness.source_name, "orders", COLUMNS, "id")
    use_destination(harness, {"type": "filesystem", "bucket_url": str(tmp_path / "lake"), "table_format": kind})
    url = str(tmp_path / "lake" / harness.source_name / "orders")
    return lambda: lake_rows(kind, url, COLUMNS, "id")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mariadb", "delta", "iceberg"])
def test_a_cdc_soft_delete_keeps_the_last_values_and_sets_deleted_at(
    request: pytest.FixtureRequest, cdc: StreamHarness, tmp_path: Path, kind: str
) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id", "deletes": "soft"}}, mode="cdc", cdc=FAST
    )
    rows = _rows(request, harness, kind, tmp_path)
    harness.materialize()
    harness.source.execute("UPDATE orders SET status = 'last' WHERE id <= 5")
    harness.materialize()
    harness.source.execute("DELETE FROM orders WHERE id <= 3")  # values only in the target
    harness.source.execute(
        "INSERT INTO orders VALUES (5000, 'brief', 2, 'x'); UPDATE orders SET status = 'gone' WHERE id = 4"
    )
    harness.source.execute("DELETE FROM orders WHERE id IN (4, 5000)")  # values in the same batch
    harness.materialize()
    found = rows()
    deleted = [(i, s, float(a), n) for i, s, a, n, at in found if at is not None]
    assert deleted == [
        (1, "last", 1.5, "n1"),
        (2, "last", 3.0, "n2"),
        (3, "last", 4.5, "n3"),
        (4, "gone", 6.0, "n4"),
        (5000, "brief", 2.0, "x"),
    ]
    live = [(i, s, a, n) for i, s, a, n, at in found if at is None]
    assert live == harness.source.rows("orders", "id")
