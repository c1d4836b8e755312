"""The `ingest` command against a real instance: state show/reset, check, up/env/down."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ingestion_assets.cli import main
from ingestion_assets_tests.helpers import StreamHarness

ITEMS = """
CREATE TABLE items (id int PRIMARY KEY, name text, updated_at timestamptz NOT NULL);
INSERT INTO items SELECT g, 'item' || g, timestamptz '2024-06-01 00:00:00+00' + g * interval '1 minute'
FROM generate_series(1, 1200) g;
"""


@pytest.fixture
def cli_env(harness: StreamHarness, monkeypatch: pytest.MonkeyPatch) -> StreamHarness:
    harness.source.execute(ITEMS)
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 500}})
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    return harness


def test_state_show_and_reset(cli_env: StreamHarness, capsys: pytest.CaptureFixture[str]) -> None:
    harness = cli_env
    stream = f"{harness.source_name}.items"
    assert main(["state", "show", stream]) == 0
    assert "never" in capsys.readouterr().out

    harness.materialize()
    assert main(["state", "show"]) == 0
    shown = capsys.readouterr().out
    assert stream in shown and '"id": "1200"' in shown and "2024-06-01T20:00:00+00:00" in shown

    assert main(["state", "reset", stream]) == 0
    capsys.readouterr()
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None and checkpoint.position is None and checkpoint.details["reset"] is True

    harness.source.execute(
        "UPDATE items SET name = 'renamed' WHERE id = 5"
    )  # cursor untouched: only a re-read finds it
    result = harness.materialize()
    materialization = result.asset_materializations_for_node(f"{harness.source_name}__items")[0]
    assert materialization.metadata["rows read"].value == 1200  # re-read from the start
    harness.assert_target_equals_source("items", "items", "id")


def test_state_reset_of_an_unknown_stream_lists_the_known_ones(cli_env: StreamHarness) -> None:
    with pytest.raises(SystemExit, match=f"{cli_env.source_name}.items"):
        main(["state", "reset", "nope.items"])


def test_check_reports_what_would_fail_mid_sync(
    cli_env: StreamHarness, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["check"]) == 0
    assert "ok: 1 stream(s)" in capsys.readouterr().out

    cli_env.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "changed_at"}})
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert f"stream {cli_env.source_name}.items: cursor column(s) ['changed_at'] not in" in out

    cli_env.write_catalog({"items": {"table": "items", "primary_key": "id"}})
    (tmp_path / "source_url").write_text("postgresql://nobody:s3cret-pass@127.0.0.1:1/nowhere")
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert "cannot connect" in out and "file:" in out and "s3cret-pass" not in out


def test_check_runs_the_real_read_and_the_target_names(
    cli_env: StreamHarness, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The catalog and the columns are fine, but the server refuses the read itself, or two columns would land
    under one target name: `ingest check` says so before any sync."""
    role = f"r_{cli_env.source_name}"
    cli_env.source.execute(
        f'CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA "{cli_env.source.schema}" TO {role};'
        'ALTER TABLE items ADD COLUMN "Name" text'
    )
    try:
        (tmp_path / "source_url").write_text(cli_env.source.url.replace("postgres@", f"{role}@"))
        assert main(["check"]) == 1
        out = capsys.readouterr().out
        assert f"stream {cli_env.source_name}.items: its read fails on the server: permission denied" in out
        assert "source columns 'name' and 'Name' both land as column 'name'" in out
    finally:
        cli_env.source.execute(f'REVOKE ALL ON SCHEMA "{cli_env.source.schema}" FROM {role}; DROP ROLE {role}')


