"""Which failures are worth a retry: transient ones (the same call may succeed later) or permanent ones.

Retrying a missing table, a refused privilege, a syntax error or an HTTP 404 only delays the message the
user needs by minutes of backoff. Every stream kind asks `classify` before retrying; a permanent failure
fails at once with the source's own words and what to do. Unknown errors count as permanent: a retry is
for what is known to heal (lost connections, timeouts, serialization failures, 408/429/5xx).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ingestion_assets.sources.redact import redact

if TYPE_CHECKING:
    import psycopg2

# Not a SQLSTATE: libpq's own refusal when client and server share no TLS protocol version.
TLS_PROTOCOL = "tls-protocol"
TLS_PROTOCOL_ADVICE = (
    "the client and the server share no TLS protocol version: make the server's ssl_min_protocol_version / "
    "ssl_max_protocol_version and the client's (libpq URL parameters of the same names; HTTP sources: TLS 1.2 "
    "at least) overlap"
)
# TLS alerts and OpenSSL reasons of a protocol-version mismatch (libpq's words and Python's ssl reasons)
TLS_PROTOCOL_MISMATCH = re.compile(
    r"alert[ _]protocol[ _]version|unsupported[ _]protocol|no[ _]protocols[ _]available|"
    r"does not support any SSL protocol version",
    re.I,
)

# SQLSTATE classes (https://www.postgresql.org/docs/current/errcodes-appendix.html) that heal by themselves.
_TRANSIENT_CLASSES = {"08", "40", "53", "58"}  # connection, rollback (serialization, deadlock), resources, I/O
# MySQL/MariaDB (a sqlalchemy destination): connection lost or refused by load, server shutting down, lock
# wait timeout, deadlock, too many connections; its other codes (access denied, unknown database, ...) are not
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 2002, 2003, 2006, 2013, 2055}
_TRANSIENT_CODES = {"57014", "57P01", "57P02", "57P03", "55P03", "55006", "XX000"}  # canceled, shutdown, lock
_ADVICE = {
    "42501": "grant the connecting user the privilege the message names (e.g. SELECT on the table)",
    "42P01": "check the stream's `table` in the catalog, or create the table",
    "42703": "check the catalog's column names against the table (`ingest check` lists what it finds)",
    "3D000": "check the database name in the source's connection",
    "28P01": "check the credentials the connection reference holds",
    "28000": "check the credentials the connection reference holds (TLS: the CA, host name and client certificate)",
    "42601": "the generated query did not parse: report it with the message",
    TLS_PROTOCOL: TLS_PROTOCOL_ADVICE,
}


# OpenSSL's TLS alerts a server sends about the client's certificate (libpq prints "ssl/tls alert ...", older
# OpenSSL "sslv3 alert ...", TLS 1.3 "tlsv13 alert ..."), by what the user must change
_CLIENT_EXPIRED = re.compile(r"alert certificate expired", re.I)
_CLIENT_REVOKED = re.compile(r"alert certificate revoked", re.I)
_CLIENT_CERTIFICATE_ALERTS = re.compile(
    r"alert (certificate (expired|revoked|unknown|required)|unknown ca|bad certificate|unsupported certificate|"
    r"handshake failure|access denied)",
    re.I,
)

# A connection the server refuses comes without a SQLSTATE from psycopg2: its FATAL message says which.
_REFUSED_CONNECTIONS = (
    (
        re.compile(
            r"password authentication failed|(ident|peer|gss|sspi|ldap|radius|pam|cert) authentication failed", re.I
        ),
        "28P01",
    ),
    (re.compile(r'role "[^"]*" does not exist|no pg_hba\.conf entry|pg_hba\.conf rejects connection', re.I), "28000"),
    (re.compile(r'database "[^"]*" does not exist', re.I), "3D000"),
    (re.compile(r"permission denied for database|must have CONNECT privilege|does not have CONNECT", re.I), "42501"),
    (re.compile(r"certificate verify failed|server certificate for .* does not match", re.I), "28000"),
    (_CLIENT_CERTIFICATE_ALERTS, "28000"),  # the server's TLS alert about our client certificate
    (TLS_PROTOCOL_MISMATCH, TLS_PROTOCOL),
    # TLS: a refused or missing client certificate, unreadable certificate files, a server without TLS
    (
        re.compile(
            r"requires a valid client certificate|alert (unknown ca|bad certificate|certificate required)|"
            r"(root )?certificate (file|present)|private key file|server does not support SSL",
            re.I,
        ),
        "28000",
    ),
)


class ServerUnavailable(RuntimeError):
    """A server could not be reached or refused the connection (down, wrong host or port, bad credentials, a
    certificate that does not verify). The message names the catalog key and its reference, never the secret,
    and what to fix; the driver's error is the cause and decides whether a retry may help."""

    def __init__(
        self, where: str, reference: str, exc: BaseException, secret: str | None = None, advice: str = ""
    ) -> None:
        text = redact(" ".join(line.strip() for line in str(exc).strip().splitlines()[:1])) or type(exc).__name__
        if secret:
            text = text.replace(secret, "***")
        verdict = classify(exc)
        keys = (f"{where.rsplit('.', 1)[0]}.tls", where)  # sources.shop.connection -> sources.shop.tls
        advice = advice or tls_advice(text, *keys) or (verdict.advice if _refusal_code(text) else "")
        advice = advice or "check that the server runs and listens at the host and port the reference holds"
        self.transient, self.advice = verdict.transient, advice
        super().__init__(f"{where} ({reference}): cannot connect: {text}; {advice}")


