"""Bad input loses nothing: rows that cannot load are parked with their reason and replayed after a fix."""

from __future__ import annotations

import json

import dagster as dg
import pyarrow as pa
import pytest

from ingestion_assets.cli import main
from ingestion_assets.cli.dlq import DISCARDED
from ingestion_assets.loading.dead_letters import split_bad_rows
from ingestion_assets.sources.postgres.bad_values import PROBLEMS, RAW
from ingestion_assets_tests.helpers import StreamHarness

MIXED = """
CREATE TABLE readings (
    id int PRIMARY KEY, sensor text NOT NULL, taken_at timestamptz, amount numeric(10,2), memo text,
    updated_at timestamptz NOT NULL
);
INSERT INTO readings SELECT g, 's' || g % 3, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 h', g * 1.5,
       'memo ' || g, timestamptz '2024-02-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 3000) g;
UPDATE readings SET taken_at = '294250-01-01 00:00:00+00' WHERE id = 7;  -- past what DuckDB and Arrow hold
UPDATE readings SET taken_at = '294276-12-31 23:59:59+00' WHERE id = 1500;
UPDATE readings SET amount = 'NaN' WHERE id = 2222;
UPDATE readings SET memo = repeat('x', 5000) WHERE id = 2999;
"""
BAD = {"7": "taken_at", "1500": "taken_at", "2222": "amount", "2999": "memo"}


def _catalog(harness: StreamHarness, **dead_letters: object) -> None:
    harness.write_catalog(
        {
            "readings": {
                "table": "readings",
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 700,
                "retries": {"max_attempts": 1},
                "dead_letters": {"max_value_bytes": 1000, **dead_letters},
            }
        }
    )


def _parked(harness: StreamHarness) -> dict[str, tuple[str, dict[str, object]]]:
    rows = harness.query_target(
        f'SELECT record_key, error, raw_record FROM "{harness.source_name}"._ingest_dead_letter ORDER BY record_key'
    )
    return {str(k): (str(e), json.loads(r) if isinstance(r, str) else r) for k, e, r in rows}


def _status_dead_letters(capsys: pytest.CaptureFixture[str]) -> object:
    """The `dead_letters` figure `ingest status --json` shows for the stream."""
    capsys.readouterr()
    main(["status", "--json"])
    (line,) = json.loads(capsys.readouterr().out)
    return line["dead_letters"]


def _cli(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)


