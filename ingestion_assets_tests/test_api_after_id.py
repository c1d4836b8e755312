"""Stripe-style lists (`starting_after=<last id>` while `has_more`, newest first) as pagination style `after_id`,
against a Stripe-like API on loopback: every record lands, row by row as the server has them; a read stopped part
way claims nothing past its start (newest first); the catalog refuses an after_id stream it cannot page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from ingestion_assets.catalog import CatalogError, load_catalog
from ingestion_assets.sources.rest import (
    BadPayload,
    BucketRegistry,
    EndpointSpec,
    PaginationSpec,
    RestClient,
    read_pages,
)
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import ScriptedApi, write_scripted_catalog

Start = Callable[..., ScriptedApi]
CHARGES = EndpointSpec(
    "/v1/charges",
    primary_key=("id",),
    cursor_field="created",
    cursor_param="created[gte]",
    pagination=PaginationSpec(style="after_id", stream="stripe.charges"),
    page_size=5,
)


def _charges(first: int, count: int) -> list[dict[str, Any]]:
    # ties of three on `created`, as a busy account has: the list breaks them by id
    return [{"id": f"ch_{n:04d}", "created": 1_700_000_000 + n // 3, "amount": n * 100} for n in range(first, count)]


def _catalog(harness: StreamHarness, api: ScriptedApi, **pagination: Any) -> None:
    stream = {
        "path": "/v1/charges",
        "primary_key": "id",
        "cursor": "created",
        "cursor_param": "created[gte]",
        "pagination": {"style": "after_id", **pagination},
        "page_size": 5,
        "pages_per_slice": 2,
        "retries": {"max_attempts": 1},
    }
    write_scripted_catalog(harness, api, "charges", stream)


def _target(harness: StreamHarness) -> list[tuple[Any, ...]]:
    rows = harness.query_target(f'SELECT id, created, amount FROM "{harness.source_name}".charges ORDER BY id')
    return [(r[0], int(r[1]), int(r[2])) for r in rows]


def _server(api: ScriptedApi) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["created"], r["amount"]) for r in api.charges)


def test_a_stripe_list_lands_whole_and_its_changes_next_run(harness: StreamHarness, scripted_api: Start) -> None:
    api = scripted_api(charges=_charges(0, 23))
    _catalog(harness, api)
    assert harness.materialize().success
    assert _target(harness) == _server(api)
    firsts = [r for r in api.requests if "starting_after" not in r]
    assert len(firsts) == 1 and len(api.requests) == 5  # 23 records, 5 a page; has_more false on the 5th
    api.charges += _charges(23, 30)
    api.charges[-1]["amount"] = 7
    api.requests.clear()
    harness.materialize()
    assert _target(harness) == _server(api)
    assert "created%5Bgte%5D=1700000007" in api.requests[0]  # from the greatest (created, id) read


def test_a_stopped_newest_first_read_claims_only_its_start(scripted_api: Start) -> None:
    api = scripted_api(charges=_charges(0, 23))
    start = {"created": "1700000001", "id": "ch_0003"}
    with RestClient(api.url, rate=500.0, burst=50, buckets=BucketRegistry()) as rest:
        pages = list(read_pages(rest, CHARGES, start))
    assert [p.position for p in pages[:-1]] == [start] * (len(pages) - 1)  # newest first: nothing proven yet
    assert pages[-1].position == {"created": "1700000007", "id": "ch_0022"}
    assert sorted(r["id"] for p in pages for r in p.records) == [f"ch_{n:04d}" for n in range(3, 23)]


def test_a_list_that_does_not_say_has_more_fails_naming_its_keys(scripted_api: Start) -> None:
    api = scripted_api(charges=_charges(0, 12))
    spec = EndpointSpec(**{**CHARGES.__dict__, "pagination": PaginationSpec(style="after_id", has_more_path="more")})
    with RestClient(api.url, rate=500.0, burst=50, buckets=BucketRegistry()) as rest, pytest.raises(BadPayload) as e:
        list(read_pages(rest, spec, None))
    assert "has_more_path 'more' is not in the body" in str(e.value) and "'has_more'" in str(e.value)


def test_the_catalog_asks_an_after_id_stream_with_a_composite_key_for_its_id_field(tmp_path: Any) -> None:
    stream = {"path": "/v1/x", "primary_key": ["account", "id"], "pagination": {"style": "after_id"}}
    catalog = {
        "destination": {"type": "duckdb", "path": str(tmp_path / "w.duckdb")},
        "sources": {"s": {"type": "rest", "base_url": "http://127.0.0.1:9", "streams": {"x": stream}}},
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    with pytest.raises(CatalogError, match=r"set pagination\.id_field"):
        load_catalog(path)
    stream["pagination"] = {"style": "after_id", "id_field": "id"}
    path.write_text(yaml.safe_dump(catalog))
    load_catalog(path)
