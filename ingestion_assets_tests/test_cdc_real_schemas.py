"""CDC on what operational databases do (issue 13), on the embedded PostgreSQL 18: keyless tables never
published (the application's writes never fail), state per stream, streams added to a running source,
partitioned tables, soft deletes that keep values, schema changes, and slot verdicts."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import dagster as dg
import psycopg2
import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.cli import main
from ingestion_assets.loading.destinations import target_names
from ingestion_assets.observe.status import stream_statuses
from ingestion_assets.sources.postgres.cdc import check_cdc
from ingestion_assets.state.checkpoints import reset_checkpoint
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_cdc_streams import cdc

__all__ = ["cdc"]  # the fixture that drops the slot and publication a test leaves

ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, amount numeric(12,2), note text);
INSERT INTO orders SELECT g, 'new', g * 1.5, 'n' || g FROM generate_series(1, 1000) g;
"""
CUSTOMERS = """
CREATE TABLE customers (id int PRIMARY KEY, name text);
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 200) g;
"""
FAST = {"max_changes": 300, "max_seconds": 1, "max_batches_per_run": 50, "retries": {"max_attempts": 1}}


def _catalog(harness: StreamHarness, streams: dict[str, dict[str, Any]], **cdc: Any) -> None:
    harness.write_catalog(
        {name: {"table": name, "primary_key": "id", **spec} for name, spec in streams.items()},
        mode="cdc",
        cdc={**FAST, **cdc},
    )


def _failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    event = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    return str(event.step_failure_data.error)


def _metadata(result: dg.ExecuteInProcessResult, harness: StreamHarness, stream: str) -> dict[str, Any]:
    materializations = result.asset_materializations_for_node(f"{harness.source_name}__cdc")
    found = next(m for m in materializations if m.asset_key == harness.key(stream))
    return {k: v.value for k, v in found.metadata.items()}


def _assert_exact(harness: StreamHarness, table: str) -> None:
    columns = harness.source.columns(table)
    target = harness.target_rows_where(table, columns, "id", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows(table, "id")


def _drain(harness: StreamHarness) -> None:
    for _ in range(5):
        result = harness.materialize()
        if all(
            m.metadata["rows read"].value == 0
            for m in result.asset_materializations_for_node(f"{harness.source_name}__cdc")
        ):
            return


class Writer:
    """A source application writing from its own connection; every error it meets is kept."""

    def __init__(
        self, url: str, schema: str, statements: list[tuple[str, int]], seed: int = 3, pause: float = 0.002
    ) -> None:
        self.url, self.schema, self.statements, self.seed, self.pause = url, schema, statements, seed, pause
        self.errors: list[str] = []
        self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        rng = random.Random(self.seed)
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'SET search_path = "{self.schema}"')
            while not self._stop.is_set():
                statement, keys = rng.choice(self.statements)
                try:
                    cur.execute(statement, {"k": rng.randint(1, keys), "n": 100_000 + self.writes})
                    self.writes += 1
                except psycopg2.Error as exc:
                    self.errors.append(str(exc).strip())
                time.sleep(self.pause)
        conn.close()


def test_a_keyless_table_is_never_published_and_the_applications_writes_never_fail(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(
        ORDERS
        + "CREATE TABLE events (id int, note text); INSERT INTO events SELECT g, 'e' FROM generate_series(1, 50) g"
    )
    _catalog(harness, {"orders": {}, "events": {}})
    publication = f"ingest_{harness.source_name}"
    app = [("UPDATE events SET note = note || 'x' WHERE id = %(k)s", 50), ("DELETE FROM events WHERE id = %(k)s", 50)]
    with Writer(harness.source.url, harness.source.schema, app) as writer:
        problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
        assert any("events" in p and "REPLICA IDENTITY FULL" in p for p in problems)
        message = _failure(harness.materialize(raise_on_error=False))
        assert "events" in message and "was not published" in message and "nothing was changed" in message
        time.sleep(0.3)
    assert writer.writes > 0 and writer.errors == []
    published = harness.query_source(f"SELECT count(*) FROM pg_publication WHERE pubname = '{publication}'")
    assert published == [(0,)]  # refused before any DDL: not even the good table was published
    harness.source.execute("UPDATE events SET note = 'after' WHERE id = 1")  # the application still works


@pytest.mark.slow  # ~26 s: the default suite stays under 45 minutes (`make test-slow` runs it)
def test_a_truncate_refused_on_a_stream_that_is_not_first_is_fixed_by_resetting_that_stream(
    cdc: StreamHarness,
) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    harness.source.execute("TRUNCATE orders; INSERT INTO orders VALUES (1, 'again', 1, NULL)")
    harness.source.execute("UPDATE customers SET name = 'renamed' WHERE id = 7")
    message = _failure(harness.materialize(raise_on_error=False))
    assert f"ingest state reset {harness.source_name}.orders" in message
    reset_checkpoint(harness.instance, harness.key("orders"), None, reason="the error named it")
    result = harness.materialize()
    assert _metadata(result, harness, "orders")["copied"] is True
    assert "copied" not in _metadata(result, harness, "customers")  # the other stream just continued
    assert "the table's copy beside the log is complete" in _metadata(result, harness, "orders")["summary"]
    assert "1 changes applied" in _metadata(result, harness, "customers")["summary"]
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")


@pytest.mark.slow  # ~36 s: the default suite stays under 45 minutes (`make test-slow` runs it)
def test_a_stream_added_to_a_running_source_gets_its_existing_rows_while_a_writer_runs(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}}, max_batches_per_run=4)
    harness.materialize()
    app = [
        ("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %(k)s", 1000),
        ("DELETE FROM orders WHERE id = %(k)s", 1000),
        ("INSERT INTO orders VALUES (%(n)s, 'new', 1, NULL)", 1),
        ("UPDATE orders SET id = id + 500000 WHERE id = %(k)s", 1000),  # a key change
        ("UPDATE customers SET name = name || '+' WHERE id = %(k)s", 200),
    ]
    with Writer(harness.source.url, harness.source.schema, app, pause=0.01) as writer:
        time.sleep(0.3)
        _catalog(harness, {"customers": {}, "orders": {}}, max_batches_per_run=4)
        result = harness.materialize()
        assert _metadata(result, harness, "orders")["copied"] is True
        harness.materialize()
    assert writer.errors == [] and writer.writes > 50
    _drain(harness)
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")


