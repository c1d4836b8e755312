"""`ingest status` against a real stack: a CDC source whose slot hoards WAL needs attention (exit 1, named),
and `--json` gives scripts the same figures."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
from collections.abc import Iterator

import dagster as dg
import pytest
import yaml

from ingestion_assets.cli import main
from ingestion_assets.definitions import defs
from ingestion_assets.observe.freshness import encode, merged, percentiles, record
from ingestion_assets.sources.postgres.cdc import drop_slot
from ingestion_assets.sync import FAULT_ENV
from ingestion_assets_tests.destination_targets import MariaDb, mariadb, use_destination
from ingestion_assets_tests.helpers import StreamHarness

__all__ = ["mariadb"]


@pytest.fixture
def cdc(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamHarness]:
    harness.source.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO orders SELECT g, 'n', now() FROM generate_series(1, 200) g;"
    )
    harness.write_catalog(
        {"orders": {"table": "orders", "primary_key": "id"}},
        mode="cdc",
        cdc={"max_retained_wal_mb": 1, "max_seconds": 2, "retries": {"max_attempts": 1}},
    )
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    try:
        yield harness
    finally:
        drop_slot(harness.source.url, f"ingest_{harness.source_name}")  # a slot left behind hoards WAL
        harness.source.execute(f"DROP PUBLICATION IF EXISTS ingest_{harness.source_name}")


def test_status_names_a_lagging_cdc_source_and_exits_non_zero(
    cdc: StreamHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = cdc
    stream = f"{harness.source_name}.orders"
    assert main(["status"]) == 1  # never synced
    out, err = capsys.readouterr()
    assert f"{stream}: never synced" in err
    head, line, beneath = out.splitlines()[:3]  # the slot's problem is cut in its column, whole beneath
    fresh = head.index("p50/p99")
    assert line[fresh - 1] == " " and line[fresh:].split()[0] == "-" and "…" in line[:fresh]
    source = harness.source_name
    assert beneath.strip() == f"slot: no slot ingest_{source} (`ingest cdc status {source}` says what a run does)"
    assert main(["status", "--json"]) == 1
    (line,) = json.loads(capsys.readouterr().out)  # the whole sentence, naming no function of ours
    source = harness.source_name
    assert line["lag"] == f"slot: no slot ingest_{source} (`ingest cdc status {source}` says what a run does)"

    harness.materialize()  # the snapshot: the slot exists and the target holds 200 rows
    assert main(["status", "--json"]) == 0
    (line,) = json.loads(capsys.readouterr().out)
    assert line["stream"] == stream and line["status"] == "ok" and line["rows_in_target"] == 200
    assert line["failed_checks"] == [] and line["dead_letters"] == 0

    harness.source.execute(  # over 1 MB of WAL the slot must keep until the source runs again
        "INSERT INTO orders SELECT g, repeat(md5(g::text), 20), now() FROM generate_series(1000, 4000) g"
    )
    assert main(["status"]) == 1
    captured = capsys.readouterr()
    assert stream in captured.out and "lagging" in captured.out
    assert f"{stream}: lagging: the slot retains" in captured.err

    harness.materialize()  # applies the changes: each one's commit-to-target latency lands in the histogram
    event = harness.instance.get_latest_materialization_event(harness.key("orders"))
    metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
    assert isinstance(metadata["seconds"].value, float) and metadata["seconds"].value > 0  # CDC runs say it too
    main(["status", "--json"])
    (line,) = json.loads(capsys.readouterr().out)
    assert line["rows_in_target"] == 200 + 3001 and set(line["freshness"]) == {"p50", "p95", "p99"}
    assert 0 < line["freshness"]["p50"] <= line["freshness"]["p99"] < 600_000

    cdc_spec = {"table": "orders", "primary_key": "id", "freshness": {"max_lag": "1h"}}
    harness.write_catalog({"orders": cdc_spec}, mode="cdc", cdc={"max_retained_wal_mb": 1, "max_seconds": 2})
    definitions = defs()  # the source's job: its slot, then the freshness check of its streams (a check of its own)
    assert definitions.resolve_asset_graph().get(harness.key("orders")).freshness_policy is not None
    result = definitions.resolve_job_def(f"{harness.source_name}__job").execute_in_process(instance=harness.instance)
    (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "freshness"]
    assert check.passed and check.metadata["seconds since the last sync"].value < 600


def test_freshness_histograms_of_runs_merge_exactly() -> None:
    fast, slow = record([10.0] * 98), record([5000.0, 9000.0])
    together = merged([encode(fast), encode(slow)])
    assert together.get_total_count() == 100
    assert percentiles(together)["p50"] == 10 and 4990 <= percentiles(together)["p99"] <= 5010
    assert percentiles(merged([encode(fast)])) == {"p50": 10, "p95": 10, "p99": 10}  # p99 of one run survives


def test_partitions_plan_says_when_nothing_is_partitioned(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute("CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["partitions", "plan"]) == 0
    assert "nothing to plan: the catalog has no key-partitioned stream" in capsys.readouterr().out


@pytest.mark.slow  # two `dagster asset materialize` processes: about a minute here
def test_ingest_refresh_ends_with_the_generation_and_the_rows(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, now() FROM generate_series(1, 321) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    assert main(["refresh", f"{harness.source_name}.items"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"{harness.source_name}.items: generation 2 swapped in, the target holds 321 rows")
    assert "dlt" not in out.lower().replace("(log:", "")  # dlt's own lines stay in the log file


def test_status_blames_only_the_stream_that_failed_in_a_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the files and lakes attack: one stream failing in a run of two marked both `failed`."""
    harness.source.execute(
        "CREATE TABLE good (id int PRIMARY KEY, v text); INSERT INTO good VALUES (1, 'a'), (2, 'b');"
        "CREATE TABLE bad (id int PRIMARY KEY, v text); INSERT INTO bad VALUES (1, 'a');"
    )
    spec = {"primary_key": "id"}
    harness.write_catalog({"good": {"table": "good", **spec}, "bad": {"table": "bad", **spec}})
    harness.source.execute("DROP TABLE bad")  # its step fails; the other's succeeds in the same run
    assert not harness.materialize(raise_on_error=False).success
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["status", "--json"]) == 1
    lines = {line["stream"].rsplit(".", 1)[1]: line for line in json.loads(capsys.readouterr().out)}
    assert lines["good"]["status"] == "ok" and lines["good"]["rows_in_target"] == 2
    assert lines["bad"]["status"] == "failed"
    # the reason, not Dagster's "Steps failed: [...]": the first line of the step's error
    assert "Steps failed" not in lines["bad"]["detail"], lines["bad"]
    assert "does not exist" in lines["bad"]["detail"] and "\n" not in lines["bad"]["detail"], lines["bad"]
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert f"{harness.source_name}.bad: failed: run " in err and "does not exist" in err, err


