"""Deletes for API streams through the asset, against the demo API on loopback: deletion markers (hard, and
soft keeping the last values) and vanished records retired by the key listing while a writer changes the
data; every check compares the target with the server's own records, record by record."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from ingestion_assets.demo.api_server import DemoApi, start_demo_api
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.helpers import write_api_catalog

MARKER = {"field": "deleted", "values": [True]}
MAX_VANISHED = 40  # records the key-listing writer deletes in all: under half of what the target holds


@pytest.fixture
def api() -> Iterator[DemoApi]:
    server = start_demo_api(orders=150, customers=10, tie_group=9)
    try:
        yield server
    finally:
        server.stop()


def _server(api: DemoApi) -> dict[int, tuple[Any, ...]]:
    """The live records as the server has them: id -> (updated_at, status, number, item count)."""
    return {
        r["id"]: (r["updated_at"], r["status"], r["number"], len(r["items"]))
        for r in api.records("orders")
        if not r.get("deleted")
    }


def _target(harness: StreamHarness, deleted: bool = False) -> dict[int, tuple[Any, ...]]:
    """Target rows (live, or soft-deleted ones) in the same shape, child rows counted per parent."""
    rows = harness.query_target(
        f'SELECT o.id, o.updated_at, o.status, o.number, (SELECT count(*) FROM "{harness.source_name}".orders__items i '
        f'WHERE i._dlt_parent_id = o._dlt_id) FROM "{harness.source_name}".orders o '
        f"WHERE o._ingest_deleted_at IS {'NOT ' if deleted else ''}NULL"
    )
    found = {
        int(r[0]): (r[1].astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if r[1] else None, *r[2:]) for r in rows
    }
    assert len(found) == len(rows), "duplicate primary keys in the target"
    return found


def _orphans(harness: StreamHarness) -> int:
    schema = harness.source_name
    return int(
        harness.query_target(
            f'SELECT count(*) FROM "{schema}".orders__items i WHERE NOT EXISTS '
            f'(SELECT 1 FROM "{schema}".orders o WHERE o._dlt_id = i._dlt_root_id)'
        )[0][0]
    )


def _listing(result: dg.ExecuteInProcessResult, harness: StreamHarness) -> dict[str, Any] | None:
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__orders")[0].metadata
    return metadata["key listing"].value if "key listing" in metadata else None  # type: ignore[return-value]


@pytest.mark.parametrize("destination", ["duckdb", pytest.param("postgres", marks=pytest.mark.slow)])
def test_a_deletion_marker_deletes_hard(harness: StreamHarness, api: DemoApi, destination: str) -> None:
    write_api_catalog(harness, api, destination, deletes={"mode": "hard", "marker": MARKER})
    harness.materialize()
    gone = api.delete("orders", 17, mark=True)
    api.mutate("orders", inserts=5, updates=10)
    harness.materialize()
    target, server = _target(harness), _server(api)
    still_gone = set(gone) - set(server)  # an update may have brought one back: it is live again
    assert target == server and still_gone and not still_gone & set(target)
    assert _target(harness, deleted=True) == {} and _orphans(harness) == 0  # child rows went with their parent


def test_a_deletion_marker_deletes_soft_keeping_the_last_values(harness: StreamHarness, api: DemoApi) -> None:
    write_api_catalog(harness, api, deletes={"mode": "soft", "marker": MARKER})
    harness.materialize()
    before = _server(api)
    gone = api.delete("orders", 17, mark=True)  # tombstones carry only id, deleted, updated_at
    api.mutate("orders", inserts=5)
    born_and_gone = api.delete("orders", 200, mark=True)  # also records the target never saw live
    harness.materialize()
    assert _target(harness) == _server(api) == {}
    soft = _target(harness, deleted=True)
    assert set(soft) == set(gone) | set(born_and_gone)
    for key in gone:  # the last values, not the tombstone's nulls
        assert soft[key][1:] == before[key][1:]


@pytest.mark.parametrize(
    ("mode", "destination"),
    [
        ("hard", "duckdb"),
        pytest.param("soft", "duckdb", marks=pytest.mark.slow),
        pytest.param("soft", "postgres", marks=pytest.mark.slow),
    ],
)
def test_the_key_listing_retires_vanished_records_while_a_writer_changes_data(
    harness: StreamHarness, api: DemoApi, mode: str, destination: str
) -> None:
    listing = {"path": "/v1/orders/ids", "page_size": 40, "every_hours": 0}
    write_api_catalog(harness, api, destination, deletes={"mode": mode, "key_listing": listing})
    harness.materialize()
    stop = threading.Event()
    vanished: list[int] = []

    def writer() -> None:
        # Deletions are capped below the listing's max_retire_share (0.5 of ~150 live keys): paced by time only,
        # a run slowed by the machine's load saw more than half the keys it had read vanish before its listing,
        # and the listing rightly refused to retire them (the guard against a listing that finds too few keys).
        while not stop.wait(0.05):
            api.mutate("orders", inserts=1, updates=2)
            if len(vanished) < MAX_VANISHED:
                vanished.extend(api.delete("orders", 1, mark=False))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        during = harness.materialize()
    finally:
        stop.set()
        thread.join()
    figures = _listing(during, harness)
    assert figures is not None and figures["refused"] is None and figures["deletions_applied"] > 0
    final = harness.materialize()  # the writer stopped: the read and the listing see one state
    assert _target(harness) == _server(api)
    soft = set(_target(harness, deleted=True))  # what vanished and the target had held: kept, flagged
    assert (soft and soft <= set(vanished) and not soft & set(_server(api))) if mode == "soft" else soft == set()
    figures = _listing(final, harness)
    # what the writer deleted after the listing of the run beside it is retired now; nothing new is missed
    assert figures is not None and figures["missing"] == 0 and figures["deletions_applied"] == figures["target_only"]
    check = final.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in check if c.check_name == "reconciliation"] == [("reconciliation", True)]


def test_a_listing_that_would_empty_the_target_is_refused_and_fails_the_check(
    harness: StreamHarness, api: DemoApi
) -> None:
    listing = {"params": {"updated_since": "2999-01-01T00:00:00Z"}, "every_hours": 24}  # a listing finding nothing
    write_api_catalog(harness, api, deletes={"mode": "hard", "key_listing": listing})
    first = harness.materialize()
    figures = _listing(first, harness)
    assert figures is not None and figures["deletions_applied"] == 0 and "max_retire_share" in figures["refused"]
    assert _target(harness) == _server(api)
    check = [c for c in first.get_asset_check_evaluations() if c.check_name == "reconciliation"]
    assert [c.passed for c in check] == [False]
    assert _listing(harness.materialize(), harness) is None  # every 24 hours: not due again yet


@pytest.mark.parametrize("style", ["page", pytest.param("offset", marks=pytest.mark.slow)])
def test_a_key_listing_against_an_api_capping_its_pages_retires_no_live_key(
    harness: StreamHarness, style: str
) -> None:
    # the listing asks for 1000 keys a page, the API serves 100: the short first page is not the end (before, the
    # listing took it for the end and hard-deleted the 50 live records past it, 33 % < max_retire_share)
    api = start_demo_api(orders=150, customers=10, tie_group=9, page_cap=100)
    try:
        listing = {"page_size": 1000, "every_hours": 0}
        pagination = {"style": style, "size_param": "per_page" if style == "page" else "limit"}
        write_api_catalog(
            harness, api, page_size=100, pagination=pagination, deletes={"mode": "hard", "key_listing": listing}
        )
        figures = _listing(harness.materialize(), harness)  # the read, then the listing
        assert figures is not None and figures["refused"] is None
        assert (figures["listed"], figures["target_only"], figures["deletions_applied"]) == (150, 0, 0)
        assert _target(harness) == _server(api) and len(_server(api)) == 150
    finally:
        api.stop()


def test_a_key_listing_that_may_have_ended_early_retires_nothing(harness: StreamHarness, api: DemoApi) -> None:
    # token_path names no key of the body: the read ends after its first (full) page, and so does the listing;
    # its 60 keys of the 100 read would retire 40 (under max_retire_share). An end in doubt is no basis for deletes
    listing = {"page_size": 60, "every_hours": 0}
    write_api_catalog(
        harness,
        api,
        page_size=100,
        pagination={"style": "cursor", "token_path": "paging.next"},
        deletes={"mode": "hard", "key_listing": listing},
    )
    result = harness.materialize()
    figures = _listing(result, harness)
    assert figures is not None and (figures["listed"], figures["target_only"]) == (60, 40)
    assert figures["deletions_applied"] == 0 and "'paging.next' is not in the body" in figures["refused"]
    assert len(_target(harness)) == 100
    check = [c for c in result.get_asset_check_evaluations() if c.check_name == "reconciliation"]
    assert [c.passed for c in check] == [False]
