"""A CDC stream's declared key must be a key of its table that the log carries; `ingest check` runs on keys of
any type; `ingest check` and `ingest cdc status` say what is wrong with a source's connection in one line.
On the embedded PostgreSQL and a DuckDB file."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
import yaml

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.sources.postgres import plan_table_read, table_slices
from ingestion_assets.sources.postgres.cdc.changes import ChangeBatch, Op, RowChange, TableInfo, Transaction
from ingestion_assets.sources.postgres.cdc.chunks import ChunkSnapshot
from ingestion_assets.streams.cdc.history import Fences
from ingestion_assets_tests.helpers import REPO, StreamHarness
from ingestion_assets_tests.test_cdc_real_schemas import FAST, _failure, _metadata
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 20) g;
"""
# An event table as applications keep them: no primary key, REPLICA IDENTITY FULL, `id` repeats per sensor.
READINGS = """
CREATE TABLE readings (id int NOT NULL, sensor text NOT NULL, v int);
ALTER TABLE readings REPLICA IDENTITY FULL;
INSERT INTO readings SELECT g, s, g * 10 FROM generate_series(1, 30) g, unnest(ARRAY['a', 'b']) s;
"""


def _catalog(harness: StreamHarness, streams: dict[str, dict[str, Any]]) -> None:
    harness.write_catalog({name: {"table": name, **spec} for name, spec in streams.items()}, mode="cdc", cdc=FAST)


def _problems(harness: StreamHarness) -> list[str]:
    return check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))


def _published(harness: StreamHarness) -> list[str]:
    publication = f"ingest_{harness.source_name}"
    rows = harness.query_source(f"SELECT tablename::text FROM pg_publication_tables WHERE pubname = '{publication}'")
    return sorted(r[0] for r in rows)


