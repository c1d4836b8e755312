"""Bad text parks its row (or its file) and never blocks the stream: a NUL character (PostgreSQL's text cannot hold
it, DuckDB's does). Each bad row is its own dead letter, named by file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingestion_assets_tests.files_helpers import Target, target_catalog, target_of

BASE = 1_700_000_000.0


@pytest.fixture(params=["duckdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with target_of(request.param, tmp_path, request) as found:
        yield found


def _dead(target: Target) -> dict[str, str]:
    return dict(target.query("SELECT record_key, error FROM drops._ingest_dead_letter ORDER BY 1"))


def test_a_nul_in_text_parks_its_row_on_postgres_and_loads_as_written_on_duckdb(target: Target) -> None:
    """PostgreSQL's COPY refused the slice ('invalid byte sequence for encoding "UTF8": 0x00') naming neither file
    nor row, and every run failed the same way. Now the row is parked naming file, line and column; DuckDB holds
    the NUL and reads it back as written, so there it loads."""
    target_catalog(target, "*")
    rows = "".join(f"{i},n{i}\n" if i != 500 else f"{i},x\x00y\n" for i in range(1, 1001))
    target.drops.write("a.csv", "id,name\n" + rows, BASE + 1)
    target.drops.write("b.csv", 'id,name\n"20\x00",a\n2001,"q\x00\nr"\n2002,b\n', BASE + 2)  # a key, a value on 2 lines
    target.drops.write("c.jsonl", '{"id": 3001, "name": "d"}\n{"id": 3002, "name": "e\\u0000f"}\n', BASE + 3)
    outcome = target.drops.run()
    loaded = dict(target.query("SELECT CAST(id AS TEXT), name FROM drops.orders"))
    if target.url is None:  # DuckDB
        assert outcome.result.dead_letters == 0
        assert (loaded["500"], loaded["20\x00"], loaded["2001"], loaded["3002"]) == (
            "x\x00y",
            "a",
            "q\x00\nr",
            "e\x00f",
        )
        assert len(loaded) == 1005
        return
    assert outcome.result.dead_letters == 4
    assert len(loaded) == 1001 and {"1", "999", "1000", "2002", "3001"} <= set(loaded)
    dead = _dead(target)
    assert sorted(dead) == ["a.csv:row500", "b.csv:row1", "b.csv:row2", "c.jsonl:line2"]
    assert dead["a.csv:row500"].startswith("file a.csv row 500 (line 501): column 'name' holds the NUL character")
    assert "which PostgreSQL cannot store in text" in dead["a.csv:row500"]
    assert dead["b.csv:row1"].startswith("file b.csv row 1 (line 2): column 'id' holds the NUL")
    assert dead["b.csv:row2"].startswith("file b.csv row 2 (line 3): column 'name' holds the NUL")
    assert dead["c.jsonl:line2"].startswith("file c.jsonl line 2: column 'name' holds the NUL")
    ((raw,),) = target.query("SELECT raw_record FROM drops._ingest_dead_letter WHERE record_key = 'c.jsonl:line2'")
    raw = raw if isinstance(raw, dict) else json.loads(raw)
    assert json.loads(raw["text"]) == {"id": 3002, "name": "e\x00f"}  # the value as read, NUL written \u0000
