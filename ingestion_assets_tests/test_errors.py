"""Permanent errors fail at once, transient ones are retried: the verdicts, and an HTTP 404 end to end."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import duckdb
import httpx
import psycopg2
import pytest

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets.errors import classify
from ingestion_assets.sources.rest.errors import ApiError, AuthError, NotFound, PaginationLoop, RetriesExhausted
from ingestion_assets.streams.postgres_table import StreamError
from ingestion_assets.sync import InjectedFault
from ingestion_assets_tests.helpers import SourceDb, StreamHarness
from ingestion_assets_tests.test_api_streams import _catalog, api

__all__ = ["api"]


def _postgres_error(source_db: SourceDb, statement: str) -> psycopg2.Error:
    with source_db.connect() as conn, conn.cursor() as cur:
        try:
            cur.execute(statement)
        except psycopg2.Error as exc:
            return exc
    raise AssertionError(f"{statement} did not fail")


@pytest.mark.parametrize(
    ("statement", "transient"),
    [
        ("SELECT * FROM no_such_table", False),
        ("SELECT no_such_column FROM pg_class", False),
        ("SELEC 1", False),
        ("SELECT 1/0", False),
        ("SET statement_timeout = 1; SELECT pg_sleep(1)", True),
        ("SELECT pg_terminate_backend(pg_backend_pid())", True),
        # two writers creating one table at once (found in CI: two Celery workers' first loads into one dataset)
        ("CREATE TEMP TABLE made_twice (a int); CREATE TEMP TABLE made_twice (a int)", True),
        ("CREATE TEMP TABLE unique_rows (a int UNIQUE); INSERT INTO unique_rows VALUES (1), (1)", False),
    ],
)
def test_postgres_errors_by_sqlstate(source_db: SourceDb, statement: str, transient: bool) -> None:
    assert classify(_postgres_error(source_db, statement)).transient is transient


@pytest.mark.parametrize("wrong", ["user", "database"])
def test_a_refused_connection_is_permanent_and_a_lost_server_transient(source_db: SourceDb, wrong: str) -> None:
    """psycopg2 gives a refused connection no SQLSTATE: the server's FATAL words tell bad credentials (or no such
    role or database) from a server that is not there."""
    url = urlsplit(source_db.url)
    netloc = f"no_such_role@{url.hostname}:{url.port}" if wrong == "user" else url.netloc
    path = "/no_such_database" if wrong == "database" else url.path
    with pytest.raises(psycopg2.OperationalError) as refused:
        psycopg2.connect(urlunsplit((url.scheme, netloc, path, "", "")))
    verdict = classify(refused.value)
    assert not verdict.transient and "check" in verdict.advice
    with pytest.raises(psycopg2.OperationalError) as absent:
        psycopg2.connect(host="127.0.0.1", port=1, user="postgres", connect_timeout=2)
    assert classify(absent.value).transient
    password = psycopg2.OperationalError(
        'connection to server failed: FATAL:  password authentication failed for user "u"'
    )
    assert not classify(password).transient  # the embedded server trusts loopback: its words, as PostgreSQL says them


def test_errors_of_our_own_and_of_the_network() -> None:
    request = httpx.Request("GET", "http://127.0.0.1/x")
    wrapped = RuntimeError("load failed")
    wrapped.__cause__ = duckdb.IOException("Could not set lock on file")
    cases: list[tuple[BaseException, bool]] = [
        (NotFound("404", 404), False),
        (AuthError("401", 401), False),
        (PaginationLoop("loop"), False),
        (ApiError("400", 400), False),
        (ApiError("503", 503), True),
        (RetriesExhausted("gave up", 503), True),
        (httpx.ConnectError("refused", request=request), True),
        (StreamError("stream x: bad"), False),
        (InjectedFault("crash"), True),
        (wrapped, True),
        (KeyError("bug"), False),
    ]
    for error, transient in cases:
        assert classify(error).transient is transient, error


def test_an_http_404_fails_in_one_attempt_although_retries_are_allowed(harness: StreamHarness, api: DemoApi) -> None:
    _catalog(harness, api, path="/v1/nope", retries={"max_attempts": 4, "delay_seconds": 5})
    result = harness.materialize(raise_on_error=False)
    assert not result.success
    assert [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_RESTARTED] == []
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert "404" in failure.step_failure_data.error.message and "not retried" in failure.step_failure_data.error.message


def test_mysql_errors_lost_connections_retry_refusals_do_not() -> None:
    import pymysql
    import sqlalchemy.exc

    lost = sqlalchemy.exc.OperationalError("INSERT ...", {}, pymysql.err.OperationalError(2013, "Lost connection"))
    assert classify(lost).transient
    assert classify(pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'")).transient
    denied = sqlalchemy.exc.OperationalError("connect", {}, pymysql.err.OperationalError(1045, "Access denied"))
    assert not classify(denied).transient


def test_a_permanent_error_that_names_its_stream_is_not_prefixed_twice() -> None:
    from ingestion_assets.errors import Verdict, describe_permanent

    message = describe_permanent("stream s.t", ValueError("stream s.t: table public.t does not exist"), Verdict(False, "x"))
    assert message.startswith("stream s.t: table public.t does not exist — a permanent error")


def test_a_value_the_target_column_cannot_hold_says_what_to_do() -> None:
    """Found by the README-only attack: DuckDB's conversion error of a load named the value and column but the
    failure said only "fix its cause": it now says how the target's column gets a type that holds it."""
    loaded = RuntimeError("load failed")
    loaded.__cause__ = duckdb.ConversionException('Could not convert string "n/a" to DECIMAL(10,2) from column p')
    verdict = classify(loaded)
    assert not verdict.transient
    assert "ingest refresh" in verdict.advice and "copies its table again" in verdict.advice


