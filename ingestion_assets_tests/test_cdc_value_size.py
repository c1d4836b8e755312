"""`max_value_bytes` on a CDC stream: a value over the limit parks its change, from the table's copy and from the
log alike, measured as a table stream measures it (bytes as bytes, not their hex text); a later change of the key
that fits lands and releases it; an UPDATE that leaves a TOASTed value unchanged is measured by that value, not
by its placeholder. Real logical replication on the embedded PostgreSQL, into DuckDB and PostgreSQL."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from ingestion_assets.cli import main
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import FAST
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

LIMIT = 4000
# body is stored out of line uncompressed (EXTERNAL): a 3000-byte body is TOASTed, and an UPDATE of another
# column sends it as "unchanged". A 3000-byte bytea is 6002 characters of hex text: under the limit all the same.
TABLE = """
CREATE TABLE blobs (id int PRIMARY KEY, body text, data bytea, doc jsonb, tags text[], small int, amount numeric(6,2));
ALTER TABLE blobs ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO blobs VALUES
 (1, 'one', '\\x01', '{"a": 1}', '{a,b}', 1),
 (2, repeat('b', 5000), NULL, NULL, NULL, 2),
 (3, 'three', decode(repeat('ab', 4500), 'hex'), NULL, NULL, 3),
 (4, 'four', NULL, jsonb_build_object('k', repeat('j', 5000)), NULL, 4),
 (5, 'five', NULL, NULL, ARRAY[repeat('a', 2500), repeat('a', 2500)], 5),
 (10, repeat('m', 3000), decode(repeat('cd', 3000), 'hex'), NULL, NULL, 10);
"""
COLUMNS = ["id", "body", "data", "doc", "tags", "small", "amount"]


def _catalog(harness: StreamHarness, destination: str, **letters: Any) -> None:
    harness.write_catalog(
        {"blobs": {"table": "blobs", "primary_key": "id", "dead_letters": {"max_value_bytes": LIMIT, **letters}}},
        destination=destination,
        mode="cdc",
        cdc=FAST,
    )


def _parked(harness: StreamHarness) -> dict[str, str]:
    rows = harness.query_target_if_exists(
        f'SELECT record_key, error FROM "{harness.source_name}"._ingest_dead_letter ORDER BY record_key'
    )
    return {str(key): str(error) for key, error in rows}


def _target(harness: StreamHarness) -> list[tuple[Any, ...]]:
    return harness.target_rows("blobs", COLUMNS, "id", json_columns=["doc"])


def _source(harness: StreamHarness, where: str) -> list[tuple[Any, ...]]:
    rows = harness.query_source(f"SELECT {', '.join(COLUMNS)} FROM blobs WHERE {where} ORDER BY id")
    return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]


def _said(result: Any) -> int:
    """The run's count of dead letters, as its asset metadata says it."""
    (event,) = result.get_asset_materialization_events()
    return int(event.materialization.metadata["dead letters"].value)