def test_a_stream_removed_from_the_catalog_leaves_the_publication_and_the_others_go_on(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    publication = f"ingest_{harness.source_name}"
    published = f"SELECT tablename::text FROM pg_publication_tables WHERE pubname = '{publication}' ORDER BY 1"
    assert [r[0] for r in harness.query_source(published)] == ["customers", "orders"]
    _catalog(harness, {"customers": {}})
    harness.source.execute("UPDATE customers SET name = 'x' WHERE id < 5; UPDATE orders SET note = 'y' WHERE id < 5")
    harness.materialize()
    assert [r[0] for r in harness.query_source(published)] == ["customers"]  # its changes are no longer decoded
    harness.source.execute("UPDATE customers SET name = 'z' WHERE id = 7; DELETE FROM orders WHERE id = 9")
    _drain(harness)
    _assert_exact(harness, "customers")


PARTITIONED = """
CREATE TABLE measures (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE measures_eu PARTITION OF measures FOR VALUES IN ('eu');
CREATE TABLE measures_us PARTITION OF measures FOR VALUES IN ('us');
INSERT INTO measures SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 300) g;
"""


def test_a_partitioned_table_lands_in_one_target_with_rows_moving_between_partitions(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(PARTITIONED)
    harness.write_catalog({"measures": {"table": "measures", "primary_key": ["id", "region"]}}, mode="cdc", cdc=FAST)
    harness.materialize()
    harness.source.execute("UPDATE measures SET region = 'us' WHERE id <= 20 AND region = 'eu'")  # moves partition
    harness.source.execute(
        "UPDATE measures SET v = -v WHERE id > 290; DELETE FROM measures WHERE id BETWEEN 100 AND 110"
    )
    harness.materialize()
    assert check_catalog(harness.settings, load_catalog(harness.settings.catalog_path)) == []
    harness.materialize()  # no DuplicateObject on later runs
    columns = ["id", "region", "v"]
    target = harness.target_rows_where("measures", columns, "id, region", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("measures", "id, region")
    # A publication made elsewhere without publish_via_partition_root: the check says exactly what to change.
    harness.source.execute("CREATE PUBLICATION leafy FOR TABLE measures")
    try:
        table = (harness.source.schema, "measures")
        problems = check_cdc(harness.source.url, "unused_slot", "leafy", [table], expect_slot=False)
        assert [p.message for p in problems if "partition" in p.message] == [
            f'publishes the partitions of the partitioned table "{harness.source.schema}"."measures" under their own '
            'names, so its changes never reach the stream; ALTER PUBLICATION "leafy" SET (publish_via_partition_root '
            "= true)"
        ]
    finally:
        harness.source.execute("DROP PUBLICATION leafy")


def test_attaching_or_detaching_a_partition_copies_the_stream_again(cdc: StreamHarness) -> None:
    """ATTACH PARTITION brings rows and DETACH takes them away without a row change in the log: the stream's
    partitions are compared at each run, and a change copies the table again (retiring what left)."""
    harness = cdc
    harness.source.execute(PARTITIONED)
    harness.write_catalog({"measures": {"table": "measures", "primary_key": ["id", "region"]}}, mode="cdc", cdc=FAST)
    harness.materialize()
    harness.source.execute(
        "CREATE TABLE measures_asia (LIKE measures INCLUDING ALL);"
        "INSERT INTO measures_asia SELECT g, 'asia', g FROM generate_series(1000, 1009) g;"
        "ALTER TABLE measures ATTACH PARTITION measures_asia FOR VALUES IN ('asia');"
        "INSERT INTO measures VALUES (1010, 'asia', 1)"
    )
    columns = ["id", "region", "v"]
    for change in ("", "ALTER TABLE measures DETACH PARTITION measures_asia"):
        harness.source.execute(change or "SELECT 1")
        harness.materialize()
        target = harness.target_rows_where("measures", columns, "id, region", "_ingest_deleted_at IS NULL")
        assert target == harness.source.rows("measures", "id, region"), change or "attach"


def test_soft_deletes_keep_the_rows_last_values_without_touching_the_replica_identity(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {"deletes": "soft"}})
    harness.materialize()
    harness.source.execute("UPDATE orders SET status = 'last' WHERE id <= 5")
    harness.materialize()
    harness.source.execute("DELETE FROM orders WHERE id <= 3")  # values only in the target
    harness.source.execute(
        "INSERT INTO orders VALUES (5000, 'brief', 2, 'x'); UPDATE orders SET status = 'gone' WHERE id = 4"
    )
    harness.source.execute("DELETE FROM orders WHERE id IN (4, 5000)")  # values in the same batch
    harness.materialize()
    deleted = harness.query_target(
        f'SELECT id, status, amount, note FROM "{harness.source_name}".orders '
        "WHERE _ingest_deleted_at IS NOT NULL ORDER BY id"
    )
    assert [(i, s, float(a), n) for i, s, a, n in deleted] == [
        (1, "last", 1.5, "n1"),
        (2, "last", 3.0, "n2"),
        (3, "last", 4.5, "n3"),
        (4, "gone", 6.0, "n4"),
        (5000, "brief", 2.0, "x"),
    ]
    identity = harness.query_source(
        f"SELECT relreplident FROM pg_class WHERE oid = '{harness.source.schema}.orders'::regclass"
    )
    assert identity == [("d",)]
    _assert_exact(harness, "orders")


def test_a_column_added_with_a_default_reaches_existing_rows_and_an_incompatible_type_change_stops(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}})
    harness.materialize()
    app = [("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %(k)s", 1000)]
    with Writer(harness.source.url, harness.source.schema, app) as writer:
        time.sleep(0.2)
        harness.source.execute("ALTER TABLE orders ADD COLUMN region text DEFAULT 'eu'")
        harness.materialize()
        harness.source.execute("ALTER TABLE orders ALTER COLUMN id TYPE bigint")  # a rewrite, widened
        harness.materialize()
    assert writer.errors == []
    _drain(harness)
    _assert_exact(harness, "orders")  # every row has region 'eu', and every update
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["schema", "show", f"{harness.source_name}.orders"]) == 0
    shown = capsys.readouterr().out
    assert "region" in shown and "no schema stored yet" not in shown
    harness.source.execute("ALTER TABLE orders ALTER COLUMN amount TYPE int USING amount::int")
    message = _failure(harness.materialize(raise_on_error=False))
    assert "'amount'" in message and f"ingest schema accept {harness.source_name}.orders" in message


