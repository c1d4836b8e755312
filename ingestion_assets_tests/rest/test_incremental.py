"""Incremental reads of the demo API: changes between syncs arrive, ties at page boundaries are kept, resumes lose nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import BucketRegistry, read_pages
from ingestion_assets.sources.rest.incremental import REREAD_FROM, EndpointSpec, ServedOrder
from ingestion_assets_tests.rest.conftest import StartApi
from ingestion_assets_tests.rest.helpers import ORDERS, Target, assert_equal_to_server, client, oauth


def test_syncs_with_changes_in_between_end_equal_to_the_server(api: DemoApi, buckets: BucketRegistry) -> None:
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        assert len(target.sync(rest, ORDERS)) == 137
        assert target.position == {"updated_at": "2024-01-01T00:00:19.123456Z", "id": "137"}
        assert_equal_to_server(target, api)
        for round_ in range(3):
            stamp = api.mutate("orders", inserts=4, updates=15)
            before = target.position
            read = target.sync(rest, ORDERS)
            assert_equal_to_server(target, api)
            position = dict(target.position or {})
            reread_from = position.pop(REREAD_FROM, None)  # set when the read began within the changes' second
            assert position == {"updated_at": stamp, "id": str(137 + 4 * (round_ + 1))}
            assert reread_from is None or reread_from <= stamp
            # only the changes and what changed since the previous read began (its boundary ties included)
            assert before is not None
            assert min(r["updated_at"] for r in read) >= (before.get(REREAD_FROM) or before["updated_at"])
            assert {r["id"] for r in read if r["updated_at"] == stamp} == {
                r["id"] for r in api.records("orders") if r["updated_at"] == stamp
            }
        resume = target.position or {}
        # nothing changed: the read finds only what it must re-check, from where the last read began
        assert target.sync(rest, ORDERS) == api.records("orders", since=resume.get(REREAD_FROM) or stamp)


def test_ties_across_page_boundaries_are_all_read(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(tie_group=13)  # 13 records per timestamp, pages of 5: every tie spans pages
    endpoint = replace(ORDERS, page_size=5)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        target.sync(rest, endpoint)
        stamp = api.mutate("orders", updates=23)  # 23 records now share one timestamp: 5 pages of ties
        read = target.sync(rest, endpoint)
    assert_equal_to_server(target, api)
    assert sorted(r["id"] for r in read if r["updated_at"] == stamp) == sorted(
        r["id"] for r in api.records("orders") if r["updated_at"] == stamp
    )
    seen: list[dict[str, Any]] = []
    start: dict[str, Any] = {}
    for number, page in enumerate(target.pages):
        if page.index == 0:
            seen, start = [], ({} if number == 0 else target.pages[number - 1].position)
        seen += page.records
        exact = {k: v for k, v in page.position.items() if k != REREAD_FROM}
        over = number + 1 == len(target.pages) or target.pages[number + 1].index == 0
        if over:  # the read is over: its last (greatest) record, as the server wrote it
            assert exact == {"updated_at": seen[-1]["updated_at"], "id": str(seen[-1]["id"])}
        elif page.index and page.position != start:  # mid-read: never inside the tie group the page ends in
            group = page.records[-1]["updated_at"]
            finished = [r for r in seen if r["updated_at"] < group][-1]  # the last record of the group before it
            assert exact == {"updated_at": finished["updated_at"], "id": str(finished["id"])}
    assert len({str(p.position) for p in target.pages}) > 3  # the positions did advance mid-read


@pytest.mark.parametrize("overlap_seconds", [0.0, 2.0])
def test_resume_from_a_mid_run_position(api: DemoApi, buckets: BucketRegistry, overlap_seconds: float) -> None:
    endpoint = replace(ORDERS, overlap_seconds=overlap_seconds)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        pages = read_pages(rest, endpoint, None)
        target.load(next(pages) for _ in range(6))  # six pages committed, then the run dies
        pages.close()
        committed = target.position
        # 60 records read in order; 57 to 63 share one timestamp: the position is the last of the group before
        assert committed == {"updated_at": "2024-01-01T00:00:07.123456Z", "id": "56"}
        api.mutate("orders", inserts=3, updates=10)  # the world moves on before the retry
        read = target.sync(rest, endpoint)  # the retry starts from the last checkpoint
    assert_equal_to_server(target, api)
    earliest = min(r["updated_at"] for r in read)
    if overlap_seconds:
        assert earliest == "2024-01-01T00:00:05.123456Z"  # two seconds before the position
    else:
        assert earliest == committed["updated_at"]  # the boundary timestamp is re-read, not skipped
    positions = [str(p.position.get("updated_at", "")) for p in target.pages]  # the first page claims none
    assert positions == sorted(positions)  # an overlap never moves the checkpoint backwards


def test_records_changed_during_a_read_are_not_lost(api: DemoApi, buckets: BucketRegistry) -> None:
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        for page in read_pages(rest, ORDERS, None):
            target.load([page])
            if page.index in (2, 9):
                api.mutate("orders", inserts=2, updates=7)  # rows already read move behind the cursor
        assert_equal_to_server(target, api)
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)


def _exact(position: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (position or {}).items() if k != REREAD_FROM}


def test_a_newest_first_api_stopped_mid_read_loses_nothing(start_api: StartApi, buckets: BucketRegistry) -> None:
    api = start_api(newest_first=True)  # Stripe's and GitHub's default order: the oldest records come last
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        pages = read_pages(rest, ORDERS, None)
        target.load(next(pages) for _ in range(5))  # the 50 newest of 137 committed, then the run dies
        pages.close()
        assert target.position == {}  # nothing claimed: every unread record is older than the ones read
        api.mutate("orders", inserts=3, updates=10)
        target.sync(rest, ORDERS)  # the retry reads everything again
        assert_equal_to_server(target, api)
        newest = api.records("orders")[-1]  # a finished read claims its greatest record, not its last (oldest)
        assert _exact(target.position) == {"updated_at": newest["updated_at"], "id": str(newest["id"])}
        before = target.position
        api.mutate("orders", inserts=30, updates=40)  # 70 changes: 7 pages newer than the position
        pages = read_pages(rest, ORDERS, target.position)
        target.load(next(pages) for _ in range(3))
        pages.close()
        assert target.position == before  # the stopped read claimed nothing
        target.sync(rest, ORDERS)
    assert_equal_to_server(target, api)


def test_an_exclusive_filter_stopped_inside_a_tie_group_loses_nothing(
    start_api: StartApi, buckets: BucketRegistry
) -> None:
    api = start_api(exclusive_since=True, tie_group=13)  # updated_since filters `>`; 13 records per timestamp
    endpoint = replace(ORDERS, page_size=5)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        pages = read_pages(rest, endpoint, None)
        target.load(next(pages) for _ in range(4))  # ids 1..20 committed: the group of ids 14..26 cut in two
        pages.close()
        assert _exact(target.position) == {"updated_at": "2024-01-01T00:00:00.123456Z", "id": "13"}
        target.sync(rest, endpoint)  # asks for updated_at > the first group's: the whole second group comes
    assert_equal_to_server(target, api)


def test_a_mid_read_claim_needs_ascending_order_over_two_pages() -> None:
    endpoint = EndpointSpec("/v1/things", cursor_field="version", cursor_param="since")
    order = ServedOrder(endpoint, {})
    order.see([{"id": 1, "version": 9}, {"id": 2, "version": "10"}])  # numbers compare as numbers, text or not
    assert order.claim(complete=False) is None  # one page proves no order
    order.see([{"id": 3, "version": 10}, {"id": 4, "version": 11}, {"id": 5}])  # a record without a cursor is no claim
    assert order.claim(complete=False) == {"id": 3, "version": 10}  # the last of the finished group (10)
    order.see([{"id": 6, "version": 7}])  # out of order: nothing more may be claimed before the end
    assert order.claim(complete=False) is None
    assert order.claim(complete=True) == {"id": 4, "version": 11}  # a finished read: the greatest record
