"""A PostgreSQL destination end to end through the COPY + merge path: names, evolution, the merge's key."""

from __future__ import annotations

import pytest

from ingestion_assets.cli import main
from ingestion_assets.loading.destinations import POSTGRES_IDENTIFIER_LENGTH
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.helpers import StreamHarness

LONG = "ThisColumnNameIsCamelCaseAndGrowsPastTheLimitWhenSnakeCased"  # 59 bytes; snake_case makes it 66
TABLE = f"""
CREATE TABLE "Items" (id int PRIMARY KEY, "select" text, qty int, note text, "{LONG}" text,
    payload jsonb, updated_at timestamptz NOT NULL);
INSERT INTO "Items" SELECT g, CASE WHEN g % 3 = 0 THEN '' WHEN g % 3 = 1 THEN NULL ELSE 'k' || g END, g, 'n' || g,
    repeat('x', g % 5), jsonb_build_object('g', g), timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
FROM generate_series(1, 300) g;
"""
CHANGE = """
ALTER TABLE "Items" ADD COLUMN color text; ALTER TABLE "Items" ALTER COLUMN qty TYPE bigint;
ALTER TABLE "Items" DROP COLUMN note;
UPDATE "Items" SET color = 'red', qty = qty * 10000000000, "select" = '', updated_at = now() WHERE id <= 20;
"""


def _target(harness: StreamHarness, columns: list[str]) -> list[tuple[object, ...]]:
    names = TargetNames("snake_case", POSTGRES_IDENTIFIER_LENGTH, case_sensitive=True)  # as the loader names them
    listed = ", ".join(f'"{names.column(c)}"' for c in columns)
    return harness.query_target(f'SELECT {listed} FROM "{harness.source_name}".items ORDER BY id')


def test_names_types_and_evolution_land_exactly(harness: StreamHarness) -> None:
    harness.source.execute(TABLE)
    harness.write_catalog(
        {"items": {"table": '"Items"', "primary_key": "id", "cursor": "updated_at", "schema_policy": "evolve"}},
        destination="postgres",
    )
    harness.materialize()
    harness.source.execute(CHANGE)
    harness.materialize()
    columns = ["id", "select", "qty", LONG, "color", "updated_at"]
    listed = ", ".join(f'"{c}"' for c in columns)
    expected = harness.query_source(f'SELECT {listed} FROM "Items" ORDER BY id')
    assert _target(harness, columns) == expected  # '' stays '', NULL stays NULL, the long name is found
    notes = harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".items WHERE note IS NULL')
    assert notes == [(20,)]  # a dropped column is kept; rows read after the drop carry NULL
    types = dict(
        harness.query_target(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{harness.source_name}' AND table_name = 'items'"
        )
    )
    assert types["qty"] == "bigint" and types["payload"] == "jsonb" and types["color"] == types["select"]
    unique = harness.query_target(
        f"SELECT count(*) FROM pg_index WHERE indisunique AND indrelid = to_regclass('\"{harness.source_name}\".items')"
    )
    assert unique == [(1,)]  # the merge's ON CONFLICT key


