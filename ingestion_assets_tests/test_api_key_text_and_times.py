"""An API stream's key that became text keeps one row per id however a later record writes the number (`901.0`),
and timestamps with digits past the microsecond land rounded as PostgreSQL rounds them, on DuckDB and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import ScriptedApi, write_scripted_catalog

STREAM: dict[str, Any] = {
    "path": "/feed",
    "primary_key": "id",
    "cursor": "seq",
    "cursor_param": "since",
    "page_size": 10,
    "retries": {"max_attempts": 1},
}


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_number_in_a_key_that_became_text_lands_as_its_value(
    harness: StreamHarness, scripted_api: Callable[..., ScriptedApi], destination: str
) -> None:
    # before: 901.0 landed as the key '901.0' beside '901': two rows for one id, the run ok
    api = scripted_api(feed=[[{"id": 900, "seq": 1, "v": "a"}, {"id": 901, "seq": 2, "v": "b"}]])
    write_scripted_catalog(harness, api, "feed", STREAM, destination)
    harness.materialize()
    api.feed = [[{"id": "900", "seq": 3, "v": "c"}]]  # the key field becomes text: 900 and 901 are '900', '901'
    harness.materialize()
    api.feed = [
        [{"id": 901.0, "seq": 4, "v": "d"}, {"id": 902.0, "seq": 5, "v": "e"}, {"id": 7.50, "seq": 6, "v": "f"}]
    ]
    harness.materialize()
    rows = harness.query_target(f'SELECT id, v FROM "{harness.source_name}".feed ORDER BY id')
    assert rows == [("7.5", "f"), ("900", "c"), ("901", "d"), ("902", "e")]


TIMES = [
    "2024-12-01T00:00:00.1234569Z",  # up: .123457
    "2024-12-01T00:00:00.1234564Z",  # down: .123456
    "2024-12-01T23:59:59.9999999Z",  # carries into the next day
    "2024-12-31T23:59:59.99999951Z",  # past a half: carries into the next year
    "2024-12-01T00:00:00.123456789+01:00",  # nanoseconds, another zone
    "2024-12-01T00:00:00.123456Z",  # microseconds: as they are
    "2024-12-01T00:00:00.1234565Z",  # ties: as PostgreSQL rounds them
    "2024-12-01T00:00:00.1234575Z",
    "2024-12-01T00:00:00.0000005Z",
    "2024-12-01T00:00:00.0000015Z",
]


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_timestamps_past_the_microsecond_round_as_postgresql_rounds_them(
    harness: StreamHarness, scripted_api: Callable[..., ScriptedApi], destination: str
) -> None:
    # before: every digit past the sixth was cut on DuckDB (23:59:59.9999999 stayed on its day), no word
    api = scripted_api(feed=[[{"id": i, "seq": i, "stamp": text} for i, text in enumerate(TIMES, 1)]])
    write_scripted_catalog(harness, api, "feed", STREAM, destination)
    harness.materialize()
    rows = harness.query_target(f'SELECT id, stamp FROM "{harness.source_name}".feed ORDER BY id')
    with harness.source.connect() as conn, conn.cursor() as cur:  # PostgreSQL's own reading of each text
        cur.execute("SELECT t::timestamptz FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n", (TIMES,))
        expected = [row[0] for row in cur.fetchall()]
    landed = [at if at.tzinfo else at.replace(tzinfo=dt.UTC) for _, at in rows]
    assert [int(i) for i, _ in rows] == list(range(1, len(TIMES) + 1))
    assert landed == expected
    assert landed[2] == dt.datetime(2024, 12, 2, tzinfo=dt.UTC) and landed[3] == dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