def test_a_load_failure_wrapped_by_dlt_keeps_the_servers_message(source_db: SourceDb) -> None:
    """Found by attack19a: dlt's PipelineStepFailed starts "... with exception:" and puts its cause two lines
    further, so the one-line failure read "with exception:  — a permanent error", the server's words lost."""
    from types import SimpleNamespace

    from dlt.common.destination.exceptions import SchemaUpdateTerminalError
    from dlt.pipeline.exceptions import PipelineStepFailed

    from ingestion_assets.errors import describe_permanent

    refused = _postgres_error(source_db, "CREATE SCHEMA pg_shop")  # the real server's refusal
    terminal = SchemaUpdateTerminalError("ingest_pg_shop_weird", [], refused)
    terminal.__cause__ = refused
    pipeline = SimpleNamespace(has_pending_data=False, pipeline_name="p")
    failed = PipelineStepFailed(pipeline, "load", "1.5", terminal)  # type: ignore[arg-type]
    verdict = classify(failed)
    message = describe_permanent("stream pg_shop.weird", failed, verdict)
    assert not verdict.transient
    assert 'with exception: unacceptable schema name "pg_shop" — a permanent error' in message, message


def test_a_value_the_target_column_cannot_hold_in_an_aborted_transaction_is_permanent() -> None:
    """Found by the README-only attack: DuckDB's conversion error aborts the load's transaction, and the next
    statement's "Current transaction is aborted", wrapped by dlt as transient, decided: every attempt failed the
    same way, retried for good. The aborted transaction's cause decides, and the failure says it."""
    from dlt.destinations.exceptions import DatabaseTransientException

    from ingestion_assets.errors import describe_permanent

    con = duckdb.connect()
    con.execute("CREATE TABLE t (a INTEGER); BEGIN")
    aborted: duckdb.TransactionException | None = None
    try:
        con.execute("INSERT INTO t SELECT 5000000000::BIGINT")
    except duckdb.ConversionException:
        try:
            con.execute("INSERT INTO t VALUES (1)")
        except duckdb.TransactionException as exc:  # its context: the conversion error
            aborted = exc
    assert aborted is not None
    wrapped = DatabaseTransientException(aborted)
    wrapped.__cause__ = aborted
    verdict = classify(wrapped)
    assert not verdict.transient
    message = describe_permanent("source s (cdc)", wrapped, verdict)
    assert "value 5000000000 can't be cast" in message and "INT32" in message and "ingest refresh" in message
    conflict = duckdb.TransactionException("TransactionContext Error: Catalog write-write conflict on alter")
    assert classify(DatabaseTransientException(conflict)).transient  # another writer: it goes away