def test_cdc_status_gives_a_verdict_against_the_threshold(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}}, max_retained_wal_mb=1)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["cdc", "status", harness.source_name]) == 0
    assert "the first run creates it" in capsys.readouterr().out
    harness.materialize()
    harness.source.execute("INSERT INTO orders SELECT g, repeat('w', 200), 1, NULL FROM generate_series(2000, 30000) g")
    assert main(["cdc", "status", harness.source_name]) == 1
    assert "verdict: unhealthy" in capsys.readouterr().out
    _catalog(harness, {"orders": {}}, max_retained_wal_mb=1024)
    assert main(["cdc", "status", harness.source_name]) == 0
    assert "verdict: healthy" in capsys.readouterr().out
    slot = f"ingest_{harness.source_name}"
    harness.source.execute(  # another consumer acknowledges past the checkpoint: those changes are gone to us
        f"UPDATE orders SET note = 'lost' WHERE id = 1; SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    )
    assert main(["cdc", "status", harness.source_name]) == 1
    out = capsys.readouterr().out
    assert "streams orders hold log positions the slot was acknowledged past" in out
    assert f"ingest state reset {harness.source_name}.orders" in out
    assert main(["cdc", "drop-slot", harness.source_name]) == 0  # a dry run: the slot holds changes
    assert "dry run, nothing dropped: add --yes" in capsys.readouterr().out
    assert harness.query_source(f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'") == [(1,)]
    assert main(["cdc", "drop-slot", harness.source_name, "--yes"]) == 0
    assert "dropped: its WAL is released" in capsys.readouterr().out
    assert main(["cdc", "status", harness.source_name]) == 1
    out = capsys.readouterr().out
    assert "the next run stops (on_wal_gap: fail)" in out and f"ingest state reset {harness.source_name}.orders" in out


def test_the_sensor_evaluates_slot_health_without_a_run(cdc: StreamHarness) -> None:
    from ingestion_assets.defs.cdc import build_cdc_assets

    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}}, max_retained_wal_mb=1)
    harness.materialize()
    harness.source.execute("INSERT INTO orders SELECT g, repeat('w', 200), 1, NULL FROM generate_series(2000, 30000) g")
    sensor = build_cdc_assets(harness.settings, load_catalog(harness.settings.catalog_path))[1][0]
    sensor(dg.build_sensor_context(instance=harness.instance))
    check = dg.AssetCheckKey(harness.key("orders"), "slot_health")
    latest = harness.instance.event_log_storage.get_latest_asset_check_execution_by_key([check])[check]
    assert latest.event is not None and latest.event.asset_check_evaluation is not None
    assert latest.event.asset_check_evaluation.passed is False