# PostgreSQL slow: the parking is the same code for every destination (DuckDB guards it by default)
@pytest.mark.parametrize("destination", ["duckdb", pytest.param("postgres", marks=pytest.mark.slow)])
def test_values_over_the_limit_park_their_change_from_the_copy_and_the_log(
    cdc: StreamHarness, destination: str
) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, destination)
    first = harness.materialize()  # the copy
    parked = _parked(harness)
    assert sorted(parked) == ["2", "3", "4", "5"], parked
    assert re.search(r"body: value of 5,000 .* over the size limit of 4,000 bytes", parked["2"]), parked["2"]
    assert "data: value of 4,500" in parked["3"] and "doc: value of" in parked["4"] and "tags:" in parked["5"]
    assert _said(first) == 4
    assert _target(harness) == _source(harness, "id IN (1, 10)")

    harness.source.execute(
        """
        INSERT INTO blobs VALUES (6, repeat('x', 4001), NULL, NULL, NULL, 6), (7, 'seven', NULL, NULL, NULL, 7);
        UPDATE blobs SET body = repeat('y', 6000) WHERE id = 1;      -- a copied row grows over the limit
        INSERT INTO blobs VALUES (8, 'eight', NULL, NULL, NULL, 8);
        UPDATE blobs SET doc = jsonb_build_object('k', repeat('z', 5000)) WHERE id = 8;  -- fits, then not: one batch
        UPDATE blobs SET small = 11 WHERE id = 10;   -- its TOASTed body (3000 bytes) unchanged: no value of 0 bytes
        UPDATE blobs SET small = 22 WHERE id = 2;    -- a parked row's TOASTed body unchanged: still over
        INSERT INTO blobs VALUES (9, 'nine', decode(repeat('ef', 3500), 'hex'), NULL, ARRAY['x'], 9);
        INSERT INTO blobs (id, amount) VALUES (12, 1);
        UPDATE blobs SET amount = 'NaN' WHERE id = 12;               -- fits, then NaN: one batch
        """
    )
    second = harness.materialize()  # the log
    parked = _parked(harness)
    assert sorted(parked) == ["1", "12", "2", "3", "4", "5", "6", "8"], parked
    assert "body: value of 4,001" in parked["6"] and "body: value of 6,000" in parked["1"]
    assert "doc: value of" in parked["8"] and "body: value of 5,000" in parked["2"]
    raw = harness.query_target(_raw(harness, "2"))[0][0]
    assert (json.loads(raw) if isinstance(raw, str) else raw)["small"] in (22, "22")  # the newest change parked
    assert _said(second) == 5  # 6, 1, 8, 12 and 2 again
    # 1 keeps the version it had before the change that does not fit; 8 never landed
    assert _target(harness) == [
        (1, "one", b"\x01", {"a": 1}, ["a", "b"], 1, None),
        *_source(harness, "id IN (7, 9, 10)"),
    ]

    harness.source.execute(
        """
        UPDATE blobs SET body = 'short' WHERE id = 2;                 -- fits now
        UPDATE blobs SET data = decode('00', 'hex') WHERE id = 3;
        DELETE FROM blobs WHERE id IN (1, 6, 8, 12);                  -- hard deletes of parked keys
        UPDATE blobs SET body = repeat('v', 5000) WHERE id = 7;       -- over, then deleted: one batch
        DELETE FROM blobs WHERE id = 7;
        """
    )
    (written,) = harness.query_source("SELECT pg_current_wal_lsn()")[0]
    harness.materialize()
    assert sorted(_parked(harness)) == ["4", "5"], _parked(harness)
    assert _target(harness) == _source(harness, "id NOT IN (4, 5)")
    slot = f"ingest_{harness.source_name}"
    (advanced,) = harness.query_source(
        f"SELECT confirmed_flush_lsn >= '{written}'::pg_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    )[0]
    assert advanced  # the parked changes held nothing back


def _raw(harness: StreamHarness, key: str) -> str:
    return f"SELECT raw_record FROM \"{harness.source_name}\"._ingest_dead_letter WHERE record_key = '{key}'"


@pytest.mark.slow  # the replay reads with the copy's plan, which the first test guards by default
@pytest.mark.parametrize("destination", ["duckdb"])
def test_a_replay_after_the_limit_is_raised_loads_the_parked_rows(
    cdc: StreamHarness, destination: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, destination)
    harness.materialize()
    harness.source.execute("INSERT INTO blobs VALUES (6, repeat('x', 4001), NULL, NULL, NULL, 6)")
    harness.materialize()
    assert sorted(_parked(harness)) == ["2", "3", "4", "5", "6"]
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["dlq", "replay", f"{harness.source_name}.blobs"]) == 1  # still over: they stay
    assert "0 released, 5 still bad" in capsys.readouterr().out
    assert sorted(_parked(harness)) == ["2", "3", "4", "5", "6"]
    assert _target(harness) == _source(harness, "id IN (1, 10)")

    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    catalog["sources"][harness.source_name]["streams"]["blobs"]["dead_letters"]["max_value_bytes"] = 10_000
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    capsys.readouterr()
    assert main(["dlq", "replay", f"{harness.source_name}.blobs"]) == 0
    assert _parked(harness) == {}
    assert _target(harness) == _source(harness, "true")
    harness.source.execute("UPDATE blobs SET small = 60 WHERE id = 6")  # the log goes on over the replayed row
    harness.materialize()
    assert _target(harness) == _source(harness, "true")


def test_on_bad_value_null_loads_the_row_with_the_value_nulled_from_the_copy_and_the_log(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(TABLE)
    _catalog(harness, "duckdb", on_bad_value="null")
    harness.materialize()
    harness.source.execute(
        "INSERT INTO blobs VALUES (6, repeat('x', 4001), NULL, '[1]', NULL, 6);"
        "UPDATE blobs SET doc = jsonb_build_object('k', repeat('z', 5000)) WHERE id = 1;"
        "INSERT INTO blobs (id, amount) VALUES (11, 'NaN')"  # no decimal value: nulled too
    )
    harness.materialize()
    assert _parked(harness) == {}
    nulled = {2: "body", 3: "data", 4: "doc", 5: "tags", 6: "body", 1: "doc", 11: "amount"}
    expected = [
        tuple(None if COLUMNS[i] == nulled.get(row[0]) else value for i, value in enumerate(row))
        for row in _source(harness, "true")
    ]
    assert _target(harness) == expected
    notes = dict(harness.query_target(f'SELECT id, _ingest_meta FROM "{harness.source_name}".blobs ORDER BY id'))
    for key, column in nulled.items():
        assert json.loads(notes[key])["nulled"].startswith(f"{column}: "), (key, notes[key])
        assert ("over the size limit of 4,000 bytes" if key != 11 else "NaN has no exact decimal") in notes[key]
    assert notes[7 if 7 in notes else 10] is None
