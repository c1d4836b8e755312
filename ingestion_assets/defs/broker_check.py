"""A Celery broker reached over TLS, tried once before a run publishes or a worker consumes: a certificate that
does not verify is one line naming the broker, its host and the URL parameter to fix, not Celery's
"Retry limit exceeded ... result store" twenty seconds later, nor a worker retrying for ever.

Only a TLS failure is refused: a broker that is down or refuses the connection may come back, and Celery's
own retries are for that."""

from __future__ import annotations

import ssl

from ingestion_assets.catalog import CeleryExecution
from ingestion_assets.references import resolve
from ingestion_assets.settings import Settings

_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def broker_tls_problem(settings: Settings, celery: CeleryExecution) -> str | None:
    """Why the broker's TLS fails, naming `execution.celery.broker`; None when it connects or is not rediss://."""
    import redis

    url = resolve(celery.broker, settings, "execution.celery.broker")
    if not url.startswith("rediss://"):
        return None
    client = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=10)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        advice = _advice(exc, url)
        if advice is None:
            return None
        where = client.connection_pool.connection_kwargs
        host = f"{where.get('host')}:{where.get('port')}"
        return f"execution.celery.broker ({celery.broker.describe()}): cannot connect to {host} over TLS: {advice}"
    finally:
        client.close()
    return None


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