HOSTILE = """
CREATE TABLE "Order Lines" ("Id" int PRIMARY KEY, t text, "select" int, "Mixed Case" text, "with space" text);
INSERT INTO "Order Lines" SELECT g, 't' || g, g, 'M' || g, 's ' || g FROM generate_series(1, 300) g;
"""


def test_hostile_identifiers_in_cdc_mode(cdc: StreamHarness) -> None:
    """A column named `t`, a keyword, mixed case and spaces, in the table name too: snapshot, changes,
    soft deletes (flagged in the target by key) and a key change."""
    harness = cdc
    harness.source.execute(HOSTILE)
    harness.write_catalog(
        {"lines": {"table": "Order Lines", "primary_key": "Id", "deletes": "soft"}}, mode="cdc", cdc=FAST
    )
    harness.materialize()
    harness.source.execute('UPDATE "Order Lines" SET t = NULL, "select" = -1 WHERE "Id" <= 10')
    harness.source.execute('DELETE FROM "Order Lines" WHERE "Id" BETWEEN 20 AND 25')
    harness.source.execute('UPDATE "Order Lines" SET "Id" = 1000 WHERE "Id" = 30')
    harness.materialize()
    names = target_names(load_catalog(harness.settings.catalog_path).destination)
    columns = [names.column(c) for c in ("Id", "t", "select", "Mixed Case", "with space")]
    live = harness.target_rows_where("lines", columns, names.column("Id"), "_ingest_deleted_at IS NULL")
    assert live == harness.source.rows('"Order Lines"', '"Id"')
    kept = harness.target_rows_where("lines", columns, names.column("Id"), "_ingest_deleted_at IS NOT NULL")
    assert [row[0] for row in kept] == [20, 21, 22, 23, 24, 25, 30] and kept[0][1] == "t20"


def test_a_new_destination_file_gets_a_full_copy_and_the_run_says_why(cdc: StreamHarness) -> None:
    import duckdb
    import yaml

    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}})
    harness.materialize()
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id <= 10")
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    moved = harness.tmp_path / "new_warehouse.duckdb"
    catalog["destination"]["path"] = str(moved)
    harness.catalog_path.write_text(yaml.safe_dump(catalog))
    result = harness.materialize()
    assert _metadata(result, harness, "orders")["mode"] == "snapshot"  # its only stream: a fresh snapshot
    logs = " ".join(e.user_message for e in harness.instance.all_logs(result.run_id))
    assert "copying its table again: its target changed" in logs and "new destination or file" in logs
    with duckdb.connect(str(moved), read_only=True) as con:
        target = con.execute(f'SELECT id, status FROM "{harness.source_name}".orders ORDER BY id').fetchall()
    assert target == [(i, s) for i, s, *_ in harness.source.rows("orders", "id")]


def test_a_permanent_error_fails_at_once_without_retries(cdc: StreamHarness) -> None:
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}, "missing": {}}, retries={"max_attempts": 3, "delay_seconds": 1})
    problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))  # no traceback
    assert any(f'table "{harness.source.schema}"."missing": does not exist' in p for p in problems)
    result = harness.materialize(raise_on_error=False)
    message = _failure(result)
    assert "missing" in message and "does not exist" in message
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert harness.query_source(
        f"SELECT count(*) FROM pg_publication WHERE pubname = 'ingest_{harness.source_name}'"
    ) == [(0,)]


@pytest.mark.slow
def test_a_target_the_log_emptied_is_not_copied_again(cdc: StreamHarness) -> None:
    """Hard deletes can leave a target legitimately empty: that is no sign of a target lost or replaced."""
    harness = cdc
    harness.source.execute("CREATE TABLE emptied (id int PRIMARY KEY, v text); INSERT INTO emptied VALUES (1, 'a')")
    _catalog(harness, {"emptied": {}})
    harness.materialize()
    harness.source.execute("INSERT INTO emptied VALUES (2, 'b'); DELETE FROM emptied")
    harness.materialize()
    assert harness.target_count("emptied") == 0
    harness.source.execute("INSERT INTO emptied VALUES (3, 'c')")
    after = _metadata(harness.materialize(), harness, "emptied")
    assert not after.get("copied") and after["rows read"] == 1  # the one change, not a copy
    _assert_exact(harness, "emptied")
    harness.execute_target(f'DELETE FROM "{harness.source_name}".emptied')  # emptied outside us: copied again
    again = _metadata(harness.materialize(), harness, "emptied")
    assert again.get("copied") or again["mode"] == "snapshot"  # its source's only stream: a new snapshot
    _assert_exact(harness, "emptied")