def test_status_counts_partitions_and_names_the_failed_ones(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backfill whose one chunk failed looked `ok` (its stream's latest materialization succeeded), and
    chunks never run were not shown: status counts materialized, failed, running and missing partitions."""
    start = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=3)
    harness.source.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, updated_at timestamptz NOT NULL);"
        f"INSERT INTO orders SELECT g, timestamptz '{start.isoformat()}' + g * interval '1 hour' "
        "FROM generate_series(1, 90) g"
    )
    partitions = {"by": "time", "column": "updated_at", "start": start.isoformat()}
    spec = {"table": "orders", "primary_key": "id", "cursor": "updated_at", "partitions": partitions}
    harness.write_catalog({"orders": {**spec, "retries": {"max_attempts": 1}}})
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range(4)]
    harness.source.execute("ALTER TABLE orders RENAME TO orders_away")
    assert not harness.materialize(partition=days[1], raise_on_error=False).success
    harness.source.execute("ALTER TABLE orders_away RENAME TO orders")
    assert harness.materialize(partition=days[0]).success  # the newest materialization: a success
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["status", "--json"]) == 1
    line = json.loads(capsys.readouterr().out)[0]
    assert line["status"] == "failed" and f"partition {days[1]} failed" in line["detail"], line
    summary = line["partition_summary"]
    never = days[2:]
    assert summary == {
        "total": 4,
        "materialized": 1,
        "failed": [days[1]],
        "running": [],
        "missing": 2,
        "never_run": never,
    }, summary
    assert main(["status"]) == 1
    out, err = capsys.readouterr()
    assert "4 partitions: 1 materialized, 1 failed, 0 running, 2 never run" in out, out
    assert f"failed: {days[1]}" in out and f"partition {days[1]} failed" in err, (out, err)



def test_status_fails_a_partition_run_whose_process_died_also_with_dagster_home_unset(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: a partition run killed with its process (in-process executor, SIGKILL)
    stays STARTED in Dagster. `ingest status` fails such runs before it reports, but only when DAGSTER_HOME was
    set: with it unset (which the README allows) the stream and its partition stayed `running` for ever."""
    harness.source.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL);"
        "INSERT INTO orders SELECT g, now() FROM generate_series(1, 6000) g;"
    )
    partitions = {"by": "key", "chunk": 5000}
    spec = {"table": "orders", "primary_key": "id", "cursor": "updated_at", "slice_rows": 1000}
    path = harness.write_catalog({"orders": {**spec, "partitions": partitions, "retries": {"max_attempts": 1}}})
    in_process = {"execution": {"executor": "in_process"}}  # the kill takes the run's own process with the step
    path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | in_process))
    harness.plan_partitions("orders")
    killed = harness.materialize_cli("orders", "--partition", "0-4999", **{FAULT_ENV: "after_checkpoint:1:kill"})
    assert killed.wait(timeout=180) == -signal.SIGKILL
    (run,) = harness.instance.get_runs(limit=1)
    assert run.status == dg.DagsterRunStatus.STARTED  # what Dagster leaves behind
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAGSTER_HOME")
    assert main(["status", "--json"]) == 1
    line = json.loads(capsys.readouterr().out)[0]
    assert line["status"] == "failed" and "partition 0-4999 failed" in line["detail"], line
    assert line["partition_summary"]["running"] == [] and line["partition_summary"]["failed"] == ["0-4999"], line
    after = harness.instance.get_run_by_id(run.run_id)
    assert after is not None and after.status == dg.DagsterRunStatus.FAILURE