class SourceUnavailable(ServerUnavailable):
    """A source's server (`sources.<name>.connection`) could not be reached or refused the connection."""


class DestinationUnavailable(ServerUnavailable):
    """The destination's server (`destination.credentials`) could not be reached or refused the connection."""


# libpq's words for a TLS handshake that failed, and which setting of the connection's `tls` block decides it
_TLS_MISTAKES = (
    (
        re.compile(r"certificate verify failed", re.I),
        "the server's certificate is not signed by the CA the client trusts: set {ca} to the CA file that "
        "signed the server's certificate",
    ),
    (
        _CLIENT_EXPIRED,
        "the server refuses our client certificate because it has expired: renew the certificate {client} "
        "name (signed by the CA the server trusts)",
    ),
    (
        _CLIENT_REVOKED,
        "the server refuses our client certificate because its CA revoked it: have a new one issued and set "
        "{client} to it",
    ),
    (
        re.compile(r"server certificate for .* does not match host name", re.I),
        "the host in {url} is not a name the server's certificate carries: connect by a name the certificate "
        "was issued for, or have the server's certificate issued for this host",
    ),
    (
        re.compile(r"root certificate file .* does not exist|could not read root certificate file", re.I),
        "the CA file is missing or unreadable: set {ca} to a readable CA file",
    ),
    (
        re.compile(
            r"requires a valid client certificate|alert (unknown ca|bad certificate|certificate (required|unknown))|"
            r"alert unsupported certificate|"
            r"(could not open|could not load|could not read) certificate file|private key file",
            re.I,
        ),
        "the server refuses our client certificate, or it cannot be read: set {client} to a "
        "certificate signed by the CA the server trusts (ssl_ca_file) and its key",
    ),
    (re.compile(r"server does not support SSL", re.I), "the server has no TLS: turn on `ssl` in its settings"),
    (
        re.compile(r"alert (handshake failure|access denied)", re.I),
        "the server ended the TLS handshake: check that {client} name a certificate signed by the CA the server "
        "trusts and valid now, and the server's log for its reason",
    ),
)


def tls_advice(message: str, tls: str = "the connection's tls", url: str = "the connection URL") -> str | None:
    """Which TLS setting to fix for libpq's `message`, naming the connection's `tls` block and URL keys
    (`sources.shop.tls`, `sources.shop.connection`) where the caller knows them."""
    return tls_advice_for(message, f"{tls}.ca (or sslrootcert in the URL)", f"{tls}.cert and {tls}.key", url)