def test_a_key_change_keeps_the_rows_large_values(cdc: StreamHarness) -> None:
    """With the default replica identity a key change sends the old key tuple (NULL in every other column) and
    leaves an unchanged TOASTed value out of the new tuple: that value landed as NULL under the new key, rc 0,
    no dead letter (found by the CDC attack, PostgreSQL 15 and 18, live and history ranges)."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE toasted (id int PRIMARY KEY, v text, big text);"
        "INSERT INTO toasted SELECT g, 'v', (SELECT string_agg(md5(x::text || g), '') FROM generate_series(1, 200) x)"
        " FROM generate_series(1, 10) g;"
    )
    _catalog(harness, {"toasted": {}})
    harness.materialize()
    harness.source.execute(
        "UPDATE toasted SET id = 101 WHERE id = 2; UPDATE toasted SET id = 103, v = 'both' WHERE id = 3;"
        "UPDATE toasted SET id = 104 WHERE id = 4; UPDATE toasted SET id = 204 WHERE id = 104;"  # moved twice
    )
    harness.materialize()
    _assert_exact(harness, "toasted")
    lengths = harness.query_target(f'SELECT id, length(big) FROM "{harness.source_name}".toasted WHERE id > 100')
    assert sorted(lengths) == [(101, 6400), (103, 6400), (204, 6400)]


def _assert_partitioned_exact(harness: StreamHarness) -> None:
    columns = ["id", "region", "v"]
    target = harness.target_rows_where("measures", columns, "id, region", "_ingest_deleted_at IS NULL")
    assert target == harness.source.rows("measures", "id, region")


def _run_log(harness: StreamHarness, result: dg.ExecuteInProcessResult) -> str:
    return " ".join(e.user_message for e in harness.instance.all_logs(result.run_id))


@pytest.mark.parametrize(
    ("statement", "deletes"),
    [
        ("ALTER TABLE measures DETACH PARTITION measures_eu", "hard"),
        ("ALTER TABLE measures DETACH PARTITION measures_eu; DROP TABLE measures_eu", "soft"),
    ],
)
def test_rows_of_a_partition_detached_with_changes_still_in_the_log_are_retired(
    cdc: StreamHarness, statement: str, deletes: str
) -> None:
    """The copy after a DETACH (or a DROP) of a partition started at the source's lowest position (another
    stream's), so the detached rows the log changed after it got versions above the copy's floor and stayed
    live in the target, rc 0 (found by the CDC attack). The copy now starts after the log is caught up."""
    harness = cdc
    harness.source.execute(PARTITIONED + CUSTOMERS)
    streams = {"measures": {"primary_key": ["id", "region"], "deletes": deletes}, "customers": {}}
    _catalog(harness, streams)
    harness.materialize()
    harness.source.execute("UPDATE measures SET v = -v WHERE region = 'eu' AND id < 50")  # not applied yet
    harness.source.execute("UPDATE customers SET name = 'x' WHERE id < 5")
    harness.source.execute(statement)
    result = harness.materialize()
    assert f"partition(s) {harness.source.schema}.measures_eu detached or dropped" in _run_log(harness, result)
    _assert_partitioned_exact(harness)
    _assert_exact(harness, "customers")
    retired = "_ingest_deleted_at IS NOT NULL" if deletes == "soft" else "false"
    gone = harness.target_rows_where("measures", ["id", "region"], "id", retired)
    assert gone == ([(i, "eu") for i in range(2, 301, 2)] if deletes == "soft" else [])


def test_a_partition_attached_to_a_table_left_without_partitions_brings_its_rows(cdc: StreamHarness) -> None:
    """A partitioned table with no partition left stored no partition list in its checkpoint, so a partition
    attached later with rows was never noticed: its rows never arrived (rc 0)."""
    harness = cdc
    harness.source.execute(PARTITIONED)
    _catalog(harness, {"measures": {"primary_key": ["id", "region"]}})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE measures DETACH PARTITION measures_eu; ALTER TABLE measures DETACH PARTITION measures_us"
    )
    harness.materialize()
    _assert_partitioned_exact(harness)  # nothing left
    harness.source.execute(
        "UPDATE measures_eu SET v = 0 WHERE id < 10;"  # while detached: not in the log
        "ALTER TABLE measures ATTACH PARTITION measures_eu FOR VALUES IN ('eu');"
        "INSERT INTO measures VALUES (1001, 'eu', 1)"
    )
    result = harness.materialize()
    assert f"partition(s) {harness.source.schema}.measures_eu attached" in _run_log(harness, result)
    _assert_partitioned_exact(harness)
    assert len(harness.source.rows("measures", "id")) == 151


def test_a_truncate_of_one_partition_copies_the_table_again_and_retires_its_rows(cdc: StreamHarness) -> None:
    """PostgreSQL does not publish a TRUNCATE of one partition through the partitioned table, so the target
    kept that partition's rows for ever, rc 0. Each partition's relfilenode is now kept in the checkpoint: a
    new one copies the table again once the log is caught up (a TRUNCATE of the whole table it carries is
    still refused), and the rows the copy does not find retire."""
    harness = cdc
    harness.source.execute(PARTITIONED + CUSTOMERS)
    _catalog(harness, {"measures": {"primary_key": ["id", "region"], "deletes": "soft"}, "customers": {}})
    harness.materialize()
    harness.source.execute(
        "UPDATE measures SET v = -v WHERE id < 40;"  # in the log, not applied yet
        "TRUNCATE measures_eu; INSERT INTO measures VALUES (1000, 'eu', 7);"
        "UPDATE customers SET name = 'x' WHERE id < 5"
    )
    result = harness.materialize()
    said = f"partition(s) {harness.source.schema}.measures_eu rewritten or attached again"
    assert said in _run_log(harness, result)
    assert said in _metadata(result, harness, "measures")["copy reason"]
    _assert_partitioned_exact(harness)
    _assert_exact(harness, "customers")
    gone = harness.target_rows_where("measures", ["id", "region"], "id", "_ingest_deleted_at IS NOT NULL")
    assert gone == [(i, "eu") for i in range(2, 301, 2)]
    harness.source.execute("TRUNCATE measures")  # the whole table: the log carries it, and the stream refuses it
    assert "the source table was truncated" in _failure(harness.materialize(raise_on_error=False))


def test_a_partition_changed_while_detached_or_made_again_copies_the_table_again(cdc: StreamHarness) -> None:
    """Between two runs a partition was detached, changed and attached again, or dropped and made again under
    its name: the partition list was the same, the log carried none of it, and the target kept stale and
    deleted rows, rc 0 (found by the README-only attack). Each partition's pg_inherits row is now compared too."""
    harness = cdc
    harness.source.execute(PARTITIONED)
    _catalog(harness, {"measures": {"primary_key": ["id", "region"]}})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE measures DETACH PARTITION measures_eu;"
        "UPDATE measures_eu SET v = -1 WHERE id <= 100; DELETE FROM measures_eu WHERE id BETWEEN 101 AND 200;"
        "INSERT INTO measures_eu VALUES (7777, 'eu', 1);"
        "ALTER TABLE measures ATTACH PARTITION measures_eu FOR VALUES IN ('eu')"
    )
    result = harness.materialize()
    said = f"partition(s) {harness.source.schema}.measures_eu rewritten or attached again"
    assert said in _metadata(result, harness, "measures")["copy reason"]
    _assert_partitioned_exact(harness)
    harness.source.execute(
        "DROP TABLE measures_us; CREATE TABLE measures_us PARTITION OF measures FOR VALUES IN ('us');"
        "INSERT INTO measures VALUES (5050, 'us', 2)"
    )
    harness.materialize()
    _assert_partitioned_exact(harness)