def test_good_rows_load_bad_rows_wait_with_their_reason_and_replay_after_a_fix(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(MIXED)
    _catalog(harness)
    result = harness.materialize()
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__readings")[0].metadata
    assert metadata["dead letters"].value == 4 and metadata["rows written"].value == 2996

    parked = _parked(harness)
    assert sorted(parked) == sorted(BAD)
    for key, column in BAD.items():
        error, raw = parked[key]
        assert error.startswith(f"{column}: ") and raw["id"] == int(key)  # names the column; the raw row is kept
    assert "later than the latest timestamp" in parked["7"][0] and "over the size limit" in parked["2999"][0]
    loaded = {r[0] for r in harness.query_target(f'SELECT id FROM "{harness.source_name}".readings')}
    assert len(loaded) == 2996 and not loaded & {int(k) for k in BAD}  # none both loaded and parked

    _cli(harness, monkeypatch)
    assert main(["dlq", "list", f"{harness.source_name}.readings"]) == 0
    listed = capsys.readouterr().out
    assert "4 parked row(s)" in listed and "amount: NaN has no exact decimal value" in listed
    harness.materialize()  # nothing new to read: this run parks nothing, the four rows still wait
    assert _status_dead_letters(capsys) == 4  # what the target holds parked, not what the last run parked

    # fix the source without touching the cursor: only a replay can bring these rows in
    harness.source.execute(
        "UPDATE readings SET taken_at = '2024-01-01' WHERE id IN (7, 1500); UPDATE readings SET amount = 1 WHERE id = 2222"
    )
    assert main(["dlq", "replay", f"{harness.source_name}.readings"]) == 1  # one row is still too big
    assert "4 dead letter(s) read again: 3 released, 1 still bad" in capsys.readouterr().out
    assert sorted(_parked(harness)) == ["2999"]
    assert _status_dead_letters(capsys) == 1  # released by a replay, which is no run of the asset
    harness.source.execute("UPDATE readings SET memo = 'short' WHERE id = 2999")
    assert main(["dlq", "replay", f"{harness.source_name}.readings"]) == 0
    assert _parked(harness) == {}
    assert _status_dead_letters(capsys) == 0
    assert harness.assert_target_equals_source("readings", "readings", "id") == 3000


def test_nulling_instead_of_parking_keeps_the_reason_in_ingest_meta(harness: StreamHarness) -> None:
    harness.source.execute(MIXED)
    _catalog(harness, on_bad_value="null")
    harness.materialize()
    assert harness.target_count("readings") == 3000
    rows = harness.query_target(
        f'SELECT id, taken_at, amount, memo, _ingest_meta FROM "{harness.source_name}".readings '
        "WHERE _ingest_meta IS NOT NULL ORDER BY id"
    )
    assert [r[0] for r in rows] == [7, 1500, 2222, 2999]
    assert rows[0][1] is None and rows[2][2] is None and rows[3][3] is None  # the value nulled, the row kept
    assert "taken_at: 294250-01-01T00:00:00+00:00 is later" in json.loads(rows[0][4])["nulled"]


def test_a_mostly_bad_stream_stops_and_keeps_what_it_committed(harness: StreamHarness) -> None:
    harness.source.execute(MIXED)
    harness.source.execute("UPDATE readings SET amount = 'NaN' WHERE id % 5 = 0")  # 20 %: a mapping error
    _catalog(harness, max_share=0.05, min_rows=500)
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "could not load" in str(failure.step_failure_data.error) and "mapping error" in str(
        failure.step_failure_data.error
    )
    checkpoint = harness.checkpoint("readings")
    assert checkpoint is not None and checkpoint.position is not None  # the first slice is committed
    parked, loaded = len(_parked(harness)), harness.target_count("readings")
    assert parked > 0 and parked + loaded == 700  # one slice: every row either loaded or parked


def test_reconciliation_finds_rows_missing_from_the_target(harness: StreamHarness) -> None:
    harness.source.execute(MIXED)
    _catalog(harness)
    harness.write_catalog(
        {
            "readings": {
                "table": "readings",
                "primary_key": "id",
                "cursor": "updated_at",
                "reconcile": "full",
                "retries": {"max_attempts": 1},
                "dead_letters": {"max_value_bytes": 1000},
            }
        }
    )
    result = harness.materialize()
    check = next(r for r in result.get_asset_check_evaluations() if r.check_name == "reconciliation")
    assert check.passed and check.metadata["parked as dead letters"].value == 4
    assert check.metadata["source rows compared"].value == 3000

    import duckdb

    with duckdb.connect(str(harness.warehouse)) as con:  # a target that lost rows behind our back
        con.execute(f'DELETE FROM "{harness.source_name}".readings WHERE id IN (10, 11, 12)')
    result = harness.materialize()
    check = next(r for r in result.get_asset_check_evaluations() if r.check_name == "reconciliation")
    assert check.passed and check.metadata["read again by key (repaired)"].value == 3  # read again in the run
    assert check.metadata["sample of repaired keys"].value == ["10", "11", "12"]
    assert check.metadata["missing in target"].value == 0 and check.metadata["parked as dead letters"].value == 4
    with duckdb.connect(str(harness.warehouse)) as con:
        back = con.execute(f'SELECT id FROM "{harness.source_name}".readings WHERE id BETWEEN 10 AND 12').fetchall()
    assert sorted(back) == [(10,), (11,), (12,)]


NULL_KEYS = """
CREATE TABLE pairs (a int, b text, ts timestamptz NOT NULL, x int);  -- no primary key: the catalog declares (a, b)
INSERT INTO pairs SELECT g, 'k' || g, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 s', g
FROM generate_series(1, 50) g;
INSERT INTO pairs VALUES (NULL, 'n', '2026-01-01 00:00:10.5+00', -1), (7, NULL, '2026-01-01 00:00:20.5+00', -2),
                         (NULL, NULL, '2026-01-01 00:00:49.5+00', -3);
"""


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_null_in_a_declared_key_column_parks_the_row_and_the_rest_loads(
    harness: StreamHarness, destination: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a README-only attacker: a table without a primary key, `primary_key: [a, b]`, a row with a NULL
    in a or b failed every load of its slice (DuckDB: retried as transient, then "lower slice_rows"), nothing
    parked, the stream stuck. Such a row is a dead letter naming the column and its other key values."""
    harness.source.execute(NULL_KEYS)
    spec = {"table": "pairs", "primary_key": ["a", "b"], "cursor": "ts", "slice_rows": 20}
    harness.write_catalog({"pairs": {**spec, "retries": {"max_attempts": 1}}}, destination=destination)
    result = harness.materialize()
    metadata = result.asset_materializations_for_node(f"{harness.source_name}__pairs")[0].metadata
    assert metadata["dead letters"].value == 3 and metadata["rows written"].value == 50
    parked = _parked(harness)
    assert sorted(parked) == ["7|\\N", "\\N|\\N", "\\N|n"]
    assert parked["\\N|n"][0] == (
        "stream pairs: key column 'a' is null: the row cannot be merged on primary_key ['a', 'b'] "
        "(its other key values: b='n')"
    )
    assert "key column 'b' is null" in parked["7|\\N"][0] and "(its other key values: a=7)" in parked["7|\\N"][0]
    assert "key column 'a', 'b' is null" in parked["\\N|\\N"][0] and parked["\\N|n"][1]["x"] == -1
    loaded = harness.query_target(f'SELECT a, b, x FROM "{harness.source_name}".pairs ORDER BY a')
    assert loaded == [(g, f"k{g}", g) for g in range(1, 51)]
    checkpoint = harness.checkpoint("pairs")
    assert (
        checkpoint is not None
        and checkpoint.position is not None
        and checkpoint.position["ts"].startswith("2026-01-01T00:00:50")
    )

    harness.source.execute("UPDATE pairs SET a = 0, ts = '2026-01-02' WHERE b = 'n'")  # fixed at the source
    _cli(harness, monkeypatch)
    assert main(["dlq", "replay", f"{harness.source_name}.pairs"]) == 1  # two still without their key
    assert "3 dead letter(s) read again: 0 released, 2 still bad" in capsys.readouterr().out
    harness.materialize()  # the fixed row loads with its key
    assert harness.query_target(f"SELECT a, x FROM \"{harness.source_name}\".pairs WHERE b = 'n'") == [(0, -1)]


def test_with_on_bad_value_null_a_row_without_its_key_is_still_parked() -> None:
    """A value nulled lets its row load; a key that is NULL leaves nothing to merge on, so that row is parked."""
    table = pa.table(
        {
            "a": pa.array([1, None, 3], pa.int64()),
            "v": pa.array(["x", "y", None], pa.string()),
            RAW: pa.array([None, None, '{"a": 3, "v": "NaN"}'], pa.string()),
            PROBLEMS: pa.array([None, None, "v: NaN has no exact decimal value"], pa.string()),
        }
    )
    split = split_bad_rows(table, "t", None, "run", ["a"], ["a"], "null")
    assert split.rows.column("a").to_pylist() == [1, 3] and split.nulled == 1
    assert split.meta is not None and split.meta.to_pylist()[0] is None and "NaN" in split.meta.to_pylist()[1]
    assert split.dead is not None and split.dead.column("record_key").to_pylist() == ["\\N"]
    assert split.dead.column("error").to_pylist() == [
        "stream t: key column 'a' is null: the row cannot be merged on primary_key ['a']"
    ]
    assert json.loads(split.dead.column("raw_record")[0].as_py()) == {"a": None, "v": "y"}


GONE = "postgresql://nobody@127.0.0.1:9/none"  # a server that is not there


def _dead_letters_check(result: dg.ExecuteInProcessResult) -> bool:
    return next(e.passed for e in result.get_asset_check_evaluations() if e.check_name == "dead_letters")


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_a_person_discards_dead_letters_by_key_or_all_and_the_discard_is_recorded(
    harness: StreamHarness, destination: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README left a dead letter whose row came back under its key (or left the source) "for a person to
    decide", and gave that person no command: `ingest dlq` had list and replay only, the row stayed parked for
    good. `dlq discard` names the keys (or --all), is a dry run without --yes, refuses an unknown key whole, and
    records what it removed on the stream's asset."""
    harness.source.execute(NULL_KEYS)
    spec = {"table": "pairs", "primary_key": ["a", "b"], "cursor": "ts", "slice_rows": 20}
    harness.write_catalog({"pairs": {**spec, "retries": {"max_attempts": 1}}}, destination=destination)
    assert not _dead_letters_check(harness.materialize())  # three rows parked by this run
    name = f"{harness.source_name}.pairs"
    harness.source.execute("UPDATE pairs SET a = 0, ts = '2026-01-02' WHERE b = 'n'")  # given its key at the source
    assert _dead_letters_check(harness.materialize())  # loads as 0|n; its old dead letter stays
    assert harness.query_target(f"SELECT a, x FROM \"{harness.source_name}\".pairs WHERE b = 'n'") == [(0, -1)]
    assert sorted(_parked(harness)) == ["7|\\N", "\\N|\\N", "\\N|n"]

    _cli(harness, monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as unknown:
        main(["dlq", "discard", name, "--key", "\\N|n", "--key", "0|n", "--yes"])
    assert str(unknown.value.code).startswith(f"error: {name}: no dead letter with key '0|n' (3 key(s) parked")
    assert sorted(_parked(harness)) == ["7|\\N", "\\N|\\N", "\\N|n"]  # nothing left, not even the known key

    assert main(["dlq", "discard", name, "--key", "\\N|n"]) == 0  # no --yes: a dry run
    said = capsys.readouterr().out
    assert "would discard key \\N|n  (stream pairs: key column 'a' is null" in said and "nothing removed" in said
    assert sorted(_parked(harness)) == ["7|\\N", "\\N|\\N", "\\N|n"]

    assert main(["dlq", "discard", name, "--key", "\\N|n", "--yes", "--reason", "loaded as 0|n"]) == 0
    said = capsys.readouterr().out
    assert "  discarded key \\N|n  (" in said and f"{name}: 1 dead letter(s) discarded (loaded as 0|n)" in said
    assert sorted(_parked(harness)) == ["7|\\N", "\\N|\\N"]
    assert _status_dead_letters(capsys) == 2

    if destination == "duckdb":  # the source gone: its dead letters are still listed and discarded (never read)
        (harness.tmp_path / "source_url").write_text(GONE)
        assert main(["dlq", "list", name]) == 0 and "2 parked row(s)" in capsys.readouterr().out
    assert main(["dlq", "discard", name, "--all", "--yes"]) == 0
    assert "2 dead letter(s) discarded" in capsys.readouterr().out
    assert _parked(harness) == {} and _status_dead_letters(capsys) == 0
    assert main(["dlq", "discard", name, "--all", "--yes"]) == 0
    assert "no parked rows: nothing to discard" in capsys.readouterr().out

    records = harness.instance.fetch_observations(harness.key("pairs"), limit=1000).records
    discards = [r.asset_observation.metadata for r in records if r.asset_observation is not None]
    entries = [m[DISCARDED].value for m in discards if DISCARDED in m]  # newest first
    assert [(e["count"], e["reason"]) for e in entries] == [(2, None), (1, "loaded as 0|n")]
    assert [d["key"] for d in entries[1]["dead letters"]] == ["\\N|n"]
    assert entries[1]["dead letters"][0]["error"].startswith("stream pairs: key column 'a' is null")
    assert sorted(d["key"] for d in entries[0]["dead letters"]) == ["7|\\N", "\\N|\\N"]
    assert harness.checkpoint("pairs") is not None  # a discard is no checkpoint: the position stays
    assert harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".pairs') == [(51,)]
    if destination == "postgres":  # the destination gone: one line naming the stream, no traceback
        (harness.tmp_path / "source_url").write_text(GONE)
        with pytest.raises(SystemExit) as failed:
            main(["dlq", "discard", name, "--all"])
        assert str(failed.value.code).startswith(f"error: {name}: dlq discard failed: ")


def test_a_parked_row_whose_text_key_holds_the_separator_or_a_backslash_is_replayed_by_its_own_key(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead letter's key is its values joined by '|'; replay split that text again: a composite text key holding
    '|' read back as too many values, and a text key `\\N` as NULL, so replay never found those rows and called
    them gone from the source (the README then tells a person to discard them). Values are escaped now."""
    harness.source.execute(
        "CREATE TABLE tagged (k text, j text, v numeric(10,2), ts timestamptz NOT NULL, PRIMARY KEY (k, j));"
        "INSERT INTO tagged VALUES ('a|b', 'c', 'NaN', '2026-01-01'), ('a', 'b|c', 'NaN', '2026-01-01'),"
        "  ('\\N', 'x', 'NaN', '2026-01-01'), ('back\\slash', '', 'NaN', '2026-01-01'), ('ok', 'ok', 1, '2026-01-01')"
    )
    spec = {"table": "tagged", "primary_key": ["k", "j"], "cursor": "ts", "retries": {"max_attempts": 1}}
    harness.write_catalog({"tagged": spec})
    harness.materialize()
    assert sorted(_parked(harness)) == ["\\\\N|x", "a\\|b|c", "a|b\\|c", "back\\\\slash|"]
    harness.source.execute("UPDATE tagged SET v = 2 WHERE v = 'NaN'")  # fixed without moving the cursor: only a replay brings them
    _cli(harness, monkeypatch)
    assert main(["dlq", "replay", f"{harness.source_name}.tagged"]) == 0, capsys.readouterr()
    assert "4 dead letter(s) read again: 4 released, 0 still bad" in capsys.readouterr().out
    assert _parked(harness) == {}
    harness.assert_target_equals_source("tagged", "tagged", "k, j")