def test_a_declared_key_that_is_not_unique_is_refused_before_any_ddl_then_a_real_key_loads_every_row(
    cdc: StreamHarness,
) -> None:
    harness = cdc
    harness.source.execute(ORDERS + READINGS)
    _catalog(harness, {"orders": {"primary_key": "id"}, "readings": {"primary_key": "id"}})
    stream = f"{harness.source_name}.readings"
    problems = [p for p in _problems(harness) if "readings" in p]
    assert len(problems) == 1, problems
    assert f"stream {stream} (table " in problems[0] and "readings" in problems[0]
    assert "primary_key ['id'] is not a key of the table" in problems[0]
    assert "The table's keys: none" in problems[0] and "add a unique index on (id)" in problems[0]
    assert not any("orders" in p for p in _problems(harness))

    message = _failure(harness.materialize(raise_on_error=False))
    assert f"stream {stream}" in message and "primary_key ['id'] is not a key" in message
    assert "nothing was changed on the source" in message
    assert _published(harness) == []  # refused before any DDL on the source
    assert harness.query_source(
        f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'ingest_{harness.source_name}'"
    ) == [(0,)]

    # The fix the message names: a unique index on the real key, declared as the stream's key.
    harness.source.execute("CREATE UNIQUE INDEX readings_key ON readings (id, sensor)")
    _catalog(harness, {"orders": {"primary_key": "id"}, "readings": {"primary_key": ["id", "sensor"]}})
    assert _problems(harness) == []
    harness.materialize()
    harness.source.execute(
        "UPDATE readings SET v = -1 WHERE id = 3 AND sensor = 'b'; DELETE FROM readings WHERE id = 4"
    )
    harness.materialize()
    columns = ["id", "sensor", "v"]
    target = harness.target_rows_where("readings", columns, "id, sensor", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("readings", "id, sensor")  # 58 rows, none collapsed
    assert len(target) == 58 and (3, "b", -1) in target and (3, "a", 30) in target


def test_a_stream_added_with_a_key_that_fails_its_check_is_left_out_and_the_others_go_on(cdc: StreamHarness) -> None:
    """A stream added to a running source whose declared key is not a key of its table stopped the whole source
    until the catalog was fixed. It is now left out (not published, no checkpoint), saying why, while the others
    go on; fixed, it is copied as a new stream."""
    harness = cdc
    harness.source.execute(ORDERS + READINGS)
    _catalog(harness, {"orders": {"primary_key": "id"}})
    harness.materialize()
    _catalog(harness, {"orders": {"primary_key": "id"}, "readings": {"primary_key": "id"}})
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id < 5; DELETE FROM orders WHERE id = 9")
    result = harness.materialize()
    said = _metadata(result, harness, "readings")["paused"]
    assert f"stream {harness.source_name}.readings is left out" in said and "is not a key of the table" in said
    assert _published(harness) == ["orders"]
    assert harness.target_rows_where("orders", ["id", "status"], "id", "true") == harness.source.rows("orders", "id")

    harness.source.execute("CREATE UNIQUE INDEX readings_key ON readings (id, sensor)")
    _catalog(harness, {"orders": {"primary_key": "id"}, "readings": {"primary_key": ["id", "sensor"]}})
    harness.materialize()
    target = harness.target_rows_where("readings", ["id", "sensor", "v"], "id, sensor", "true")
    assert target == harness.source.rows("readings", "id, sensor") and len(target) == 60


def test_a_declared_key_that_is_not_the_tables_key_names_the_real_one(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, code text, label text);"
        "INSERT INTO items SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE 'c' || g END, 'l' FROM generate_series(1, 20) g"
    )
    _catalog(harness, {"items": {"primary_key": "code"}})
    (problem,) = _problems(harness)
    assert f"stream {harness.source_name}.items (table " in problem and "primary_key ['code']" in problem
    assert "(id) [primary key]" in problem and "set primary_key to ['id']" in problem
    message = _failure(harness.materialize(raise_on_error=False))  # refused at once: no NOT NULL error from DuckDB
    assert f"stream {harness.source_name}.items" in message and "set primary_key to ['id']" in message
    assert _published(harness) == []

    # A unique NOT NULL column is a key, but with the default replica identity a delete carries only `id`.
    harness.source.execute("DELETE FROM items WHERE code IS NULL; ALTER TABLE items ALTER code SET NOT NULL")
    harness.source.execute("CREATE UNIQUE INDEX items_code ON items (code)")
    (problem,) = _problems(harness)
    assert "deletes carry only (id)" in problem and "REPLICA IDENTITY USING INDEX items_code" in problem

    harness.source.execute("ALTER TABLE items REPLICA IDENTITY USING INDEX items_code")
    assert _problems(harness) == []
    harness.materialize()
    harness.source.execute("DELETE FROM items WHERE id = 7; UPDATE items SET label = 'x' WHERE id = 8")
    harness.materialize()
    target = harness.target_rows_where("items", ["id", "code", "label"], "id", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("items", "id")
    assert (8, "c8", "x") in target and all(row[0] != 7 for row in target)


KEY_TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE by_uuid (id uuid PRIMARY KEY, note text);
INSERT INTO by_uuid SELECT md5(g::text)::uuid, 'n' || g FROM generate_series(1, 10) g;
CREATE TABLE by_day_host (day date, host inet, hits int, PRIMARY KEY (day, host));
INSERT INTO by_day_host SELECT date '2024-01-01' + g, ('10.0.0.' || g)::inet, g FROM generate_series(1, 10) g;
CREATE TABLE by_mood (m mood PRIMARY KEY, n numeric);
INSERT INTO by_mood VALUES ('sad', 1), ('ok', 2.5), ('happy', 3);
"""


@pytest.mark.parametrize("mode", ["cdc", "table"])
def test_check_reads_keys_of_types_that_have_no_empty_value(cdc: StreamHarness, mode: str) -> None:
    harness = cdc
    harness.source.execute(KEY_TYPES)
    streams = {
        "by_uuid": {"table": "by_uuid", "primary_key": "id"},
        "by_day_host": {"table": "by_day_host", "primary_key": ["day", "host"]},
        "by_mood": {"table": "by_mood", "primary_key": "m"},
    }
    harness.write_catalog(streams, **({"mode": "cdc", "cdc": FAST} if mode == "cdc" else {}))
    assert _problems(harness) == []  # was: invalid input syntax for type uuid: ""
    if mode == "cdc":
        harness.materialize()
        harness.source.execute(
            "UPDATE by_day_host SET hits = 0 WHERE host = '10.0.0.3'; DELETE FROM by_mood WHERE m = 'ok'"
        )
        harness.materialize()
        day_host = harness.target_rows_where(
            "by_day_host", ["day", "host", "hits"], "day", "_ingest_deleted_at IS NULL"
        )
        assert [(str(d), str(h), n) for d, h, n in day_host] == [
            (str(d), str(h), n) for d, h, n in harness.source.rows("by_day_host", "day")
        ]
        assert harness.target_rows_where("by_uuid", ["id", "note"], "note", "_ingest_deleted_at IS NULL") == (
            harness.source.rows("by_uuid", "note")
        )
        moods = harness.target_rows_where("by_mood", ["m"], "m", "_ingest_deleted_at IS NULL")
        assert sorted(m for (m,) in moods) == ["happy", "sad"]


def _ingest(harness: StreamHarness, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The `ingest` console script as a user runs it (this checkout's code: its folder is the working one)."""
    command = [sys.executable, "-c", "import sys; from ingestion_assets.cli import main; sys.exit(main())", *args]
    return subprocess.run(
        command, env=harness.cli_env(**env), cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


def _connection(harness: StreamHarness, connection: dict[str, str]) -> None:
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    catalog["sources"][harness.source_name]["connection"] = connection
    harness.catalog_path.write_text(yaml.safe_dump(catalog))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://nobody:s3cret-pass@127.0.0.1:{port}/source",  # the server refuses the role and password
        "postgresql://nobody:s3cret-pass@127.0.0.1:1/source",  # nothing listens there
    ],
)
def test_check_on_a_cdc_source_it_cannot_connect_to_says_so_in_one_line(
    cdc: StreamHarness, tmp_path: Path, url: str
) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {"primary_key": "id"}})
    port = str(urlsplit(harness.source.url).port)
    secret = tmp_path / "bad_url"
    secret.write_text(url.format(port=port))
    _connection(harness, {"file": str(secret)})
    done = _ingest(harness, "check")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output and "s3cret-pass" not in output
    assert f"sources.{harness.source_name}.connection (file:{secret}): cannot connect" in output


