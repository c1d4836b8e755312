"""An API body's `NaN`, `Infinity` and `-Infinity` (JSON has no such tokens, but Python's and JavaScript's
serializers write them) loaded as NULL without a word, at the top of a record and inside its objects and lists:
dlt writes the records it extracts as JSON, where they become null. Such a record is parked naming the fields;
the rest load."""

from __future__ import annotations

import json

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_nan_and_infinities_park_the_record_naming_the_fields(
    harness: StreamHarness, empty_api: DemoApi, destination: str
) -> None:
    empty_api.put(
        "orders",
        [
            {"id": 1, "ratio": NAN, "score": 1.5},
            {"id": 2, "ratio": INF, "score": -INF},
            {"id": 3, "ratio": 2.5, "score": 3.5, "obj": {"x": 1.25}, "items": [{"p": 0.5}]},
            {"id": 4, "ratio": 0.5, "obj": {"x": NAN}},
            {"id": 5, "ratio": 0.5, "items": [{"p": 1.0}, {"p": -INF}]},
        ],
    )
    write_api_catalog(harness, empty_api, destination=destination)
    harness.materialize()
    schema = harness.source_name
    rows = harness.query_target(f'SELECT id, ratio, score, obj__x FROM "{schema}".orders ORDER BY id')
    assert [tuple(str(v) for v in row) for row in rows] == [("3", "2.5", "3.5", "1.25")]  # numbers exact
    assert [str(p) for (p,) in harness.query_target(f'SELECT p FROM "{schema}".orders__items')] == ["0.5"]
    parked = harness.query_target(f'SELECT record_key, error, raw_record FROM "{schema}"._ingest_dead_letter')
    found = {key: (error, raw if isinstance(raw, dict) else json.loads(raw)) for key, error, raw in parked}
    assert sorted(found) == ["1", "2", "4", "5"]
    assert "field(s) ['ratio'] hold NaN or Infinity" in found["1"][0]
    assert "field(s) ['ratio', 'score'] hold NaN or Infinity" in found["2"][0]
    assert "['obj.x']" in found["4"][0] and "['items[1].p']" in found["5"][0]
    assert found["1"][1]["ratio"] == "NaN" and found["1"][1]["score"] == 1.5
    assert found["2"][1]["ratio"] == "Infinity" and found["2"][1]["score"] == "-Infinity"
    assert found["5"][1]["items"] == [{"p": 1.0}, {"p": "-Infinity"}]
