"""Incremental reads of the demo API: changes between syncs arrive, ties at page boundaries are kept, resumes lose nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.sources.rest import BucketRegistry, read_pages
from ingestion_assets.sources.rest.incremental import REREAD_FROM
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
    for page in target.pages:  # each page's position is its last record, exactly as the server wrote it
        if page.records:
            last = page.records[-1]
            exact = {k: v for k, v in page.position.items() if k != REREAD_FROM}
            assert exact == {"updated_at": last["updated_at"], "id": str(last["id"])}


@pytest.mark.parametrize("overlap_seconds", [0.0, 2.0])
def test_resume_from_a_mid_run_position(api: DemoApi, buckets: BucketRegistry, overlap_seconds: float) -> None:
    endpoint = replace(ORDERS, overlap_seconds=overlap_seconds)
    target = Target()
    with client(api, oauth(api), buckets) as rest:
        pages = read_pages(rest, endpoint, None)
        target.load(next(pages) for _ in range(6))  # six pages committed, then the run dies
        pages.close()
        committed = target.position
        assert committed == {"updated_at": "2024-01-01T00:00:08.123456Z", "id": "60"}
        api.mutate("orders", inserts=3, updates=10)  # the world moves on before the retry
        read = target.sync(rest, endpoint)  # the retry starts from the last checkpoint
    assert_equal_to_server(target, api)
    earliest = min(r["updated_at"] for r in read)
    if overlap_seconds:
        assert earliest == "2024-01-01T00:00:06.123456Z"  # two seconds before the position
    else:
        assert earliest == committed["updated_at"]  # the boundary timestamp is re-read, not skipped
    positions = [str(p.position["updated_at"]) for p in target.pages]
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
