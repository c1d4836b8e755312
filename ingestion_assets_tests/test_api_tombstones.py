"""Tombstones and repeated keys in an API change feed, through the asset, against a scripted API on loopback whose
pages the test lays out: a tombstone carrying only its key (no cursor, as many SaaS delete events) deletes; it is
placed by when it was read, so it never deletes a live version read after it (same slice, a later slice, a later
run), and one for a key never seen harms nothing; one key twice in a slice ends as its greatest cursor, and on
equal cursors as the copy served last. Every check compares the target with the expected rows, row by row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import ScriptedApi, write_scripted_catalog

Start = Callable[..., ScriptedApi]


def _catalog(harness: StreamHarness, api: ScriptedApi, pages_per_slice: int, mode: str | None) -> None:
    stream: dict[str, Any] = {
        "path": "/feed",
        "primary_key": "id",
        "cursor": "seq",
        "cursor_param": "since",
        "page_size": 3,
        "pages_per_slice": pages_per_slice,
        "retries": {"max_attempts": 1},
    }
    if mode is not None:
        stream["deletes"] = {"mode": mode, "marker": {"field": "deleted", "values": [True]}}
    write_scripted_catalog(harness, api, "feed", stream)


def _rows(harness: StreamHarness, deleted: bool = False) -> dict[int, str | None]:
    """id -> value of the live (or soft-deleted) target rows; a duplicate key fails."""
    rows = harness.query_target(
        f'SELECT id, v FROM "{harness.source_name}".feed WHERE _ingest_deleted_at IS {"NOT " if deleted else ""}NULL'
    )
    found = {int(r[0]): r[1] for r in rows}
    assert len(found) == len(rows), "duplicate primary keys in the target"
    return found


def _parked(harness: StreamHarness) -> list[str]:
    return [
        r[0] for r in harness.query_target_if_exists(f'SELECT error FROM "{harness.source_name}"._ingest_dead_letter')
    ]


def _live(key: int, seq: int, value: str) -> dict[str, Any]:
    return {"id": key, "seq": seq, "v": value}


def _gone(key: int) -> dict[str, Any]:
    return {"id": key, "deleted": True}  # the key and the flag only: no cursor, no values


@pytest.mark.parametrize("pages_per_slice", [1, 10])
def test_a_tombstone_with_only_its_key_deletes_and_never_a_version_read_after_it(
    harness: StreamHarness, scripted_api: Start, pages_per_slice: int
) -> None:
    api = scripted_api(
        feed=[
            [_live(1, 1, "a"), _live(2, 2, "b"), _live(3, 3, "c")],
            [_gone(2), _gone(99), _live(4, 4, "d")],  # 99: never seen
            [_gone(5), _live(5, 5, "e")],  # deleted, then created again: read after, it stays
        ]
    )
    _catalog(harness, api, pages_per_slice, "hard")
    assert harness.materialize().success
    assert _rows(harness) == {1: "a", 3: "c", 4: "d", 5: "e"} and _parked(harness) == []
    api.feed = [[_gone(3), _live(6, 6, "f")]]
    harness.materialize()
    api.feed = [[_live(3, 7, "c again"), _gone(1)]]  # a later run: the live version read after the tombstone
    harness.materialize()
    assert _rows(harness) == {3: "c again", 4: "d", 5: "e", 6: "f"} and _parked(harness) == []


def test_a_soft_tombstone_with_only_its_key_keeps_the_last_values(harness: StreamHarness, scripted_api: Start) -> None:
    api = scripted_api(feed=[[_live(1, 1, "a"), _live(2, 2, "b")], [_gone(2), _gone(99)]])
    _catalog(harness, api, 1, "soft")
    harness.materialize()
    assert _rows(harness) == {1: "a"} and _parked(harness) == []
    assert _rows(harness, deleted=True) == {2: "b", 99: None}  # 99 lands as what it is: a key, deleted


@pytest.mark.parametrize("mode", [None, "hard"])
def test_one_key_twice_in_a_slice_ends_as_its_greatest_cursor_then_the_copy_served_last(
    harness: StreamHarness, scripted_api: Start, mode: str | None
) -> None:
    page = [_live(7, 9, "first"), _live(8, 10, "newer"), _live(7, 9, "second"), _live(8, 9, "older")]
    if mode is not None:
        page.append({**_gone(8), "seq": 8})  # a tombstone older than the live version before it: no delete
    api = scripted_api(feed=[page])
    _catalog(harness, api, 1, mode)
    harness.materialize()
    assert _rows(harness) == {7: "second", 8: "newer"} and _parked(harness) == []


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_a_dated_tombstone_older_than_the_row_in_the_target_deletes_nothing(
    harness: StreamHarness, scripted_api: Start, mode: str
) -> None:
    # a list not in cursor order (newest first): the newer live version in one slice, its older tombstone in the next
    api = scripted_api(
        feed=[[_live(8, 10, "newer"), _live(9, 3, "x")], [{**_gone(8), "seq": 9}, {**_gone(9), "seq": 3}]]
    )
    _catalog(harness, api, 1, mode)
    harness.materialize()
    assert _rows(harness) == {8: "newer"} and _parked(harness) == []  # 9: its tombstone as new as the row: applied
    api.feed = [[{**_gone(8), "seq": 9}]]  # served again by a later run
    harness.materialize()
    assert _rows(harness) == {8: "newer"}
    api.feed = [[{**_gone(8), "seq": 11}]]  # a newer one applies
    harness.materialize()
    assert _rows(harness) == {}
    assert set(_rows(harness, deleted=True)) == (set() if mode == "hard" else {8, 9})


def test_a_deletion_settles_its_key_parked_before(harness: StreamHarness, scripted_api: Start) -> None:
    api = scripted_api(feed=[[_live(1, 1, "a"), {**_live(2, 2, "b"), "score": float("nan")}]])  # 2: parked (NaN)
    _catalog(harness, api, 1, "hard")
    harness.materialize()
    assert _rows(harness) == {1: "a"} and len(_parked(harness)) == 1
    api.feed = [[_gone(2)]]
    harness.materialize()
    assert _rows(harness) == {1: "a"} and _parked(harness) == []
