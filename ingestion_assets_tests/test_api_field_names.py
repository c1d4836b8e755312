"""API record fields whose names land in one target column (`Name` and `name`, `userId` and `user_id`, every
non-Latin name as `x` under snake_case, `a.b` and `a__b`, inside objects and list items) loaded one value over
the other without a word. Such a record is parked naming both fields and the column; the rest load, on DuckDB
and PostgreSQL. The check follows dlt's own flattening: it is compared with dlt's normalizer on random records."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.streams.rest_fields import name_collision
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

RECORDS = [
    {"id": 1, "name": "lower", "Name": "Upper"},
    {"id": 2, "userId": 11, "user_id": 99},
    {"id": 3, "名前": "taro", "住所": "tokyo"},
    {"id": 4, "obj": {"B": "one", "b": "two"}},
    {"id": 5, "items": [{"x": "one", "X": "two"}]},
    {"id": 6, "obj": {"y": "nested"}, "obj__y": "flat"},
    {"id": 7, "name": "n7", "userId": 17, "名前": "only", "obj": {"b": "b7", "y": "y7"}, "items": [{"x": "x7"}]},
    {"id": 8, "Name": "N8", "user_id": 18, "items": [{"X": "x8"}, {"x": "x8b"}]},
]


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_fields_landing_in_one_column_park_the_record(harness: StreamHarness, empty_api: DemoApi, destination: str) -> None:
    empty_api.put("orders", RECORDS)
    write_api_catalog(harness, empty_api, destination=destination)
    harness.materialize()
    schema = harness.source_name
    rows = harness.query_target(f'SELECT id, name, user_id, x, obj__b, obj__y FROM "{schema}".orders ORDER BY id')
    assert rows == [(7, "n7", 17, "only", "b7", "y7"), (8, "N8", 18, None, None, None)]
    items = harness.query_target(
        f'SELECT o.id, i.x FROM "{schema}".orders__items i JOIN "{schema}".orders o ON i._dlt_parent_id = o._dlt_id '
        "ORDER BY o.id, i._dlt_list_idx"
    )
    assert items == [(7, "x7"), (8, "x8"), (8, "x8b")]  # one field per item: no value lost
    parked = harness.query_target(f'SELECT record_key, error, raw_record FROM "{schema}"._ingest_dead_letter')
    found = {int(key): (error, raw if isinstance(raw, dict) else json.loads(raw)) for key, error, raw in parked}
    assert sorted(found) == [1, 2, 3, 4, 5, 6]
    assert "fields 'name' and 'Name' land as column 'name'" in found[1][0]
    assert "fields 'userId' and 'user_id' land as column 'user_id'" in found[2][0]
    assert "fields '名前' and '住所' land as column 'x'" in found[3][0]
    assert "fields 'obj.B' and 'obj.b' land as column 'obj__b'" in found[4][0]
    assert "fields 'items[].x' and 'items[].X' land as column 'x'" in found[5][0]
    assert "'obj__y'" in found[6][0] and "'obj.y'" in found[6][0]
    assert all("destination.naming: direct" in error for error, _ in found.values())
    for key in (1, 3):  # the raw record as sent (the server adds `updated_at`), both values
        assert {k: v for k, v in found[key][1].items() if k != "updated_at"} == RECORDS[key - 1]


def test_direct_naming_on_postgres_keeps_both_fields(harness: StreamHarness, empty_api: DemoApi) -> None:
    """PostgreSQL tells `Name` from `name` apart: with `naming: direct` both load, each in its own column."""
    empty_api.put("orders", [{"id": 1, "name": "lower", "Name": "Upper", "Obj": {"a": 1, "A": 2}}])
    write_api_catalog(harness, empty_api, destination="postgres")
    catalog = harness.catalog_path
    assert catalog is not None
    catalog.write_text(catalog.read_text().replace("type: postgres", "type: postgres\n  naming: direct"))
    harness.materialize()
    rows = harness.query_target(f'SELECT id, name, "Name", "Obj▶a", "Obj▶A" FROM "{harness.source_name}".orders')
    assert rows == [(1, "lower", "Upper", 1, 2)]


KEYS = [
    "a▶b",
    "a",
    "A",
    "a_b",
    "aB",
    "a__b",
    "b",
    "B",
    "名前",
    "住所",
    "x",
    "ü",
    "",
    " ",
    "__",
    "_dlt_x",
    "v1",
    "V_1",
    "_dlt_id",
]
DLT = {"_dlt_id", "_dlt_parent_id", "_dlt_list_idx", "_dlt_root_id", "_dlt_load_id"}


def _record(rng: random.Random, depth: int, markers: Iterator[int]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key in rng.sample(KEYS, rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.2 and depth < 3:
            record[key] = _record(rng, depth + 1, markers)
        elif kind < 0.3 and depth < 3:
            record[key] = [_record(rng, depth + 1, markers) for _ in range(rng.randint(1, 2))]
        elif kind < 0.35 and depth < 3:
            record[key] = [next(markers), [next(markers)]]
        else:
            record[key] = next(markers)
    return record


def _leaves(value: Any) -> set[int]:
    if isinstance(value, dict):
        return set().union(*(_leaves(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_leaves(v) for v in value)) if value else set()
    return {value} if isinstance(value, int) else set()


@pytest.mark.parametrize("convention", ["snake_case", "direct"])
@pytest.mark.parametrize("nesting", [0, 1, 2])
def test_collisions_are_the_values_dlt_loses(nesting: int, convention: str) -> None:
    """On random records of awkward names, each value a distinct number: the check finds a collision exactly when
    dlt's normalizer leaves a value out of its rows (or fills one child table from two lists)."""
    from dlt.common.normalizers.naming.direct import NamingConvention
    from dlt.common.schema import Schema
    from dlt.common.schema.utils import new_table

    schema = Schema("names")
    if convention == "direct":
        schema.naming = NamingConvention()
        schema.data_item_normalizer.naming = schema.naming  # type: ignore[attr-defined]
        schema.data_item_normalizer._reset()  # type: ignore[attr-defined]
    table = new_table("orders")
    table["x-normalizer"] = {"max_nesting": nesting}  # type: ignore[typeddict-unknown-key]
    schema.update_table(table)
    normalizer = schema.data_item_normalizer
    names = TargetNames(convention, None, case_sensitive=True)
    rng = random.Random(nesting)
    markers = itertools.count(1)
    found = 0
    for _ in range(600):
        record = _record(rng, 0, markers)
        rows = [row for _, row in normalizer.normalize_data_item(record, "1", "orders")]  # type: ignore[attr-defined]
        kept = _leaves([{k: v for k, v in row.items() if k not in DLT} for row in rows])
        problem = name_collision(record, names, nesting, "orders")
        if problem is not None and "child table" in problem:
            continue  # both lists' items reach dlt; their rows take one another's ids in the table
        lost = _leaves(record) - kept
        assert (problem is not None) == bool(lost), (record, problem, lost)
        found += problem is not None
    assert found > (50 if convention == "snake_case" else 5)


def test_direct_naming_on_a_destination_without_case() -> None:
    """DuckDB compares names without case whatever the naming: under `direct`, `Name` and `name` still meet (dlt
    failed the whole load on them); on PostgreSQL they are two columns."""
    record = {"id": 1, "Name": "Upper", "name": "lower", "obj": {"a": 1, "A": 2}}
    duckdb = name_collision(record, TargetNames("direct", None, case_sensitive=False), 1, "orders")
    assert duckdb is not None and "fields 'Name' and 'name' land as column 'name'" in duckdb
    assert "does not tell names apart by case" in duckdb and "naming: direct" not in duckdb
    assert name_collision(record, TargetNames("direct", 63, case_sensitive=True), 1, "orders") is None
    assert name_collision({"id": 1, "a": {"b": 1}, "a▶b": 2}, TargetNames("direct", 63), 1, "orders") is not None