def _point_destination_at(harness: StreamHarness, destination: dict[str, str]) -> None:
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    catalog["destination"] = destination
    harness.catalog_path.write_text(yaml.safe_dump(catalog))


def test_status_counts_the_target_not_the_last_runs_metadata(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: status took the rows in target from the last run's metadata, so a catalog
    pointed at a new, empty warehouse (or a table emptied outside us) still showed the rows as there."""
    harness.source.execute("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 30)")
    harness.write_catalog({"items": {"table": "items", "primary_key": "id"}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    harness.execute_target(f'DELETE FROM "{harness.source_name}".items WHERE id > 20')
    assert main(["status", "--json"]) == 1
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["rows_after_last_run"]) == ("target short", 20, 30)
    stream = f"{harness.source_name}.items"
    assert f"the target table {stream} holds 20 rows, but the last run left 30 in it" in line["detail"]

    _point_destination_at(harness, {"type": "duckdb", "path": str(harness.tmp_path / "new.duckdb")})
    assert main(["status"]) == 1
    out, err = capsys.readouterr()
    assert "no table (run: 30)" in out and f"{stream}: target short: the target table {stream} does not exist" in err

    _point_destination_at(harness, {"type": "postgres", "credentials": {"env": "UNREACHABLE_WAREHOUSE_URL"}})
    monkeypatch.setenv("UNREACHABLE_WAREHOUSE_URL", "postgresql://ingest:secret@127.0.0.1:9/warehouse")
    assert main(["status"]) == 0  # the rows cannot be told: said, not taken for a problem
    out, err = capsys.readouterr()
    (said,) = [line for line in err.splitlines() if "not counted" in line]
    assert said.startswith("rows in target not counted: destination.credentials (postgres:env:UNREACHABLE_WAREHOUSE")
    assert "Connection refused" in said and "secret" not in out + err


@pytest.mark.parametrize("kind", ["duckdb", "postgres", "mariadb", "delta", "iceberg", "parquet"])
def test_status_counts_every_destination_kind_and_calls_a_removed_table_short(
    harness: StreamHarness,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """Found by the README-only attack: on an Iceberg lake (and plain Parquet) status showed every stream `ok`
    with `no table`, also once the table's folder was removed: the lake's rows were read as Delta only."""
    harness.source.execute("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 30)")
    disposition = "append" if kind == "parquet" else "merge"  # plain Parquet cannot merge on a key
    items = {"table": "items", "primary_key": "id", "write_disposition": disposition}
    harness.write_catalog({"items": items}, destination="postgres" if kind == "postgres" else "duckdb")
    lake = harness.tmp_path / "lake"
    if kind == "mariadb":
        maria: MariaDb = request.getfixturevalue("mariadb")
        use_destination(harness, maria.destination())
        maria.datasets.append(harness.source_name)
    elif kind in ("delta", "iceberg", "parquet"):
        use_destination(harness, {"type": "filesystem", "bucket_url": str(lake), "table_format": kind})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    assert main(["status", "--json"]) == 0
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["rows_after_last_run"]) == ("ok", 30, 30), line

    stream = f"{harness.source_name}.items"
    if kind == "mariadb":
        maria.query(f"DROP TABLE `{harness.source_name}`.`items`")
    elif kind in ("duckdb", "postgres"):
        harness.execute_target(f'DROP TABLE "{harness.source_name}".items')
    else:
        shutil.rmtree(lake / harness.source_name / "items")
    assert main(["status", "--json"]) == 1
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["rows_after_last_run"]) == ("target short", None, 30), line
    assert f"the target table {stream} does not exist, but the last run left 30 in it" in line["detail"]


def test_rows_ingest_reconcile_deleted_are_not_taken_for_rows_removed_outside_ingest(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: right after `ingest reconcile --apply-deletes` removed the rows the source had
    deleted, status said `target short ... rows removed outside ingest ...: ingest refresh`, for our own deletions."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, ts timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' FROM generate_series(1, 30) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "ts"}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    harness.source.execute("DELETE FROM items WHERE id > 26")
    stream = f"{harness.source_name}.items"
    assert main(["reconcile", stream, "--apply-deletes"]) == 0
    assert "4 deleted" in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["rows_after_last_run"]) == ("ok", 26, 26), line
    result = harness.materialize()  # nor does the next run compare the whole table for them
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    assert check.passed and "why the whole table" not in check.metadata, check.metadata

    harness.execute_target(f'DELETE FROM "{harness.source_name}".items WHERE id > 20')  # by hand: still told
    assert main(["status", "--json"]) == 1
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["rows_after_last_run"]) == ("target short", 20, 26), line
    assert f"the target table {stream} holds 20 rows, but the last run left 26 in it" in line["detail"]


def test_a_stopped_refresh_leaves_the_live_tables_position_shown_and_says_how_far_it_read(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: after a killed `ingest refresh`, the position column showed the refresh's
    partial position (its shadow table's), not that of the table readers query."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, ts timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' FROM generate_series(1, 300) g"
    )
    spec = {"table": "items", "primary_key": "id", "cursor": "ts", "slice_rows": 100, "retries": {"max_attempts": 1}}
    harness.write_catalog({"items": spec})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    live = {"ts": "2024-01-01T00:05:00+00:00", "id": "300"}
    assert main(["refresh", f"{harness.source_name}.items", "--later"]) == 0
    monkeypatch.setenv(FAULT_ENV, "after_checkpoint:0")  # the refresh stops after its first slice
    assert not harness.materialize(raise_on_error=False).success
    monkeypatch.delenv(FAULT_ENV)
    capsys.readouterr()
    main(["status", "--json"])
    (line,) = json.loads(capsys.readouterr().out)
    assert line["position"] == live, line
    assert line["refresh"] == (
        "refresh to generation 2 (remove) stopped (the next run goes on with it), read up to "
        '{"id": "100", "ts": "2024-01-01T00:01:40+00:00"}'
    ), line
    main(["status"])
    out = capsys.readouterr().out
    assert json.dumps(line["position"]) in out and "refresh to generation 2 (remove) stopped" in out, out

    harness.materialize()  # the refresh completes: its position is the live one
    main(["status", "--json"])
    (line,) = json.loads(capsys.readouterr().out)
    assert line["position"] == live and line["refresh"] is None, line


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_rows_in_target_are_the_live_rows_and_soft_deleted_ones_are_told_apart(
    harness: StreamHarness, destination: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: the rows in target counted soft-deleted rows (10,501 shown, 9,998 live)."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, ts timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' FROM generate_series(1, 30) g"
    )
    spec = {"table": "items", "primary_key": "id", "cursor": "ts"}
    harness.write_catalog({"items": {**spec, "reconcile": {"full_every_seconds": 0, "deletes": "soft"}}}, destination)
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    harness.materialize()
    harness.source.execute("DELETE FROM items WHERE id IN (3, 4, 5)")
    harness.materialize()  # the full comparison marks the three rows deleted
    assert harness.target_count("items") == 30
    assert main(["status", "--json"]) == 0
    (line,) = json.loads(capsys.readouterr().out)
    assert (line["status"], line["rows_in_target"], line["soft_deleted_in_target"]) == ("ok", 27, 3), line
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert " 27  " in out and "(run:" not in out and "and 3 soft-deleted row(s) kept in the target" in out, out


def test_status_of_a_cdc_stream_a_run_wrote_without_selecting_it_compares_with_that_run(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a README-only attack: a CDC run applies every stream's changes, but materializes only the selected
    ones; status compared the others' target with their last materialization's count: deletes the log applied read
    as `target short` (exit 1, a refresh advised), and rows then removed from the target by hand went unreported."""
    harness.source.execute(
        "CREATE TABLE qa (id int PRIMARY KEY, v text); CREATE TABLE qb (id int PRIMARY KEY, v text);"
        "INSERT INTO qa SELECT g, 'a' FROM generate_series(1, 100) g;"
        "INSERT INTO qb SELECT g, 'b' FROM generate_series(1, 100) g;"
    )
    streams = {"qa": {"table": "qa", "primary_key": "id"}, "qb": {"table": "qb", "primary_key": "id"}}
    harness.write_catalog(streams, mode="cdc", cdc={"max_seconds": 2, "retries": {"max_attempts": 1}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    try:
        harness.materialize()
        harness.source.execute("DELETE FROM qb WHERE id <= 40; INSERT INTO qa VALUES (1000, 'x')")
        harness.materialize("qa")  # applies qb's deletes too, without materializing qb
        assert harness.target_count("qb") == 60
        assert main(["status", "--json"]) == 0  # the log's deletes are no loss
        lines = {str(line["stream"]).split(".")[-1]: line for line in json.loads(capsys.readouterr().out)}
        assert (lines["qb"]["status"], lines["qb"]["rows_in_target"], lines["qb"]["rows_after_last_run"]) == (
            "ok",
            60,
            60,
        )

        harness.source.execute("INSERT INTO qa SELECT g, 'more' FROM generate_series(2000, 2300) g")
        harness.materialize("qb")  # qa's 301 new rows land, qa is not materialized
        harness.execute_target(f'DELETE FROM "{harness.source_name}".qa WHERE id >= 2000 AND id < 2200')
        assert main(["status", "--json"]) == 1
        lines = {str(line["stream"]).split(".")[-1]: line for line in json.loads(capsys.readouterr().out)}
        qa = lines["qa"]
        assert (qa["status"], qa["rows_in_target"], qa["rows_after_last_run"]) == ("target short", 202, 402)
        assert f"{harness.source_name}.qa holds 202 rows, but the last run left 402 in it" in str(qa["detail"])
        assert lines["qb"]["status"] == "ok"
    finally:
        drop_slot(harness.source.url, f"ingest_{harness.source_name}")
        harness.source.execute(f"DROP PUBLICATION IF EXISTS ingest_{harness.source_name}")


def test_a_stream_with_a_position_but_nothing_loaded_reads_not_loaded_not_ok(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a README-only attack: key ranges planned (`ingest partitions plan`) and none run read `ok` with
    `no table` and last run `never`. Nothing is lost (exit 0), but nothing is loaded either: said so."""
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO items SELECT generate_series(1, 30)"
    )
    spec = {"table": "items", "primary_key": "id", "cursor": "updated_at", "partitions": {"by": "key", "chunk": 10}}
    harness.write_catalog({"items": spec})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    first, *_ = harness.plan_partitions("items")
    assert main(["status"]) == 0
    out, err = capsys.readouterr()
    (line,) = [each for each in out.splitlines() if each.startswith(f"{harness.source_name}.items")]
    assert line.split()[1:5] == ["not", "loaded", "no", "table"] and "need attention" not in err
    assert main(["status", "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)
    assert said["status"] == "not loaded" and said["detail"].startswith("nothing loaded yet: its partitions are planned")

    # One range run, two never run: `ok` said it was all loaded (a README-only attack: a range planned later held
    # rows with a cursor older than `live`'s position, which nothing ran). No error, but not ok either.
    harness.materialize(partition=first)
    assert main(["status", "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)
    loaded = harness.query_target(f'SELECT count(*) FROM "{harness.source_name}".items')[0][0]
    assert (said["status"], said["rows_in_target"]) == ("partly loaded", loaded) and loaded > 0
    assert said["detail"].startswith("3 partition(s) never run (10-19, 20-29, 30-39): rows only they hold are not")
    assert main(["status"]) == 0
    out, err = capsys.readouterr()
    assert "--partition 10-19`, and so on" in out and "need attention" not in err
    harness.materialize(partition_range=("10-19", "30-39"))
    assert main(["status", "--json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)
    assert said["status"] == "ok", said


def test_an_age_a_little_ahead_of_this_clock_reads_zero_not_negative() -> None:
    from ingestion_assets.observe.status import age_text

    assert [age_text(s) for s in (-0.4, -1.6, 0, 59, 61, 7200)] == ["0s", "0s", "0s", "59s", "1m", "2h"]