def tls_advice_for(message: str, ca: str, client: str, url: str) -> str | None:
    """As tls_advice, naming the settings as given: the CA file, the client certificate and key, the URL."""
    if TLS_PROTOCOL_MISMATCH.search(message):
        return TLS_PROTOCOL_ADVICE
    found = (advice for pattern, advice in _TLS_MISTAKES if pattern.search(message))
    return next((advice.format(ca=ca, client=client, url=url) for advice in found), None)


# A target column whose type does not hold a source value (changed outside the product, or by a version that
# did not alter it): the message names the value and the column.
_UNFIT_TARGET = (
    "the target column's type does not hold the source's value: alter that column to the source's type, or "
    "rebuild the target (`ingest refresh STREAM`: a table stream reads every row again, a CDC stream copies its "
    "table again)"
)


@dataclass(frozen=True)
class Verdict:
    transient: bool
    advice: str  # what the user can do, for a permanent failure
    words: str = ""  # the first line of the error in the chain that decided, when it is not the outermost one


def describe_permanent(where: str, exc: BaseException, verdict: Verdict) -> str:
    """`where: <the source's own words> (permanent: ...) <what to do>`."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2]).strip()
    if text.endswith(":"):  # a wrapper's words stop where its cause's begin (dlt: "... with exception:")
        text = f"{text} {_innermost_words(exc)}"
    text = redact(text) or type(exc).__name__
    text = text.removeprefix(f"{where}: ")  # our own errors often name the stream already
    cause = redact(verdict.words)
    if cause and cause not in text:  # a wrapper's words ("Current transaction is aborted") say nothing of its cause
        text = f"{text} ({cause})"
    if verdict.advice and verdict.advice in text:  # said already (a connection's refusal names what to fix)
        return f"{where}: {text} — a permanent error, not retried"
    return f"{where}: {text} — a permanent error, not retried; {verdict.advice}"


def _innermost_words(exc: BaseException) -> str:
    """The first line of the deepest error in the chain that says anything: the server's own message."""
    for error in reversed(list(_chain(exc))[1:]):
        if words := str(error).strip().split("\n", 1)[0].strip():
            return words
    return ""


def classify(exc: BaseException) -> Verdict:
    """The verdict of the most specific error in the chain that says anything.

    dlt's own labels come last: dlt calls every PostgreSQL OperationalError and DuckDB InvalidInputException
    "transient", among them a table of more than 1,600 columns (54011) or a value out of range, which no retry
    heals; the driver's error beneath dlt's label (its SQLSTATE, its class) decides when there is one."""
    errors = list(_chain(exc))
    for error in errors:
        verdict = _judge(error)
        if verdict is not None:
            words = str(error).strip().split("\n", 1)[0].strip() if error is not exc else ""
            return replace(verdict, words=words)
    if any(_labelled_transient(error) for error in errors):
        return Verdict(True, "")
    return Verdict(False, "retrying will not change this error: fix its cause, then run again")


def _labelled_transient(error: BaseException) -> bool:
    return type(error).__module__.startswith("dlt.") and "Transient" in type(error).__name__


