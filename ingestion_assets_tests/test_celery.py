"""Steps of one run on two Celery workers (real worker processes, the machine's Redis), into PostgreSQL."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml
from celery.exceptions import DuplicateTaskNameWarning
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._serdes import serialize_value

from ingestion_assets.catalog import CatalogError, load_catalog
from ingestion_assets.settings import Settings
from ingestion_assets.worker import worker_app
from ingestion_assets_tests.celery_workers import celery_deployment, step_workers, with_execution
from ingestion_assets_tests.helpers import REPO, StreamHarness

TABLES = """
CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text, updated_at timestamptz NOT NULL);
INSERT INTO orders SELECT g, g * 1.25, CASE WHEN g % 7 = 0 THEN NULL ELSE 'n' || g END,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' FROM generate_series(1, 3000) g;
CREATE TABLE "select" (id int PRIMARY KEY, "from" text, updated_at timestamptz NOT NULL);
INSERT INTO "select" SELECT g, repeat('x', g % 13), timestamptz '2024-02-01 00:00:00+00' + g * interval '1 ms'
FROM generate_series(1, 2000) g;
"""


def _execute(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, keys: list[dg.AssetKey] | None = None
) -> dg.JobExecutionResult:
    """The streams' assets (orders by default) run as `dagster asset materialize` would: the orchestrator loads
    the code location from its module with the CLI's environment; each step goes to the broker."""
    for name, value in harness.cli_env().items():
        monkeypatch.setenv(name, value)
    job = ReconstructableRepository.for_module("ingestion_assets.definitions", "defs", str(REPO))
    selection = keys or [harness.key("orders")]
    return dg.execute_job(job.get_reconstructable_job("__ASSET_JOB"), harness.instance, asset_selection=selection)


def _streams() -> dict[str, dict[str, object]]:
    return {
        "orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at"},
        "keywords": {"table": '"select"', "primary_key": "id", "cursor": "updated_at"},
    }


def test_two_workers_run_the_steps_of_one_run(
    harness: StreamHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(TABLES)
    harness.write_catalog(_streams(), destination="postgres", max_concurrency=2)
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.catalog_path, deployment.execution())  # type: ignore[arg-type]
        for _ in range(2):
            deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deployment.wait_ready()  # a worker holds one step at a time (prefetch 1, acknowledged at its end):
        # with both consuming before the run publishes, each takes one of its two steps
        keys = [harness.key("orders"), harness.key("keywords")]
        with warnings.catch_warnings(record=True) as caught:  # the orchestrator submits each step to the broker
            warnings.simplefilter("always")
            with _execute(harness, monkeypatch, keys) as done:
                assert done.success
                run = done.dagster_run
        duplicates = [str(w.message) for w in caught if issubclass(w.category, DuplicateTaskNameWarning)]
        assert not duplicates, duplicates
        workers = step_workers(harness.instance, run.run_id)
        assert set(workers) == {f"{harness.source_name}__orders", f"{harness.source_name}__keywords"}
        names = {worker for ran in workers.values() for worker in ran}
        assert len(names) == 2, f"both steps ran on one worker: {workers}"
        assert {name.split("@")[0] for name in names} == {w.name for w in deployment.workers}
        snapshot = serialize_value(harness.instance.get_job_snapshot(run.job_snapshot_id))  # type: ignore[arg-type]
        assert deployment.redis_url not in snapshot + serialize_value(run), "the broker URL leaked"

    harness.assert_target_equals_source("orders", "orders", "id")
    harness.assert_target_equals_source("keywords", '"select"', "id")


def test_a_celery_deployment_refuses_a_local_duckdb_file(harness: StreamHarness, tmp_path: Path) -> None:
    catalog = harness.write_catalog(_streams(), destination="duckdb")
    with_execution(catalog, {"executor": "celery", "celery": {"broker": {"env": "SOME_BROKER_URL"}}})
    with pytest.raises(CatalogError) as raised:
        load_catalog(catalog)
    message = str(raised.value)
    assert "destination.type: duckdb is a local file" in message and "type: postgres" in message


def test_a_celery_deployment_refuses_references_to_one_hosts_loopback(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "execution: {executor: celery, celery: {broker: {env: BROKER_URL}}}\n"
        "destination: {type: postgres, credentials: {env: WAREHOUSE_URL}}\n"
        "sources:\n  shop:\n    type: postgres\n    connection: {embedded: shop}\n"
        "    streams: {orders: {table: public.orders, primary_key: id}}\n"
    )
    with pytest.raises(CatalogError, match=r"sources\.shop\.connection: embedded:shop is a server on one host"):
        load_catalog(catalog)