def test_a_table_no_stream_reads_never_stays_published_without_a_key(cdc: StreamHarness) -> None:
    """A stream removed from the catalog kept its table in the product's publication while every run failed
    its checks (on a keyless table added meanwhile), and once the application dropped that table's key its
    UPDATEs failed while `ingest check` said ok (found by the README-only attack). A new stream's table that
    fails its checks now leaves only that stream out; a run takes unread tables out before its checks; and
    `ingest check` takes any member of the product's publication without a replica identity out."""
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS + "CREATE TABLE nokey (id int, v text)")
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    _catalog(harness, {"customers": {}, "nokey": {}})  # orders removed, a keyless table added
    harness.source.execute("UPDATE customers SET name = 'z' WHERE id < 9")
    result = harness.materialize()  # nokey is left out, customers goes on
    assert "left out of this run" in (paused := _metadata(result, harness, "nokey")["paused"])
    assert "\"nokey\": has no primary key" in paused
    statuses = stream_statuses(harness.settings, load_catalog(harness.settings.catalog_path), harness.instance)
    (nokey,) = [s for s in statuses if s.stream.endswith(".nokey")]
    assert nokey.status == "paused" and nokey.detail == paused  # `ingest status`: needs attention, and why
    _assert_exact(harness, "customers")
    publication = f"ingest_{harness.source_name}"
    members = f"SELECT tablename::text FROM pg_publication_tables WHERE pubname = '{publication}' ORDER BY 1"
    assert harness.query_source(members) == [("customers",)]
    # A run its checks refuse (a streamed table gone) still takes the tables no stream reads out first.
    harness.source.execute(f'ALTER PUBLICATION "{publication}" ADD TABLE orders; DROP TABLE customers')
    assert "does not exist" in _failure(harness.materialize(raise_on_error=False))
    assert harness.query_source(members) == []
    # A member no stream reads, put back by hand, loses its key: `ingest check` takes it out at once.
    harness.source.execute(f'ALTER PUBLICATION "{publication}" ADD TABLE orders')
    harness.source.execute("ALTER TABLE orders DROP CONSTRAINT orders_pkey")
    with pytest.raises(psycopg2.Error, match="does not have a replica identity"):
        harness.source.execute("UPDATE orders SET status = 'x' WHERE id = 1")
    problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    said = [p for p in problems if f"{harness.source.schema}.orders" in p]
    assert len(said) == 1 and "which no stream reads any more" in said[0] and "taken out at once" in said[0]
    harness.source.execute("UPDATE orders SET status = 'x' WHERE id = 1")
    assert harness.query_source(members) == []


