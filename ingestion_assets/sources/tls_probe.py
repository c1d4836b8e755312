"""Why a PostgreSQL server's certificate did not verify: libpq says only "certificate verify failed", for a
certificate signed by another CA as for an expired one; a handshake of our own (OpenSSL's verify result)
tells which, so the error can name the certificate's dates instead of sending the user to the CA setting."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import psycopg2.extensions

from ingestion_assets.sources.tls import TlsError

if TYPE_CHECKING:  # imported where a handshake failed: every process connecting to a source would pay ~80 ms
    from cryptography import x509

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)  # PostgreSQL's SSLRequest: the server answers b"S" to go TLS
_NOT_YET_VALID, _EXPIRED, _REVOKED = 9, 10, 23  # OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID, _HAS_EXPIRED, _REVOKED
_PROBE_SECONDS = 5.0


class ServerCertificateRejected(TlsError):
    """The server's certificate did not verify, with the reason OpenSSL gives and what to do about it."""

    def __init__(self, message: str, advice: str) -> None:
        super().__init__(message)
        self.advice = advice


def explain_verify_failure(exc: BaseException, url: str) -> ServerCertificateRejected | None:
    """libpq's verify failure for `url`, explained by a handshake of our own when the certificate is out of its
    dates or revoked; None for any other failure, or when the probe learns nothing (the server went away)."""
    if "certificate verify failed" not in str(exc):
        return None
    reason = _probe(url)
    if reason is None:
        return None
    words = " ".join(line.strip() for line in str(exc).strip().splitlines()[:1])
    return ServerCertificateRejected(f"{words}: {reason[0]}", reason[1])


def _probe(url: str) -> tuple[str, str] | None:
    try:
        dsn = psycopg2.extensions.parse_dsn(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    except psycopg2.ProgrammingError:
        return None
    host = dsn.get("host", "localhost").split(",")[0]
    address, port = dsn.get("hostaddr", host).split(",")[0], int(dsn.get("port", "5432").split(",")[0])
    ca = dsn.get("sslrootcert")
    try:
        context = ssl.create_default_context(cafile=None if ca in (None, "system") else ca)
        _handshake(context, address, port, host)
    except ssl.SSLCertVerificationError as failed:
        return _reason(failed, address, port, host)
    except (OSError, ssl.SSLError, ValueError):
        return None
    return None  # it verifies now: libpq's failure was something else (a CRL, a renewed certificate)


def _reason(failed: ssl.SSLCertVerificationError, address: str, port: int, host: str) -> tuple[str, str] | None:
    certificate = _peer_certificate(address, port, host)
    if failed.verify_code == _EXPIRED:
        when = f" on {_utc(certificate.not_valid_after_utc)}" if certificate else ""
        return (
            f"the server's certificate expired{when} (notAfter)",
            "the server's certificate has expired: have a new one issued and installed on the server "
            "(ssl_cert_file); the client's CA setting is not at fault",
        )
    if failed.verify_code == _NOT_YET_VALID:
        when = f" before {_utc(certificate.not_valid_before_utc)}" if certificate else " yet"
        return (
            f"the server's certificate is not valid{when} (notBefore)",
            "the server's certificate is not valid yet: check the clocks of the server and the client, or "
            "install a certificate valid now",
        )
    if failed.verify_code == _REVOKED:
        return (
            "the server's certificate is revoked",
            "the server's certificate is revoked: have a new one issued and installed on the server",
        )
    return None  # another CA, a name it does not carry: errors.tls_advice names the setting to fix


def _handshake(context: ssl.SSLContext, address: str, port: int, host: str) -> bytes | None:
    with socket.create_connection((address, port), timeout=_PROBE_SECONDS) as raw:
        raw.sendall(_SSL_REQUEST)
        if raw.recv(1) != b"S":
            raise ValueError("the server offers no TLS")
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True)


def _peer_certificate(address: str, port: int, host: str) -> x509.Certificate | None:
    """The certificate the server shows, unverified: only its dates are read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with contextlib.suppress(OSError, ssl.SSLError, ValueError):
        der = _handshake(context, address, port, host)
        from cryptography import x509

        return x509.load_der_x509_certificate(der) if der else None
    return None


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