@pytest.mark.slow
def test_dead_letters_replay_and_refresh_on_a_postgres_target(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(
        "CREATE TABLE readings (id int PRIMARY KEY, memo text, updated_at timestamptz NOT NULL);"
        "INSERT INTO readings SELECT g, 'memo ' || g, timestamptz '2024-02-01 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(1, 2000) g; UPDATE readings SET memo = repeat('x', 5000) WHERE id IN (7, 1999)"
    )
    spec = {"table": "readings", "primary_key": "id", "cursor": "updated_at", "slice_rows": 700}
    harness.write_catalog({"readings": {**spec, "dead_letters": {"max_value_bytes": 1000}}}, destination="postgres")
    harness.materialize()
    parked = harness.query_target(f'SELECT record_key FROM "{harness.source_name}"._ingest_dead_letter ORDER BY 1')
    assert parked == [("1999",), ("7",)]
    assert harness.target_count("readings") == 1998
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.source.execute("UPDATE readings SET memo = 'short' WHERE id IN (7, 1999)")  # the cursor stays
    assert main(["dlq", "replay", f"{harness.source_name}.readings"]) == 0
    capsys.readouterr()
    assert harness.query_target(f'SELECT count(*) FROM "{harness.source_name}"._ingest_dead_letter') == [(0,)]
    assert harness.assert_target_equals_source("readings", "readings", "id") == 2000

    harness.source.execute("DELETE FROM readings WHERE id <= 10")
    assert main(["refresh", f"{harness.source_name}.readings", "--later"]) == 0
    harness.materialize()  # a shadow table loaded and swapped in: the deleted rows are gone
    assert harness.assert_target_equals_source("readings", "readings", "id") == 1990
    harness.source.execute("UPDATE readings SET memo = 'after', updated_at = now() WHERE id = 11")
    harness.materialize()  # merges into the swapped-in table through its own (renamed) unique index
    assert harness.assert_target_equals_source("readings", "readings", "id") == 1990


@pytest.mark.slow
def test_a_crash_after_the_first_copy_is_merged_over_not_appended_twice(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first full read COPYs straight into the empty target; a crash before its checkpoint leaves the
    slice there, and the next run (no checkpoint, a target with rows) must merge, not append again."""
    harness.source.execute(
        "CREATE TABLE events (id bigint PRIMARY KEY, body text, updated_at timestamptz NOT NULL);"
        "INSERT INTO events SELECT g, 'e' || g, timestamptz '2024-03-01 00:00:00+00' + g * interval '1 ms' "
        "FROM generate_series(1, 3000) g"
    )
    spec = {"table": "events", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}
    harness.write_catalog({"events": {**spec, "retries": {"max_attempts": 1}}}, destination="postgres")
    monkeypatch.setenv(FAULT_ENV, "after_load:0")
    assert not harness.materialize(raise_on_error=False).success
    assert harness.target_count("events") == 1000
    monkeypatch.delenv(FAULT_ENV)
    harness.materialize()
    assert harness.assert_target_equals_source("events", "events", "id") == 3000


def _sessions(harness: StreamHarness) -> int:
    """Connections the target database has taken so far (the counter a backend bumps when it starts)."""
    harness.query_target("SELECT pg_sleep(1.2)")  # backends flush their statistics at most once a second
    ((sessions,),) = harness.query_target("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    return int(sessions)


def test_slices_of_one_run_share_one_target_connection(harness: StreamHarness) -> None:
    """A run's slices merge on the loader's one connection, the writer lock held by each slice's transaction:
    a connection per slice (or three, as before) costs more than a small slice's merge."""
    harness.source.execute(TABLE)
    spec = {"table": '"Items"', "primary_key": "id", "cursor": "updated_at", "slice_rows": 150}
    harness.write_catalog({"few": dict(spec), "many": {**spec, "slice_rows": 25}}, destination="postgres")
    before = _sessions(harness)
    harness.materialize("few")  # 2 slices
    few = _sessions(harness) - before
    harness.materialize("many")  # 12 slices
    many = _sessions(harness) - before - few
    assert harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".many') == [(300,)]
    assert many - few < 10, f"{few} connections for 2 slices, {many} for 12"


def test_values_the_load_cannot_carry_are_parked_without_blaming_a_postgres_destination(
    harness: StreamHarness,
) -> None:
    """Found by a README-only attack: on a PostgreSQL destination, dead letters said "DuckDB and Arrow" (far
    timestamps) and "does not fit the target type" (NaN in numeric(10,2), which PostgreSQL's column holds). The
    limit is the load's Arrow slices: the reason says so; an infinite interval, which PostgreSQL holds, loads."""
    harness.source.execute(
        "CREATE TABLE odd (id int PRIMARY KEY, n numeric(10,2), ts timestamptz, updated_at timestamptz NOT NULL);"
        "INSERT INTO odd VALUES (1, 'NaN', '2024-01-01', now()), (2, 1.5, '294250-01-01 00:00:00+00', now()),"
        "(3, 2, '2024-01-02', now())"
    )
    infinite_interval = harness.query_source("SHOW server_version_num")[0][0] >= "170000"
    if infinite_interval:
        harness.source.execute("ALTER TABLE odd ADD COLUMN iv interval; UPDATE odd SET iv = 'infinity' WHERE id = 3")
    harness.write_catalog({"odd": {"table": "odd", "primary_key": "id", "cursor": "updated_at"}}, destination="postgres")
    harness.materialize()
    reasons = dict(
        harness.query_target(f'SELECT record_key, error FROM "{harness.source_name}"._ingest_dead_letter')
    )
    assert reasons == {
        "1": "n: NaN has no exact decimal value: the load carries numeric(p,s) as Arrow decimals, whatever the "
        "destination",
        "2": "ts: 294250-01-01T00:00:00+00:00 is later than the latest timestamp the load carries (294247-01-10 "
        "04:00:54.775806 UTC: microseconds in 64 bits, as Arrow and DuckDB keep them), whatever the destination",
    }
    assert harness.query_target(f'SELECT id, n::text FROM "{harness.source_name}".odd') == [(3, "2.00")]
    if infinite_interval:
        assert harness.query_target(f'SELECT iv::text FROM "{harness.source_name}".odd') == [("infinity",)]
