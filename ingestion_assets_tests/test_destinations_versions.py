"""The version guard on MariaDB and lakes: a row older than the target's never overwrites it, whatever the order."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from ingestion_assets.catalog import Destination
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.pipeline import Loader, TargetTable
from ingestion_assets.loading.targets import make_loader
from ingestion_assets.loading.versions import STALE, keep_newest
from ingestion_assets_tests.destination_targets import MariaDb, mariadb
from ingestion_assets_tests.helpers import StreamHarness

__all__ = ["mariadb"]


def _destination(request: pytest.FixtureRequest, harness: StreamHarness, kind: str) -> dict[str, Any]:
    if kind == "mariadb":
        db: MariaDb = request.getfixturevalue("mariadb")
        db.datasets.append(harness.source_name)
        return db.destination()
    return {"type": "filesystem", "bucket_url": str(harness.tmp_path / "lake"), "table_format": kind}


def _rows(version: dt.datetime, ids: list[int], label: str, cursor: list[str]) -> pa.Table:
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([label] * len(ids)),
            "updated_at": pa.array([version] * len(ids), pa.timestamp("us", tz="UTC")),
            "n": pa.array([10] * len(ids), pa.int32()),  # a second cursor column: the version is a text
        }
    )
    return with_metadata(table, cursor, dt.datetime.now(dt.UTC), 1)


def _target(loader: Loader) -> list[tuple[Any, ...]]:
    with loader.client() as client:
        rows = client.execute_sql(f"SELECT id, label FROM {client.make_qualified_table_name('versions')} ORDER BY id")
    return [tuple(row) for row in rows or []]


SLOW = pytest.mark.slow
CASES = [
    pytest.param(
        "mariadb", ["updated_at", "n"], id="mariadb-text", marks=SLOW
    ),  # MariaDB would compare DECIMAL or text its way
    pytest.param("mariadb", ["updated_at"], id="mariadb-timestamp", marks=SLOW),
    pytest.param("delta", ["updated_at", "n"], id="delta-text", marks=SLOW),
    pytest.param("iceberg", ["updated_at"], id="iceberg-timestamp", marks=SLOW),
    pytest.param("iceberg", ["updated_at", "n"], id="iceberg-text", marks=SLOW),
]


@pytest.mark.parametrize(("kind", "cursor"), CASES)
def test_an_older_version_arriving_later_never_overwrites_a_newer_one(
    request: pytest.FixtureRequest, harness: StreamHarness, kind: str, cursor: list[str]
) -> None:
    harness.write_catalog({"x": {"table": "x", "primary_key": "id"}})
    destination = Destination.model_validate(_destination(request, harness, kind))
    loader = make_loader(
        harness.settings,
        destination,
        target=TargetTable(harness.source_name, "versions", ("id",), "merge"),
        pipeline_name=f"guard_{kind}_{harness.source_name}",
        guard_versions=True,
    )
    old, new = dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    assert loader.load(_rows(new, [1, 2, 3], "v2", cursor)) == 3  # the live tail lands the update first
    assert loader.load(_rows(old, [1, 2, 3, 4], "v1", cursor)) == 1  # the history chunk: only id 4 is not stale
    assert loader.load(_rows(new, [3], "v2-again", cursor)) == 1  # equal version: a replay is applied
    assert _target(loader) == [(1, "v2"), (2, "v2"), (3, "v2-again"), (4, "v1")]


def test_a_key_with_a_version_newer_than_the_target_keeps_its_rows_beside_an_older_one() -> None:
    """The guard drops a key only when every version of it in the slice is older than the target's (one key
    and two columns of key alike); the merge then keeps the newest of the rows left."""
    rows = pa.table({"a": [1, 1, 2, 3], "b": ["x", "x", "y", "z"], "_ingest_position": ["1", "9", "2", "8"]})
    found = pa.table({"a": [1, 1, 2, 3], "b": ["x", "x", "y", "z"], STALE: [True, False, True, None]})
    assert keep_newest(rows, found, ("a", "b")).rows == rows.filter(pa.array([True, True, False, True]))
    single = keep_newest(rows.drop_columns(["b"]), found.drop_columns(["b"]), ("a",)).rows
    assert single["a"].to_pylist() == [1, 1, 3] and single["_ingest_position"].to_pylist() == ["1", "9", "8"]
