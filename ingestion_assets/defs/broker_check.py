"""A Celery broker, tried once before a run publishes, `ingest check` says ok, or a worker consumes: a broker
that is down is one line naming `execution.celery.broker` and its host, not Celery's 24 s of retries ending in
an empty `RuntimeError`; a TLS certificate that does not verify names the URL parameter to fix.

A worker refuses only a TLS failure: a broker that is down may come back, and the worker's retries wait for it.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from ingestion_assets.catalog import CeleryExecution
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.redact import redact

_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_AMQP_PORTS = {"amqp": 5672, "pyamqp": 5672, "amqps": 5671}
_TIMEOUT = 10.0


@dataclass(frozen=True)
class BrokerProblem:
    message: str
    transient: bool  # down or unreachable: it may come back; a TLS setting never fixes itself


def broker_problem(settings: Settings, celery: CeleryExecution) -> BrokerProblem | None:
    """Why the broker cannot be used now, naming `execution.celery.broker` and its host; None when it answers
    (or its scheme is one we do not probe)."""
    url = resolve(celery.broker, settings, "execution.celery.broker")
    where = f"execution.celery.broker ({celery.broker.describe()})"
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("redis", "rediss"):
        return _redis(url, where)
    if scheme in _AMQP_PORTS:
        return _amqp(url, where, _AMQP_PORTS[scheme])
    return None


def broker_tls_problem(settings: Settings, celery: CeleryExecution) -> str | None:
    """Only a problem no retry heals (a worker waits for a broker that is down, but not for a TLS fix)."""
    problem = broker_problem(settings, celery)
    return None if problem is None or problem.transient else problem.message


def _redis(url: str, where: str) -> BrokerProblem | None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=_TIMEOUT, socket_timeout=_TIMEOUT)
    kwargs = client.connection_pool.connection_kwargs
    host = f"{kwargs.get('host')}:{kwargs.get('port')}"
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        if (advice := _advice(exc, url)) is not None:
            return BrokerProblem(f"{where}: cannot connect to {host} over TLS: {advice}", transient=False)
        if isinstance(exc, redis.exceptions.AuthenticationError):
            return BrokerProblem(
                f"{where}: the broker at {host} refused the URL's credentials ({redact(str(exc))}): set the "
                "password (and user) the broker expects in the broker URL",
                transient=False,
            )
        return _unreachable(where, host, exc)
    finally:
        client.close()
    return None


def _amqp(url: str, where: str, default_port: int) -> BrokerProblem | None:
    """A TCP connection to the broker: enough to tell one that is down from one that listens."""
    try:
        parts = urlsplit(url)
        address = (parts.hostname or "localhost", parts.port or default_port)
    except ValueError as exc:
        return BrokerProblem(f"{where}: the broker URL does not parse ({redact(str(exc))})", transient=False)
    try:
        socket.create_connection(address, timeout=_TIMEOUT).close()
    except OSError as exc:
        return _unreachable(where, f"{address[0]}:{address[1]}", exc)
    return None


def _unreachable(where: str, host: str, exc: BaseException) -> BrokerProblem:
    text = str(exc).strip()
    reason = next((e.strerror for e in _chain(exc) if isinstance(e, OSError) and e.strerror), None)
    reason = redact(reason or (text.splitlines()[0] if text else type(exc).__name__))
    return BrokerProblem(
        f"{where}: cannot reach the broker at {host} ({reason}): start the broker, then run again", transient=True
    )


def _advice(exc: BaseException, url: str) -> str | None:
    """libssl's reason and the broker URL parameter that decides it; None for a failure that is not TLS."""
    for error in _chain(exc):
        if isinstance(error, ssl.SSLCertVerificationError):
            reason = (error.verify_message or str(error)).rstrip(".")
            if "mismatch" in reason:
                return (
                    f"{reason}: the host in the broker URL is not a name the broker's certificate carries; connect by "
                    "a name the certificate was issued for, or have it issued for this host"
                )
            return f"{reason}: set ssl_ca_certs in the broker URL to the CA file that signed the broker's certificate"
        if isinstance(error, ssl.SSLError):
            return f"{error.reason or error}: check the broker URL's ssl_* parameters against the broker's TLS"
        if isinstance(error, FileNotFoundError) and any(f"{name}=" in url for name in _TLS_FILES):
            return (
                "a file the broker URL names (ssl_ca_certs, ssl_certfile or ssl_keyfile) does not exist: give its path"
            )
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found