def test_cdc_status_with_an_unset_connection_variable_or_no_server_says_which(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {"primary_key": "id"}})
    _connection(harness, {"env": "INGEST_TEST_SOURCE_URL"})
    done = _ingest(harness, "cdc", "status", harness.source_name, INGEST_TEST_SOURCE_URL="")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output
    assert f"sources.{harness.source_name}.connection: environment variable INGEST_TEST_SOURCE_URL" in output

    nowhere = "postgresql://nobody:s3cret-pass@127.0.0.1:1/source"
    done = _ingest(harness, "cdc", "status", harness.source_name, INGEST_TEST_SOURCE_URL=nowhere)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output and "s3cret-pass" not in output
    assert f"sources.{harness.source_name}.connection (env:INGEST_TEST_SOURCE_URL): cannot connect" in output


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_soft_deletes_flag_target_rows_whose_keys_the_target_spells_otherwise(
    cdc: StreamHarness, destination: str
) -> None:
    """A soft delete of a row whose values only the target holds (the default replica identity sends the key
    only) flags the target's row by its key. Matched as the log's text, a key of a bool (`t`, the target's
    `true`), a float or bytea matched no row: the rows stayed live in the target and the run said nothing."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE k (flag bool, at timestamptz, r float8, blob bytea, v int, PRIMARY KEY (flag, at, r, blob));"
        "INSERT INTO k VALUES (true, '2024-01-02 03:04:05.5+00', 0.1, '\\x00ff', 1), (false, '2024-01-01', 1e20, "
        "'\\x', 2), (true, '2024-01-03', 2, '\\x01', 3)"
    )
    key = ["flag", "at", "r", "blob"]
    streams = {"k": {"table": "k", "primary_key": key, "deletes": "soft"}}
    harness.write_catalog(streams, destination=destination, mode="cdc", cdc=FAST)
    harness.materialize()
    harness.source.execute("DELETE FROM k WHERE v < 3")
    harness.materialize()
    rows = harness.query_target(f'SELECT v, _ingest_deleted_at IS NOT NULL FROM "{harness.source_name}".k ORDER BY v')
    assert rows == [(1, True), (2, True), (3, False)]


def test_a_large_value_a_change_does_not_resend_is_read_by_a_key_of_any_type(cdc: StreamHarness) -> None:
    """An UPDATE that leaves a TOASTed value alone does not resend it: it is read from the source by the row's
    key. Compared as `key::text` with the log's text, a bool key (`true` against `t`) or a char(n) key (its
    padding cut) found no row and the value landed as NULL while the run said ok; read as `::text`, a char(n)
    value lost its padding."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE docs (flag bool, code char(4), id int, body text, pad char(3000), v int, "
        "big bool GENERATED ALWAYS AS (v > 1) STORED, PRIMARY KEY (flag, code, id));"
        "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL, ALTER COLUMN pad SET STORAGE EXTERNAL;"
        "INSERT INTO docs SELECT g % 2 = 0, 'c' || g, g, repeat(md5(g::text), 200), 'p' || g, 1 "
        "FROM generate_series(1, 4) g"
    )  # body and pad out of line, uncompressed: TOASTed
    _catalog(harness, {"docs": {"primary_key": ["flag", "code", "id"]}})
    harness.materialize()
    harness.source.execute("UPDATE docs SET v = 2")  # body and pad are not in the log's change
    harness.materialize()
    columns = ["flag", "code", "id", "body", "pad", "v", "big"]
    assert harness.target_rows("docs", columns, "id") == harness.source.rows("docs", "id")


