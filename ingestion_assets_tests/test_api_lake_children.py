"""API records with nested lists on lake destinations (Delta, Iceberg): a record merged again (a newer version) has
exactly its new lists' child rows afterwards, in every nested level, compared row by row with the server's records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.state.summary import request_refresh
from ingestion_assets_tests.destination_targets import use_destination
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog


def _record(i: int, lines: int, tags: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"item {i}",
        "tags": [f"t{i}-{j}" for j in range(tags)],
        "lines": [{"sku": f"s{i}-{j}", "parts": [f"p{i}-{j}-{k}" for k in range(j + 1)]} for j in range(lines)],
    }


def _read(table_format: str, url: Path) -> list[dict[str, Any]]:
    if not url.exists():
        return []
    if table_format == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(url)).to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]
    from pyiceberg.table import StaticTable

    metadata = sorted((url / "metadata").glob("*.metadata.json"))[-1]
    return StaticTable.from_metadata(str(metadata)).scan().to_arrow().to_pylist()  # type: ignore[no-any-return]


def _held(table_format: str, dataset: Path) -> dict[int, tuple[Any, ...]]:
    """What the lake holds per record id: (name, tags, lines with their parts), children in list order."""
    roots = _read(table_format, dataset / "orders")
    tags, lines, parts = (_read(table_format, dataset / f"orders__{t}") for t in ("tags", "lines", "lines__parts"))

    def children(rows: list[dict[str, Any]], parent: str) -> list[dict[str, Any]]:
        return sorted((r for r in rows if r["_dlt_parent_id"] == parent), key=lambda r: r["_dlt_list_idx"])

    held: dict[int, tuple[Any, ...]] = {}
    for root in roots:
        assert root["id"] not in held, f"duplicate root {root['id']}"
        held[root["id"]] = (
            root["name"],
            [t["value"] for t in children(tags, root["_dlt_id"])],
            [(line["sku"], [p["value"] for p in children(parts, line["_dlt_id"])]) for line in children(lines, root["_dlt_id"])],
        )
    ids = {r["_dlt_id"] for r in roots} | {line["_dlt_id"] for line in lines}
    orphans = [r for r in tags + lines + parts if r["_dlt_parent_id"] not in ids]
    assert not orphans, f"child rows whose parent row is gone: {orphans[:3]}"
    return held


def _served(api: DemoApi) -> dict[int, tuple[Any, ...]]:
    return {
        r["id"]: (
            r["name"],
            list(r.get("tags", [])),
            [(line["sku"], list(line.get("parts", []))) for line in r.get("lines", [])],
        )
        for r in api.records("orders")
    }


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_record_merged_again_on_a_lake_keeps_only_its_new_child_rows(
    harness: StreamHarness, empty_api: DemoApi, table_format: str
) -> None:
    """Child rows are merged on their own `_dlt_id` (the parent's id and the list index), so a list that shrank,
    emptied or vanished kept its old items on Delta and Iceberg (DuckDB deletes a merged root's children first):
    the lake held all 3 old lines of a record updated to 1 line, with no warning (attack26). Now the children of
    every merged root that this load did not write go, in every nested level; a list that grows still loads."""
    api = empty_api
    api.put("orders", [_record(i, lines=3, tags=2) for i in range(1, 9)])
    write_api_catalog(harness, api, cursor="updated_at", max_table_nesting=2)
    lake = harness.tmp_path / "lake"
    use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": table_format})
    dataset = lake / harness.source_name
    harness.materialize()
    assert _held(table_format, dataset) == _served(api)

    shrunk = _record(1, lines=1, tags=0)
    gone = {k: v for k, v in _record(4, lines=3, tags=2).items() if k != "lines"}
    fewer_parts = _record(5, lines=3, tags=1)
    fewer_parts["lines"][2]["parts"] = ["only"]
    api.put("orders", [shrunk, gone, fewer_parts, _record(6, lines=5, tags=3)])
    harness.materialize()
    assert _held(table_format, dataset) == _served(api)

    api.put("orders", [_record(1, lines=2, tags=1), {"id": 5, "name": "bare"}])  # grows again, all lists go
    harness.materialize()
    assert _held(table_format, dataset) == _served(api)

    api.put("orders", [_record(6, lines=2, tags=0)])  # a refresh that retains the target merges everything again
    request_refresh(harness.settings, harness.source_name, "orders", "retain")
    harness.materialize()
    assert _held(table_format, dataset) == _served(api)


def test_a_run_stopped_between_the_load_and_the_child_cleanup_cleans_up_when_run_again(
    harness: StreamHarness, empty_api: DemoApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta commits one table at a time: a run stopped after dlt's commits and before the stale children go leaves
    them beside the new rows (what a reader may see until the next run) and no checkpoint; the next run re-reads the
    slice, merges the same ids again and removes them."""
    from ingestion_assets.loading import lake

    api = empty_api
    api.put("orders", [_record(i, lines=3, tags=2) for i in range(1, 5)])
    write_api_catalog(harness, api, cursor="updated_at", max_table_nesting=2)
    lake_dir = harness.tmp_path / "lake"
    use_destination(harness, {"type": "filesystem", "bucket_url": str(lake_dir), "table_format": "delta"})
    dataset = lake_dir / harness.source_name
    harness.materialize()
    api.put("orders", [_record(2, lines=1, tags=1)])

    def stopped(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("stopped before the stale children went")

    with monkeypatch.context() as patch:
        patch.setattr(lake, "retire_stale_children", stopped)
        assert not harness.materialize(raise_on_error=False).success
    assert len(_held("delta", dataset)[2][2]) == 3  # the new first line, and the two stale ones
    harness.materialize()
    assert _held("delta", dataset) == _served(api)