def test_a_dagster_home_other_than_ingest_homes_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dagster` commands use DAGSTER_HOME, `ingest` INGEST_HOME's instance: when they differ, the `ingest`
    commands that read or change state refuse (they read the other instance: "never synced" after good
    runs) and start nothing; `ingest env` says what to set."""
    # the server's system user must reach its folder: not under pytest's root, which another session may lock
    home, elsewhere = Path(tempfile.mkdtemp(prefix="ingest-cli-home-")) / "home", tmp_path / "elsewhere"
    monkeypatch.setenv("INGEST_HOME", str(home))
    monkeypatch.setenv("INGEST_CATALOG", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("DAGSTER_HOME", str(elsewhere))
    try:
        for argv in (["up"], ["status"], ["state", "show"], ["state", "reset", "shop.orders"], ["storage", "backup"]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert f"DAGSTER_HOME is {elsewhere}" in err and str(home / "dagster") in err, err
        assert not (home / "pg" / "data").exists()  # nothing was started or initialized
        assert main(["env"]) == 0
        assert f"export DAGSTER_HOME={home / 'dagster'}" in capsys.readouterr().out
        monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))  # as `eval "$(ingest env)"` sets it
        assert main(["up"]) == 0, capsys.readouterr().err
        assert (home / "dagster" / "dagster.yaml").exists()
    finally:
        assert main(["down"]) == 0
        shutil.rmtree(home.parent, ignore_errors=True)


def test_up_env_down_on_a_fresh_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "fresh"
    monkeypatch.setenv("INGEST_HOME", str(home))
    monkeypatch.delenv("INGEST_CATALOG", raising=False)
    try:
        assert main(["up"]) == 0
        exports = capsys.readouterr().out
        assert f"export DAGSTER_HOME={home / 'dagster'}" in exports
        with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
            assert "postgres" in type(instance.run_storage).__module__
            assert instance.event_log_storage.get_concurrency_info("ingest_shop").slot_count == 3
        assert main(["env"]) == 0
        assert capsys.readouterr().out == exports
    finally:
        assert main(["down"]) == 0
    assert not (home / "pg" / "data" / "postmaster.pid").exists()


def test_an_in_process_executor_runs_the_steps_in_the_runs_own_process(cli_env: StreamHarness) -> None:
    """`execution: {executor: in_process}`: what CI runs of one stream may pick (no step process)."""
    harness = cli_env
    assert harness.catalog_path is not None
    catalog = yaml.safe_load(harness.catalog_path.read_text())
    harness.catalog_path.write_text(yaml.safe_dump({**catalog, "execution": {"executor": "in_process"}}))
    process = harness.materialize_cli("items")
    harness.wait_ok(process)
    assert harness.target_count("items") == 1200
    log = harness.log_text(process)
    assert "Executing steps in process" in log and "Launching subprocess" not in log


def test_dlq_replay_failures_are_one_line_naming_the_stream(
    cli_env: StreamHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the files attack: `ingest dlq replay` printed a traceback (an API stream; a fixed file the schema
    policy pauses on; a folder gone). Each failure is now one line naming the stream, with a non-zero exit."""
    import shutil

    from ingestion_assets.state.checkpoints import InstanceStateStore
    from ingestion_assets.streams.runner import PartitionJob
    from ingestion_assets_tests.files_helpers import Drops

    drops = Drops(tmp_path / "files")
    catalog_path = drops.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "float64"}})
    catalog = yaml.safe_load(catalog_path.read_text())
    api = {"path": "/things", "primary_key": ["id"]}
    catalog["sources"]["api"] = {"type": "rest", "base_url": "http://127.0.0.1:9/", "streams": {"things": api}}
    catalog_path.write_text(yaml.safe_dump(catalog))
    monkeypatch.setenv("INGEST_CATALOG", str(catalog_path))

    def refused(stream: str) -> str:
        with pytest.raises(SystemExit) as failed:
            main(["dlq", "replay", stream])
        told = str(failed.value.code)
        assert told.startswith(f"error: {stream}: ") and "\n" not in told and "Traceback" not in told
        return told

    assert main(["dlq", "replay", "drops.orders"]) == 0  # never run: nothing parked, nothing listed
    assert "drops.orders: no parked rows: nothing to replay" in capsys.readouterr().out
    assert "an API stream cannot fetch single records again" in refused("api.things")
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2,b,oops\n", 1_700_000_000)
    store = InstanceStateStore(cli_env.instance, dg.AssetKey(["drops", "orders"]))  # where the command looks
    PartitionJob(drops.stream(), store, run_id="test").run()
    drops.write("a.csv", "id,name,amount\n1,a,1.5\n2.5e0,b,2.5\n", 1_700_000_000)  # "fixed": the key is a double
    assert "paused by a schema change in file a.csv" in refused("drops.orders")
    shutil.rmtree(drops.folder)
    told = refused("drops.orders")
    assert f"the folder {drops.folder} does not exist (url {drops.folder})" in told
    drops.folder.mkdir()  # there again, without a.csv: its parked row stays, said so
    assert main(["dlq", "replay", "drops.orders"]) == 1
    assert "1 gone from the source (they stay parked: a.csv:row2; `ingest dlq discard " in capsys.readouterr().out
    assert drops.dead_letters()[0][0] == "a.csv:row2" and drops.rows() == [(1, "a", 1.5)]
    assert main(["dlq", "discard", "drops.orders", "--key", "a.csv:row2", "--yes", "--reason", "file deleted"]) == 0
    assert "drops.orders: 1 dead letter(s) discarded (file deleted)" in capsys.readouterr().out
    assert drops.dead_letters() == [] and drops.rows() == [(1, "a", 1.5)]