def test_a_copy_leaves_out_the_rows_a_transaction_it_does_not_see_touched_whatever_their_key_types(
    cdc: StreamHarness,
) -> None:
    """A copy's snapshot does not see some transactions the log brings: their keys are fenced and the copy's old
    rows of them are left out (the log has them). Compared as the log's text with Arrow's, a timestamptz, bool or
    float key was never fenced (the old row went over the log's newer one), and a bytea key stopped the copy."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE k (at timestamptz, flag bool, r float8, blob bytea, v int, PRIMARY KEY (at, flag, r, blob));"
        "INSERT INTO k VALUES ('2024-01-02 03:04:05.5+00', true, 1.5e-7, '\\x00ff', 1),"
        " ('2024-01-01 00:00:00+00', false, 0.1, '\\x', 2)"
    )
    key = ("at", "flag", "r", "blob")
    plan = plan_table_read(harness.source.url, harness.source.schema, "k", (), key)
    rows = pa.concat_tables(s.table for s in table_slices(harness.source.url, plan, None, 100, "k"))
    snapshot = ChunkSnapshot("s", xmin=100, xmax=100, in_progress=frozenset(), lsn=0)  # sees no xid >= 100
    table = (harness.source.schema, "k")
    fences = Fences(snapshot, columns={table: key})
    info = TableInfo(1, *table, (*key, "v"), (1184, 16, 701, 17, 23), key, "d")
    logged = ("2024-01-02 03:04:05.5+00", "t", "1.5e-07", "\\x00ff", "5")  # the log's text of row 1, changed
    now = dt.datetime.now(dt.UTC)
    change = RowChange(Op.UPDATE, info, logged, None, None, 200, 1, now, 0)
    fences.see(ChangeBatch(0, 1, (Transaction(200, 1, 2, now, (change,)),), True))
    kept = fences.drop_fenced(table, rows, plan.shape)
    assert kept.column("v").to_pylist() == [2]