def test_a_table_whose_key_the_application_drops_leaves_the_publication_and_only_its_stream_pauses(
    cdc: StreamHarness,
) -> None:
    """Dropping the primary key of a published table makes PostgreSQL reject the application's own UPDATE and
    DELETE on it (an outage our publication causes); the run then failed saying the table "was not published"
    (false) and stopped every stream. Now `ingest check` and each run take it out of the product's publication
    at once, the stream pauses saying what to do, the others go on, and a key restored brings a new copy."""
    harness = cdc
    harness.source.execute(CUSTOMERS + ORDERS)
    _catalog(harness, {"customers": {}, "orders": {}})
    harness.materialize()
    harness.source.execute("UPDATE orders SET status = 'seen' WHERE id <= 10")  # in the log, not applied yet
    harness.source.execute("ALTER TABLE orders DROP CONSTRAINT orders_pkey")
    with pytest.raises(psycopg2.Error, match="does not have a replica identity"):
        harness.source.execute("UPDATE orders SET status = 'x' WHERE id = 1")
    table = f"{harness.source.schema}.orders"
    problems = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    said = [p for p in problems if table in p]
    assert len(said) == 1 and f"stream {harness.source_name}.orders" in said[0]
    assert "taken out of the product's publication" in said[0] and "REPLICA IDENTITY FULL" in said[0]
    harness.source.execute("UPDATE orders SET status = 'paid' WHERE id <= 3; DELETE FROM orders WHERE id = 4")
    harness.source.execute("UPDATE customers SET name = 'y' WHERE id = 3")
    result = harness.materialize()  # the run pauses the stream and the other goes on
    paused = _metadata(result, harness, "orders")["paused"]
    assert f"stream {harness.source_name}.orders is paused: table {table} has no primary key" in paused
    fix = f'ALTER TABLE "{harness.source.schema}"."orders" REPLICA IDENTITY FULL'
    assert fix in paused and paused in _run_log(harness, result)
    assert "paused" not in _metadata(result, harness, "customers")
    _assert_exact(harness, "customers")
    # A key dropped with no `ingest check` after it: the run takes the table out itself.
    harness.source.execute("UPDATE orders SET status = 'again' WHERE id = 5")
    harness.source.execute("ALTER TABLE customers DROP CONSTRAINT customers_pkey")
    result = harness.materialize()
    assert "paused" in _metadata(result, harness, "customers")
    assert "paused" in _metadata(result, harness, "orders")  # still without a key: still paused, no failure
    harness.source.execute("UPDATE customers SET name = 'z' WHERE id = 1; DELETE FROM customers WHERE id = 2")
    harness.source.execute(  # FULL alone is no key: a unique index on the stream's key makes it one (test_cdc_keys)
        "ALTER TABLE orders ADD PRIMARY KEY (id); ALTER TABLE customers REPLICA IDENTITY FULL;"
        "ALTER TABLE customers ALTER COLUMN id SET NOT NULL; CREATE UNIQUE INDEX ON customers (id)"
    )
    result = harness.materialize()
    assert _metadata(result, harness, "orders")["copied"] is True
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")