def test_a_hand_edited_dagster_yaml_is_never_replaced_silently(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README-only attack: `ingest status` and `ingest state show` rewrote INGEST_HOME/dagster/
    dagster.yaml over a hand-edited storage URL without a word. The file is ours (the storage URL follows the
    embedded server), so it is rewritten, but with a WARNING naming the file and the setting, the edit kept
    beside it; a file only we wrote (a restore or promotion moves its URL) is rewritten quietly."""
    home = Path(tempfile.mkdtemp(prefix="ingest-cli-yaml-")) / "home"  # the server's user must reach it
    monkeypatch.setenv("INGEST_HOME", str(home))
    catalog = home.parent / "catalog.yaml"
    api = {"type": "rest", "base_url": "https://api.test", "streams": {"s": {"path": "/s", "primary_key": "id"}}}
    catalog.write_text(yaml.safe_dump({"sources": {"api": api}}))
    monkeypatch.setenv("INGEST_CATALOG", str(catalog))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    target = home / "dagster" / "dagster.yaml"
    try:
        assert main(["up"]) == 0
        ours = target.read_text()
        assert "This file is ours" in ours and "WARNING" not in capsys.readouterr().err
        elsewhere = "postgresql+psycopg2://dagster:s3cret-pw@db.internal:5432/dagster"
        for argv in (["status"], ["state", "show"]):
            config = yaml.safe_load(ours)
            config["storage"]["postgres"]["postgres_url"] = elsewhere
            edited = f"# my storage\n{yaml.safe_dump(config, sort_keys=False)}"
            target.write_text(edited)
            main(argv)
            err = capsys.readouterr().err
            assert f"WARNING: {target} was edited by hand (storage.postgres.postgres_url)" in err, (argv, err)
            assert "s3cret-pw" not in err and "DAGSTER_HOME of its own" in err, err
            kept = sorted(target.parent.glob("dagster.yaml.edited-*"))[-1]
            assert str(kept) in err and kept.read_text() == edited
            assert target.read_text() == ours  # the embedded storage again
        assert main(["up"]) == 0 and "WARNING" not in capsys.readouterr().err  # unchanged: not rewritten, no word
        body = ours.rsplit("# ingest: sha256=", 1)[0].replace("@localhost:", "@localhost:1", 1)  # an older port
        target.write_text(f"{body}# ingest: sha256={hashlib.sha256(body.encode()).hexdigest()}\n")  # as we wrote it
        assert main(["state", "show"]) == 0 and "WARNING" not in capsys.readouterr().err
        assert target.read_text() == ours and len(list(target.parent.glob("*.edited-*"))) == 2  # no copy kept
    finally:
        assert main(["down"]) == 0
        shutil.rmtree(home.parent, ignore_errors=True)