def test_celery_needs_its_broker_and_a_worker_needs_a_celery_catalog(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    body = "sources:\n  shop:\n    type: postgres\n    connection: {env: SHOP_URL}\n"
    body += "    streams: {orders: {table: public.orders, primary_key: id}}\n"
    catalog.write_text("execution: {executor: celery}\n" + body)
    with pytest.raises(CatalogError, match=r"execution\.celery: required with `executor: celery`"):
        load_catalog(catalog)
    catalog.write_text(body)
    with pytest.raises(SystemExit, match="no run publishes steps for a worker"):
        worker_app(Settings(home=tmp_path, catalog_path=catalog))


def test_a_celery_catalog_refuses_local_folders_for_lakes_and_files() -> None:
    from ingestion_assets.catalog import Catalog

    celery = {"executor": "celery", "celery": {"broker": {"env": "BROKER"}}}
    files = {"type": "files", "url": "/data/drops", "streams": {"d": {"path": "*.csv"}}}
    lake = {"type": "filesystem", "bucket_url": "/data/lake", "table_format": "delta"}
    with pytest.raises(ValueError, match=r"destination.bucket_url: /data/lake is a folder on one host's disk"):
        Catalog.model_validate(
            {"execution": celery, "destination": lake, "sources": {"drops": {**files, "url": "s3://b/d"}}}
        )
    with pytest.raises(ValueError, match=r"sources.drops.url: /data/drops is a folder on one host's disk"):
        Catalog.model_validate(
            {"execution": celery, "destination": {**lake, "bucket_url": "s3://b/lake"}, "sources": {"drops": files}}
        )
    Catalog.model_validate(
        {
            "execution": celery,
            "destination": {**lake, "bucket_url": "s3://b/lake"},
            "sources": {"drops": {**files, "url": "s3://b/drops"}},
        }
    )


def test_key_prefix_is_refused_with_a_rabbitmq_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key prefix isolates deployments on a shared Redis; RabbitMQ has no keys, so it would isolate nothing."""
    from ingestion_assets.catalog import CeleryExecution, Reference
    from ingestion_assets.defs.executors import ExecutionSettingError, celery_config

    settings = Settings(home=tmp_path, catalog_path=tmp_path / "catalog.yaml")
    monkeypatch.setenv("TEST_BROKER", "amqp://guest:s3cret@127.0.0.1:5672//")
    celery = CeleryExecution(broker=Reference(env="TEST_BROKER"), key_prefix="team-a:")
    with pytest.raises(ExecutionSettingError, match=r"key_prefix .*virtual host") as refused:
        celery_config(settings, celery)
    assert "s3cret" not in str(refused.value)
    monkeypatch.setenv("TEST_BROKER", "redis://127.0.0.1:6379/0")
    transport = celery_config(settings, celery)["config_source"]["broker_transport_options"]
    assert transport["global_keyprefix"] == "team-a:"


def test_a_sqlite_url_for_a_sqlalchemy_destination_is_refused_at_run_start(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The URL is a reference, resolved at run time: the catalog cannot refuse it, the run's start does."""
    from ingestion_assets.defs.executors import ExecutionSettingError

    harness.source.execute(TABLES)
    catalog = harness.write_catalog(_streams())
    raw = yaml.safe_load(catalog.read_text())
    raw["destination"] = {"type": "sqlalchemy", "credentials": {"env": "TEST_WAREHOUSE_URL"}}
    catalog.write_text(yaml.safe_dump(raw))
    with_execution(catalog, {"executor": "celery", "celery": {"broker": {"env": "TEST_BROKER"}}})
    monkeypatch.setenv("TEST_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'warehouse.sqlite'}")
    monkeypatch.setenv("TEST_BROKER", "redis://127.0.0.1:6379/15")
    with pytest.raises(ExecutionSettingError) as refused:
        _execute(harness, monkeypatch)
    message = str(refused.value)
    assert "is a sqlite URL" in message and "mysql://" in message, message
    assert str(tmp_path) not in message  # the URL itself (a secret) is never shown
    assert harness.instance.get_latest_materialization_event(harness.key("orders")) is None  # no step ran
    assert not (tmp_path / "warehouse.sqlite").exists()


def test_a_worker_with_another_catalog_refuses_the_step(
    harness: StreamHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started before a catalog change (here: another cursor for `orders`) would run the step with its
    own definitions: it refuses the step, and the run fails at once naming both catalogs and the fix."""
    harness.source.execute(TABLES)
    harness.write_catalog(_streams(), destination="postgres")
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.catalog_path, deployment.execution())  # type: ignore[arg-type]
        stale = tmp_path / "stale_catalog.yaml"
        raw = yaml.safe_load(harness.catalog_path.read_text())  # type: ignore[union-attr]
        del raw["sources"][harness.source_name]["streams"]["orders"]["cursor"]
        stale.write_text(yaml.safe_dump(raw))
        deployment.start_worker(stale, harness.settings.dagster_home)
        deployment.wait_ready()
        with _execute(harness, monkeypatch) as done:
            assert not done.success
            failures = [e for e in done.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1, failures
    message = failures[0].step_failure_data.error.message  # type: ignore[union-attr]
    assert f"reads catalog {stale} (fingerprint " in message, message
    assert f"submitted with catalog {harness.catalog_path} (fingerprint " in message, message
    assert "Restart the workers with the submitter's catalog" in message and "Traceback" not in message
    assert harness.instance.get_latest_materialization_event(harness.key("orders")) is None


def test_a_catalog_fingerprint_ignores_comments_and_layout(tmp_path: Path) -> None:
    from ingestion_assets.defs.worker_checks import catalog_identity

    body = "sources:\n  shop:\n    type: postgres\n    connection: {env: SHOP_URL}\n"
    body += "    streams: {orders: {table: public.orders, primary_key: id}}\n"
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(body)
    second.write_text("# the same catalog, another layout\n" + yaml.safe_dump(yaml.safe_load(body)))
    fingerprint = catalog_identity(Settings(home=tmp_path, catalog_path=first))["fingerprint"]
    assert catalog_identity(Settings(home=tmp_path, catalog_path=second))["fingerprint"] == fingerprint
    second.write_text(body.replace("primary_key: id", "primary_key: id, cursor: updated_at"))
    assert catalog_identity(Settings(home=tmp_path, catalog_path=second))["fingerprint"] != fingerprint


@dataclass(frozen=True)
class TlsRedis:
    port: int
    ca: Path
    other_ca: Path  # signed nothing of this server

    def url(self, ca: Path | str, host: str = "localhost") -> str:
        return f"rediss://{host}:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A throwaway Redis serving TLS only, with a certificate for localhost from a throwaway CA."""
    from ingestion_assets.stack.certs import issue, make_ca

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    folder = tmp_path_factory.mktemp("redis-tls")
    ca, other = make_ca(folder / "ca", "redis-ca"), make_ca(folder / "other", "other-ca")
    server = issue(ca, folder / "server", "server", "localhost", hosts=("localhost",))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(server.cert)]
    options += ["--tls-key-file", str(server.key), "--tls-ca-cert-file", str(ca.cert), "--tls-auth-clients", "no"]
    options += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
    process = subprocess.Popen(["redis-server", *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.skip("redis-server did not start with TLS")
            time.sleep(0.05)
        yield TlsRedis(port, ca.cert, other.cert)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_broker_whose_tls_fails_is_refused_in_one_line(
    tls_redis: TlsRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong CA, a host the certificate does not name, a missing CA file: the worker does not start (Celery
    would retry for ever) and `broker_tls_problem` (a run's start, `ingest check`) names the broker, its host and
    the URL parameter, where a run failed after 20 s with "Retry limit exceeded ... result store"."""
    from ingestion_assets.catalog import CeleryExecution, Reference
    from ingestion_assets.defs.broker_check import broker_tls_problem

    settings = Settings(home=tmp_path, catalog_path=tmp_path / "catalog.yaml")
    celery = CeleryExecution(broker=Reference(env="INGEST_TEST_BROKER"))

    def problem(url: str) -> str | None:
        monkeypatch.setenv("INGEST_TEST_BROKER", url)
        return broker_tls_problem(settings, celery)

    assert problem(tls_redis.url(tls_redis.ca)) is None
    assert problem(f"redis://127.0.0.1:{tls_redis.port + 1}/0") is None  # not TLS: Celery's own retries
    head = f"execution.celery.broker (env:INGEST_TEST_BROKER): cannot connect to localhost:{tls_redis.port} over TLS"
    wrong_ca = problem(tls_redis.url(tls_redis.other_ca))
    assert wrong_ca is not None and wrong_ca.startswith(head), wrong_ca
    assert "set ssl_ca_certs in the broker URL to the CA file that signed" in wrong_ca
    wrong_host = problem(tls_redis.url(tls_redis.ca, host="127.0.0.1"))
    assert wrong_host is not None and "not valid for '127.0.0.1'" in wrong_host, wrong_host
    assert "the host in the broker URL is not a name the broker's certificate carries" in wrong_host
    missing = problem(tls_redis.url(tmp_path / "absent.crt"))
    assert missing is not None and "(ssl_ca_certs, ssl_certfile or ssl_keyfile) does not exist" in missing, missing
    body = "execution: {executor: celery, celery: {broker: {env: INGEST_TEST_BROKER}}}\n"
    body += "destination: {type: postgres, credentials: {env: WAREHOUSE_URL}}\n"
    body += "sources:\n  shop:\n    type: postgres\n    connection: {env: SHOP_URL}\n"
    body += "    streams: {orders: {table: public.orders, primary_key: id}}\n"
    settings.catalog_path.write_text(body)
    monkeypatch.setenv("INGEST_TEST_BROKER", tls_redis.url(tls_redis.other_ca))
    with pytest.raises(SystemExit, match=r"cannot connect to localhost:\d+ over TLS: .*set ssl_ca_certs"):
        worker_app(settings)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_broker_that_is_down_is_one_line_in_check_and_at_run_start(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens at the broker's port: `ingest check` said ok (only rediss:// was tried) and a run failed
    after 24 s of Celery's retries with a 279-line traceback ending in an empty `RuntimeError:`."""
    from ingestion_assets.catalog import CeleryExecution, Reference
    from ingestion_assets.cli import main
    from ingestion_assets.defs.broker_check import broker_problem
    from ingestion_assets.defs.executors import ExecutionSettingError

    port, settings = _free_port(), Settings(home=harness.home, catalog_path=harness.tmp_path / "catalog.yaml")
    celery = CeleryExecution(broker=Reference(env="TEST_BROKER"))
    line = (
        f"execution.celery.broker (env:TEST_BROKER): cannot reach the broker at 127.0.0.1:{port} "
        "(Connection refused): start the broker, then run again"
    )
    monkeypatch.setenv("TEST_BROKER", f"amqp://guest:s3cret-broker@127.0.0.1:{port}//")
    amqp = broker_problem(settings, celery)
    assert amqp is not None and amqp.message == line and amqp.transient, amqp
    monkeypatch.setenv("TEST_BROKER", "redis://127.0.0.1:6379/13")
    assert broker_problem(settings, celery) is None  # a broker that answers

    harness.source.execute(TABLES)
    with_execution(
        harness.write_catalog(_streams(), destination="postgres"),
        {"executor": "celery", "celery": {"broker": {"env": "TEST_BROKER"}}},
    )
    monkeypatch.setenv("TEST_BROKER", f"redis://:s3cret-broker@127.0.0.1:{port}/0")
    for name, value in harness.cli_env().items():
        monkeypatch.setenv(name, value)
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert line in out and "s3cret-broker" not in out, out
    with pytest.raises(ExecutionSettingError) as refused:
        _execute(harness, monkeypatch)
    assert line in str(refused.value) and "s3cret-broker" not in str(refused.value)
    assert harness.instance.get_latest_materialization_event(harness.key("orders")) is None  # no step ran


def test_a_worker_runs_a_step_with_its_catalog_file_as_edited_since_its_last_step(
    harness: StreamHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster keeps the job a worker process built for its last step: after the catalog file was edited in place
    (here `orders` reads public.orders again instead of orders_v2), the next step read orders_v2 with the old
    definitions while the submitter's fingerprint matched the file, moved the checkpoint and wrote nothing of
    orders. The worker builds the step's definitions from the file and compares what it built."""
    harness.source.execute(TABLES)
    harness.source.execute(
        "CREATE TABLE orders_v2 (LIKE orders INCLUDING ALL); INSERT INTO orders_v2 "
        "SELECT id, amount * 2, note, updated_at - interval '1 year' FROM orders"
    )
    streams = _streams()
    del streams["keywords"]
    with celery_deployment(tmp_path / "celery") as deployment:
        for table in ("orders_v2", "orders"):
            harness.write_catalog({"orders": {**streams["orders"], "table": table}}, destination="postgres")
            with_execution(harness.catalog_path, deployment.execution())  # type: ignore[arg-type]
            if not deployment.workers:
                deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
                deployment.wait_ready()
            with _execute(harness, monkeypatch) as done:
                assert done.success
    harness.assert_target_equals_source("orders", "orders", "id")


def _submitted_run(harness: StreamHarness, stream: str, timeout: float = 120) -> str:
    """The id of the newest run of `stream` once its orchestrator has handed the step to the broker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in harness.instance.get_run_records(limit=10):
            run = record.dagster_run
            if harness.key(stream) not in (run.asset_selection or set()):
                continue
            engine = harness.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
            if any("Submitting celery task" in (e.dagster_event.message or "") for e in engine if e.dagster_event):
                return run.run_id
        time.sleep(0.2)
    raise AssertionError(f"no run of {stream} submitted its step within {timeout:.0f}s")


def test_a_run_terminated_while_its_step_waits_in_the_broker_ends_and_no_worker_runs_the_step(
    harness: StreamHarness, tmp_path: Path
) -> None:
    """Found by the README-only attack: a run terminated while its step was still queued kept waiting for the
    step (Celery's revoke reaches only the workers up at that moment), and a worker started later ran it: it
    read and loaded after the run was cancelled. The run now withdraws the step, frees its pool slot and ends;
    the worker that takes the step from the broker later refuses it, the run being no longer started."""
    harness.source.execute(TABLES)
    harness.write_catalog({"orders": _streams()["orders"]}, destination="postgres")
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.catalog_path, deployment.execution())  # type: ignore[arg-type]
        orchestrator = harness.materialize_cli("orders")  # no worker yet: its step waits in the broker
        try:
            run_id = _submitted_run(harness, "orders")
            orchestrator.send_signal(signal.SIGTERM)  # as `dagster run terminate` and the run launchers do
            orchestrator.wait(timeout=120)  # a guard only: before the fix it waited for the step for ever
        finally:
            if orchestrator.poll() is None:
                orchestrator.kill()
        run = harness.instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.CANCELED, run
        assert run_id not in harness.instance.event_log_storage.get_concurrency_run_ids()  # its slot is free

        worker = deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deployment.wait_ready()
        deadline = time.monotonic() + 120
        while "not executed by Celery worker" not in worker.log():
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.2)
        assert f"of run {run_id}: not executed by Celery worker {worker.name}@" in worker.log()
        assert "the run is canceled" in worker.log()
    assert not harness.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)  # it never ran
    assert harness.instance.get_latest_materialization_event(harness.key("orders")) is None
    assert harness.query_target_if_exists(f'SELECT count(*) FROM "{harness.source_name}".orders') == []


def test_a_pool_slot_left_by_a_run_that_ended_is_freed_before_the_next_run_claims(
    harness: StreamHarness, tmp_path: Path
) -> None:
    """A run that ended while a worker held its step (the worker SIGKILLed, the run terminated) left the step's
    pool slot claimed: only Dagster's daemon frees such slots, so for CI's CLI runs with max_concurrency 1 every
    later run of the source waited for it for ever."""
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.utils import make_new_run_id

    from ingestion_assets.defs.assets import pool_name

    harness.source.execute(TABLES)
    harness.write_catalog({"orders": _streams()["orders"]}, destination="postgres", max_concurrency=1)
    ended = DagsterRun(job_name="__ASSET_JOB", run_id=make_new_run_id(), status=dg.DagsterRunStatus.CANCELED)
    harness.instance.add_run(ended)
    storage = harness.instance.event_log_storage
    step = f"{harness.source_name}__orders"
    assert storage.claim_concurrency_slot(pool_name(harness.source_name), ended.run_id, step).is_claimed
    with celery_deployment(tmp_path / "celery") as deployment:
        with_execution(harness.catalog_path, deployment.execution())  # type: ignore[arg-type]
        deployment.start_worker(harness.settings.catalog_path, harness.settings.dagster_home)
        deployment.wait_ready()
        run = harness.materialize_cli("orders")
        try:
            harness.wait_ok(run, timeout=180)  # a guard only: before the fix it waited for the slot for ever
        finally:
            if run.poll() is None:
                run.kill()
    assert ended.run_id not in storage.get_concurrency_run_ids()
    harness.assert_target_equals_source("orders", "orders", "id")