def test_cdc_status_takes_a_table_without_a_key_out_of_the_publication_between_runs(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outage a dropped key causes lasts until the product looks: `ingest cdc status` (and the sensor)
    look between runs."""
    harness = cdc
    harness.source.execute(ORDERS)
    _catalog(harness, {"orders": {}})
    harness.materialize()
    harness.source.execute("ALTER TABLE orders DROP CONSTRAINT orders_pkey")
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["cdc", "status", harness.source_name]) == 1
    out = capsys.readouterr().out
    assert f"stream {harness.source_name}.orders is paused: table {harness.source.schema}.orders" in out
    assert "verdict: unhealthy" in out
    harness.source.execute("UPDATE orders SET status = 'x' WHERE id = 1")  # the application works again
    assert main(["cdc", "status", harness.source_name]) == 0  # out of the publication: nothing more to do now


def test_generated_columns_keep_their_values_when_rows_change_through_the_log(cdc: StreamHarness) -> None:
    """Found by the README-only attack: pgoutput leaves generated columns out of every change, and rows changed
    through the log landed with NULL there (rc 0, nothing said); the copy had them right."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE gen (id int PRIMARY KEY, x int, big text,"
        " g int GENERATED ALWAYS AS (x * 2) STORED, gv int GENERATED ALWAYS AS (x * 3) VIRTUAL);"
        "INSERT INTO gen (id, x, big) SELECT i, i, repeat(md5(i::text), 300) FROM generate_series(1, 5) i"
    )
    _catalog(harness, {"gen": {"deletes": "soft"}})
    harness.materialize()
    harness.source.execute(
        "UPDATE gen SET x = x + 100 WHERE id <= 2; INSERT INTO gen (id, x) VALUES (6, 6);"
        "UPDATE gen SET x = 40 WHERE id = 4; UPDATE gen SET x = 41 WHERE id = 4; DELETE FROM gen WHERE id = 5"
    )
    harness.materialize()
    _assert_exact(harness, "gen")
    target = harness.target_rows_where("gen", ["id", "g", "gv"], "id", "_ingest_deleted_at IS NULL")
    assert target == [(1, 202, 303), (2, 204, 306), (3, 6, 9), (4, 82, 123), (6, 12, 18)]


def test_a_transaction_that_alters_a_table_between_its_changes_is_applied(cdc: StreamHarness) -> None:
    """Found by the README-only attack: changes of one transaction were matched with the table's last Relation
    message at commit, so an ADD COLUMN, an UPDATE, a DROP COLUMN and an INSERT in one transaction failed every
    run ("a row of tadd has 3 values for 2 columns"), holding the whole source and its WAL for good."""
    harness = cdc
    harness.source.execute(
        "CREATE TABLE tadd (id int PRIMARY KEY, v int); INSERT INTO tadd SELECT g, g FROM generate_series(1, 10) g;"
        "CREATE TABLE other (id int PRIMARY KEY, v int); INSERT INTO other VALUES (1, 1)"
    )
    _catalog(harness, {"tadd": {}, "other": {}})
    harness.materialize()
    harness.source.execute(  # one transaction: the two ALTERs send a Relation message each between the changes
        "ALTER TABLE tadd ADD COLUMN w int NOT NULL DEFAULT 42; UPDATE tadd SET v = -1 WHERE id = 1;"
        "ALTER TABLE tadd DROP COLUMN v; INSERT INTO tadd VALUES (11, 11); UPDATE other SET v = 2"
    )
    _drain(harness)
    _assert_exact(harness, "tadd")
    _assert_exact(harness, "other")


@pytest.mark.parametrize("column", ["note", "id"])
def test_a_column_renamed_and_renamed_back_between_runs_copies_the_stream_again(
    cdc: StreamHarness, column: str
) -> None:
    """Changes the log wrote while a column had another name carry no value under its name: applied, they loaded
    NULL there (the key: a NOT NULL failure that blocked every stream of the source). The stream is copied again
    instead, and the source's other streams go on (found by a README-only attack)."""
    harness = cdc
    harness.source.execute(ORDERS + CUSTOMERS)
    _catalog(harness, {"orders": {}, "customers": {}})
    harness.materialize()
    key, note = ("renamed", "note") if column == "id" else ("id", "renamed")  # the names while renamed
    harness.source.execute(
        f"ALTER TABLE orders RENAME COLUMN {column} TO renamed;"
        f"UPDATE orders SET {note} = 'while renamed', status = 'x' WHERE {key} BETWEEN 200 AND 204;"
        f"INSERT INTO orders ({key}, status, {note}) VALUES (5000, 'new', 'inserted while renamed');"
        f"DELETE FROM orders WHERE {key} = 7;"
        f"ALTER TABLE orders RENAME COLUMN renamed TO {column};"
        "UPDATE customers SET name = 'changed' WHERE id <= 10"
    )
    assert harness.materialize().success
    _assert_exact(harness, "customers")  # the other stream goes on
    _drain(harness)
    _assert_exact(harness, "orders")


def test_a_column_dropped_and_added_again_between_runs_copies_the_stream_again(cdc: StreamHarness) -> None:
    """Same name, same type, no change logged in between: the log shows nothing, and the target kept every row's
    old value where the source now holds NULL (found by a README-only attack). The column's new number shows it."""
    harness = cdc
    harness.source.execute(ORDERS + CUSTOMERS)
    _catalog(harness, {"orders": {}, "customers": {}})
    harness.materialize()
    harness.source.execute(
        "ALTER TABLE orders DROP COLUMN note; ALTER TABLE orders ADD COLUMN note text;"
        "UPDATE orders SET note = 'new' WHERE id = 1; UPDATE customers SET name = 'changed' WHERE id <= 3"
    )
    assert harness.materialize().success
    _drain(harness)
    _assert_exact(harness, "orders")
    _assert_exact(harness, "customers")
