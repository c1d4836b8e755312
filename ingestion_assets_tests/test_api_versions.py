"""The version guard of API streams, through the asset, against a scripted API on loopback whose pages the test lays
out: a live record older (by its cursor) than the version the target holds for its key, served in a later slice or
run (an API listing one key's versions newest first), does not overwrite it; on an equal cursor the later load wins.
A soft-deleted row holds its tombstone's cursor, so an older live copy does not bring it back, while a key re-created
after a deletion (also after a tombstone carrying only its key, whose read time is no server cursor) loads. Cursors
are integers, decimals, ISO timestamps with offsets and text; every check compares the target row by row, on DuckDB
and on the PostgreSQL destination."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ingestion_assets.state.summary import request_refresh
from ingestion_assets_tests.destination_targets import MariaDb, lake_rows, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import ScriptedApi, write_scripted_catalog

Start = Callable[..., ScriptedApi]
DESTINATIONS = ["duckdb", pytest.param("postgres", marks=pytest.mark.slow)]

# Per cursor kind: three versions of a key, oldest to newest, each as the API writes it. The timestamps hold
# offsets: as text the oldest (10:00+02:00, 08:00 UTC) sorts above the middle one (09:30Z); the decimals compare
# by value (9.5 below 10), not as text.
CURSORS: dict[str, tuple[Any, Any, Any]] = {
    "integer": (7, 9, 12),
    "decimal": (2.25, 9.5, 10),
    "timestamp": ("2026-03-01T10:00:00+02:00", "2026-03-01T09:30:00Z", "2026-03-01T09:45:00.5+00:00"),
    "text": ("b-0001", "b-0002", "c-0000"),
}


@pytest.fixture(params=DESTINATIONS)
def target(request: pytest.FixtureRequest, harness: StreamHarness) -> Iterator[str]:
    """The destination the stream loads into (PostgreSQL: the embedded source database, schema = source name)."""
    yield str(request.param)
    if request.param == "postgres":
        harness.source.execute(f'DROP SCHEMA IF EXISTS "{harness.source_name}" CASCADE')
        harness.source.execute(f'DROP SCHEMA IF EXISTS "{harness.source_name}_staging" CASCADE')


def _catalog(
    harness: StreamHarness, api: ScriptedApi, target: str, mode: str | None = None, cursor: str | None = "seq"
) -> None:
    stream: dict[str, Any] = {
        "path": "/feed",
        "primary_key": "id",
        **({"cursor": cursor, "cursor_param": "since"} if cursor else {"cursor": None}),
        "page_size": 3,
        "pages_per_slice": 1,
        "retries": {"max_attempts": 1},
    }
    if mode is not None:
        stream["deletes"] = {"mode": mode, "marker": {"field": "deleted", "values": [True]}}
    write_scripted_catalog(harness, api, "feed", stream)
    if target == "postgres":
        url_file = harness.tmp_path / "target_url"
        url_file.write_text(harness.source.url)
        use_destination(harness, {"type": "postgres", "credentials": {"file": str(url_file)}})
        harness.destination = "postgres"


def _rows(harness: StreamHarness, deleted: bool = False) -> dict[int, str | None]:
    """id -> value of the live (or soft-deleted) target rows; a duplicate key fails."""
    rows = harness.query_target(
        f'SELECT id, v FROM "{harness.source_name}".feed WHERE _ingest_deleted_at IS {"NOT " if deleted else ""}NULL'
    )
    found = {int(r[0]): r[1] for r in rows}
    assert len(found) == len(rows), "duplicate primary keys in the target"
    return found


def _live(key: int, seq: Any, value: str) -> dict[str, Any]:
    return {"id": key, "seq": seq, "v": value}


def _gone(key: int, seq: Any = None) -> dict[str, Any]:
    return {"id": key, "deleted": True, **({} if seq is None else {"seq": seq})}


@pytest.mark.parametrize("kind", sorted(CURSORS))
def test_an_older_version_served_later_does_not_overwrite_a_newer_one(
    harness: StreamHarness, scripted_api: Start, target: str, kind: str
) -> None:
    old, middle, new = CURSORS[kind]
    # newest first: each key's newer version in the first slice, its older one in the next (one page a slice)
    api = scripted_api(
        feed=[
            [_live(1, middle, "1 middle"), _live(2, old, "2 old")],
            [_live(1, old, "1 old"), _live(2, middle, "2 middle"), _live(3, old, "3 old")],
        ]
    )
    _catalog(harness, api, target)
    assert harness.materialize().success
    assert _rows(harness) == {1: "1 middle", 2: "2 middle", 3: "3 old"}
    api.feed = [[_live(1, old, "1 old again"), _live(3, new, "3 new")]]  # a later run: older for 1, newer for 3
    assert harness.materialize().success
    assert _rows(harness) == {1: "1 middle", 2: "2 middle", 3: "3 new"}
    api.feed = [[_live(1, middle, "1 middle, changed"), _live(3, new, "3 new, changed")]]  # equal: the later load
    assert harness.materialize().success
    assert _rows(harness) == {1: "1 middle, changed", 2: "2 middle", 3: "3 new, changed"}


def test_a_soft_deleted_row_holds_its_tombstones_cursor(
    harness: StreamHarness, scripted_api: Start, target: str
) -> None:
    api = scripted_api(feed=[[_live(8, 3, "three"), _live(9, 3, "nine")]])
    _catalog(harness, api, target, "soft")
    harness.materialize()
    # newest first: the tombstone (cursor 9) in one slice, an older live copy (5) in the next, and again a run later
    api.feed = [[_gone(8, 9)], [_live(8, 5, "five")]]
    harness.materialize()
    assert _rows(harness) == {9: "nine"} and _rows(harness, deleted=True) == {8: "three"}
    api.feed = [[_live(8, 7, "seven")]]
    harness.materialize()
    assert _rows(harness) == {9: "nine"} and _rows(harness, deleted=True) == {8: "three"}
    api.feed = [[_live(8, 12, "re-created")]]  # newer than the deletion: its key's re-creation loads
    harness.materialize()
    assert _rows(harness) == {8: "re-created", 9: "nine"} and _rows(harness, deleted=True) == {}


@pytest.mark.parametrize("seq", [1, "2001-01-01T00:00:00Z"], ids=["integer", "timestamp"])
@pytest.mark.parametrize("landed", ["now", "before"])
def test_a_key_re_created_after_a_tombstone_with_only_its_key_loads(
    harness: StreamHarness, scripted_api: Start, target: str, seq: Any, landed: str
) -> None:
    """A tombstone without a cursor is placed by its read time (our clock); the API's cursors (an integer, or a
    server clock far behind ours) cannot be ordered against it: the re-created record loads. `before`: the row as
    earlier versions landed it, its read time as its version."""
    api = scripted_api(feed=[[_gone(5), _live(6, seq, "six")]])  # 5: first seen as a tombstone
    _catalog(harness, api, target, "soft")
    harness.materialize()
    assert _rows(harness) == {6: "six"} and _rows(harness, deleted=True) == {5: None}
    if landed == "before":
        table = f'"{harness.source_name}".feed'
        ((extracted,),) = harness.query_target(f"SELECT _ingest_extracted_at FROM {table} WHERE id = 5")
        version = extracted.astimezone(dt.UTC).isoformat()
        harness.execute_target(f"UPDATE {table} SET _ingest_position = '{version}' WHERE id = 5")
    api.feed = [[_live(5, seq, "back")]]
    harness.materialize()
    assert _rows(harness) == {5: "back", 6: "six"} and _rows(harness, deleted=True) == {}


def test_a_refresh_replaces_newer_versions(harness: StreamHarness, scripted_api: Start, target: str) -> None:
    """`ingest refresh` reads everything into a new table: what the API serves now, whatever the cursors were."""
    api = scripted_api(feed=[[_live(1, 10, "ten"), _live(2, 10, "two")]])
    _catalog(harness, api, target)
    harness.materialize()
    api.feed = [[_live(1, 4, "restored at 4")]]  # the API's data restored from an older backup
    request_refresh(harness.settings, harness.source_name, "feed", "remove")
    assert harness.materialize().success
    assert _rows(harness) == {1: "restored at 4"}


def test_a_stream_without_a_cursor_loads_every_read(harness: StreamHarness, scripted_api: Start, target: str) -> None:
    api = scripted_api(feed=[[{"id": 1, "v": "a"}], [{"id": 1, "v": "b"}]])
    _catalog(harness, api, target, cursor=None)
    assert harness.materialize().success
    assert _rows(harness) == {1: "b"}
    api.feed = [[{"id": 1, "v": "c"}]]
    assert harness.materialize().success
    assert _rows(harness) == {1: "c"}


@pytest.mark.slow
@pytest.mark.parametrize("destination", ["mariadb", "delta", "iceberg"])
def test_the_guard_holds_on_mariadb_and_lakes(
    harness: StreamHarness, scripted_api: Start, tmp_path: Path, request: pytest.FixtureRequest, destination: str
) -> None:
    old, middle, new = CURSORS["timestamp"]
    api = scripted_api(feed=[[_live(1, middle, "1 middle")], [_live(1, old, "1 old"), _live(2, old, "2 old")]])
    _catalog(harness, api, "duckdb")
    lake = tmp_path / "lake"
    if destination == "mariadb":
        server: MariaDb = request.getfixturevalue(mariadb.__name__)
        server.datasets.append(harness.source_name)
        use_destination(harness, server.destination())

        def rows() -> dict[int, str]:
            found = server.query(f"SELECT id, v FROM `{harness.source_name}`.`feed` WHERE _ingest_deleted_at IS NULL")
            return {int(i): str(v) for i, v in found}
    else:
        use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": destination})

        def rows() -> dict[int, str]:
            found = lake_rows(destination, str(lake / harness.source_name / "feed"), ["id", "v"], "id")
            return {int(i): str(v) for i, v in found}

    assert harness.materialize().success
    assert rows() == {1: "1 middle", 2: "2 old"}
    api.feed = [[_live(1, old, "1 old again"), _live(2, new, "2 new")]]
    assert harness.materialize().success
    assert rows() == {1: "1 middle", 2: "2 new"}
    api.feed = [[_live(1, middle, "1 middle, changed")]]  # an equal cursor: the later load wins
    assert harness.materialize().success
    assert rows() == {1: "1 middle, changed", 2: "2 new"}


@pytest.mark.parametrize("mode", ["hard", pytest.param("soft", marks=pytest.mark.slow)])  # one code path: ~25 s each
def test_a_tombstone_with_only_its_key_served_again_after_its_keys_re_creation_deletes_nothing(
    harness: StreamHarness, scripted_api: Start, target: str, mode: str
) -> None:
    """An API that serves an old tombstone carrying only its key again (a feed that lists deletions whatever
    `since` says) after the key's re-creation was loaded: the same tombstone (same fields) was applied before,
    and the row now holds a newer version than the one it deleted, so it is left live. Served again while the row
    holds the version it deleted (the live copy before it read again), it deletes again; a new tombstone (other
    fields) of the re-created key deletes."""
    api = scripted_api(feed=[[_live(5, 1, "five"), _live(7, 1, "seven"), _live(8, 2, "eight")]])
    _catalog(harness, api, target, mode)
    harness.materialize()
    api.feed = [[_gone(5), _gone(8)]]
    harness.materialize()
    assert _rows(harness) == {7: "seven"}
    api.feed = [[_live(5, 10, "five back"), _gone(7), _live(7, 4, "seven again")]]  # 7: re-created in the slice
    harness.materialize()
    assert _rows(harness) == {5: "five back", 7: "seven again"}
    api.feed = [[_gone(5)], [_gone(7)], [_live(8, 2, "eight")], [_gone(8)]]  # 8: its live copy, then its tombstone
    assert harness.materialize().success
    assert _rows(harness) == {5: "five back", 7: "seven again"}
    assert set(_rows(harness, deleted=True)) == (set() if mode == "hard" else {8})
    api.feed = [[{**_gone(5), "event": "e2"}]]  # a deletion of the re-created key: a tombstone not seen before
    harness.materialize()
    assert _rows(harness) == {7: "seven again"}


def test_a_hard_deleted_key_is_not_brought_back_by_an_older_live_copy(
    harness: StreamHarness, scripted_api: Start, target: str
) -> None:
    """Under `hard`, the target keeps the version each key was deleted at (its tombstone's cursor, or the row's
    last version for a tombstone carrying only its key; a dated tombstone of a key never seen too): an older live
    copy served after the deletion does not bring the key back, its re-creation (a newer cursor) does."""
    api = scripted_api(feed=[[_live(8, 3, "three"), _live(9, 3, "nine")]])
    _catalog(harness, api, target, "hard")
    harness.materialize()
    # newest first: the tombstone (cursor 9) in one slice, an older live copy (5) in the next, and again a run later
    api.feed = [[_gone(8, 9), _gone(9), _gone(20, 6)], [_live(8, 5, "five"), _live(9, 2, "two"), _live(20, 4, "4")]]
    harness.materialize()
    assert _rows(harness) == {}
    api.feed = [[_live(8, 7, "seven"), _live(9, 1, "one"), _live(20, 5, "5")]]
    harness.materialize()
    assert _rows(harness) == {}
    api.feed = [[_live(8, 12, "re-created"), _live(9, 4, "nine again"), _live(20, 8, "twenty")]]
    harness.materialize()
    assert _rows(harness) == {8: "re-created", 9: "nine again", 20: "twenty"}
    assert _rows(harness, deleted=True) == {}


@pytest.mark.slow
def test_what_the_target_remembers_of_its_deletions_holds_on_mariadb(
    harness: StreamHarness, scripted_api: Start, request: pytest.FixtureRequest
) -> None:
    server: MariaDb = request.getfixturevalue(mariadb.__name__)
    server.datasets.append(harness.source_name)
    api = scripted_api(feed=[[_live(5, 1, "five"), _live(8, 3, "three")]])
    _catalog(harness, api, "duckdb", "hard")
    use_destination(harness, server.destination())

    def rows() -> dict[int, str]:
        found = server.query(f"SELECT id, v FROM `{harness.source_name}`.`feed` WHERE _ingest_deleted_at IS NULL")
        return {int(i): str(v) for i, v in found}

    assert harness.materialize().success
    api.feed = [[_gone(5), _gone(8, 9)], [_live(8, 5, "older")]]
    assert harness.materialize().success
    assert rows() == {}
    api.feed = [[_live(5, 10, "five back")], [_gone(5)]]  # the old tombstone served again after the re-creation
    assert harness.materialize().success
    assert rows() == {5: "five back"}


def test_a_first_slice_of_tombstones_only_under_hard_deletes_nothing_and_holds_older_copies_back(
    harness: StreamHarness, scripted_api: Start, target: str
) -> None:
    """A stream's very first slice holding only tombstones (nothing loaded yet, no table, no dlt schema) under `hard`:
    nothing to delete, the read goes on, and a dated tombstone's key is held back from an older copy served later."""
    api = scripted_api(feed=[[_gone(5), _gone(7, 4)], [_live(6, 1, "six"), _live(7, 2, "seven, older")]])
    _catalog(harness, api, target, "hard")
    assert harness.materialize().success
    assert _rows(harness) == {6: "six"}


def test_a_refresh_starts_afresh_with_what_the_api_serves_after_hard_deletes(
    harness: StreamHarness, scripted_api: Start, target: str
) -> None:
    """The versions keys were hard-deleted at belong to the table they were deleted from: `ingest refresh` reads into
    a new table (a new generation), so a key the API serves again at an older version (restored from a backup) loads,
    and so does a key whose cursorless tombstone was seen before."""
    api = scripted_api(feed=[[_live(8, 3, "three"), _live(9, 3, "nine")], [_gone(8, 9), _gone(9)]])
    _catalog(harness, api, target, "hard")
    harness.materialize()
    assert _rows(harness) == {}
    api.feed = [[_live(8, 5, "restored at 5")], [_gone(9)], [_live(9, 4, "nine restored")]]
    request_refresh(harness.settings, harness.source_name, "feed", "remove")
    assert harness.materialize().success
    assert _rows(harness) == {8: "restored at 5", 9: "nine restored"}
    # the new generation remembers its own: 9's tombstone was seen before its copy loaded; 8's (new) deletes it
    api.feed = [[_gone(9)], [_gone(8)], [_live(8, 4, "older")]]
    harness.materialize()
    assert _rows(harness) == {9: "nine restored"}