def _judge(error: BaseException) -> Verdict | None:
    said = getattr(error, "transient", None)  # our own errors say it themselves (HTTP by status, CDC, ...)
    if isinstance(said, bool):
        return Verdict(said, getattr(error, "advice", "") or "fix its cause, then run again")
    if (psycopg2 := _imported("psycopg2")) is not None and isinstance(error, psycopg2.Error):
        return _judge_postgres(error)
    if (pymysql := _imported("pymysql")) is not None and isinstance(error, pymysql.err.MySQLError):
        code = error.args[0] if error.args and isinstance(error.args[0], int) else None
        return Verdict(code in _MYSQL_TRANSIENT, "fix what the server's message names, then run again")
    if isinstance(error, TimeoutError | ConnectionError):
        return Verdict(True, "")
    if (httpx := _imported("httpx")) is not None and isinstance(error, httpx.TransportError):
        return Verdict(True, "")
    if (duckdb := _imported("duckdb")) is not None and isinstance(error, duckdb.TransactionException):
        # "Current transaction is aborted": what a failed statement left, whose own error (its context) decides;
        # judged transient, a value the target column cannot hold was retried on every attempt, for good
        return None if _ABORTED.search(str(error)) else Verdict(True, "")  # a write conflict: the other goes away
    if (duckdb := _imported("duckdb")) is not None and isinstance(error, duckdb.IOException):
        return Verdict(True, "")  # a file lock: another writer goes away
    if (duckdb := _imported("duckdb")) is not None and isinstance(error, duckdb.ConversionException):
        return Verdict(False, _UNFIT_TARGET)
    if (duckdb := _imported("duckdb")) is not None and isinstance(error, _duckdb_refusals(duckdb)):
        return Verdict(False, "fix what the destination's message names, then run again")
    if isinstance(error, MemoryError):
        return Verdict(False, "the slice does not fit in memory: lower `slice_rows` (or `pages_per_slice`)")
    return None


_ABORTED = re.compile(r"transaction is aborted", re.I)


def _duckdb_refusals(duckdb: Any) -> tuple[type[BaseException], ...]:
    """DuckDB's errors about the statement or the data itself (a name, a type, a value, a constraint): the same
    statement fails the same way again."""
    names = (
        *("BinderException", "ParserException", "NotImplementedException", "InvalidInputException"),
        *("OutOfRangeException", "ConstraintException", "TypeMismatchException", "SyntaxException"),
    )
    return tuple(getattr(duckdb, name) for name in names if hasattr(duckdb, name))


def _imported(library: str) -> Any:
    """The library's module if this process imported it, else None: an error of a library that was never
    imported cannot be at hand, and importing the drivers here would cost every Dagster process that loads the
    definitions (this module comes in with them) a fifth of a second."""
    return sys.modules.get(library)


def _judge_postgres(error: psycopg2.Error) -> Verdict:
    code = error.pgcode or _refusal_code(str(error))
    if code is None:  # no answer from the server: the connection failed or was lost
        lost = sys.modules["psycopg2"]
        return Verdict(isinstance(error, lost.OperationalError | lost.InterfaceError), "")
    if code in _TRANSIENT_CODES or code[:2] in _TRANSIENT_CLASSES or _made_at_once(error, code):
        return Verdict(True, "")
    advice = tls_advice(str(error)) if code == "28000" else None
    return Verdict(False, advice or _ADVICE.get(code, "fix what the server's message names, then run again"))


# Two writers making the same table, schema or type at once (two streams' first loads making dlt's `_dlt_loads` in one
# dataset): the loser's CREATE fails; a retry finds the object made and goes on (as dlt's own message says)
_MADE_AT_ONCE = {"42P06", "42P07", "42710"}  # duplicate schema, table, object
_CATALOG_INDEXES = {"pg_type_typname_nsp_index", "pg_class_relname_nsp_index", "pg_namespace_nspname_index"}


def _made_at_once(error: psycopg2.Error, code: str) -> bool:
    if code in _MADE_AT_ONCE:
        return True
    diag = getattr(error, "diag", None)
    return code == "23505" and getattr(diag, "constraint_name", None) in _CATALOG_INDEXES


def _refusal_code(message: str) -> str | None:
    """The SQLSTATE of a refused connection (bad credentials, no such role or database), by its message."""
    return next((code for pattern, code in _REFUSED_CONNECTIONS if pattern.search(message)), None)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The error, then its causes (dlt wraps a load's error in PipelineStepFailed.exception, SQLAlchemy the
    driver's in `.orig`)."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        wrapped = (getattr(error, "exception", None), getattr(error, "orig", None))
        for nested in (*wrapped, error.__cause__, error.__context__):
            if isinstance(nested, BaseException):
                pending.append(nested)
