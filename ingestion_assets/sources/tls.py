"""Verified TLS for outgoing connections: libpq URL parameters (verify-full) and an SSL context for HTTP clients
(whose transport is in tls_http.py)."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg2.extensions

from ingestion_assets.errors import TLS_PROTOCOL_ADVICE, TLS_PROTOCOL_MISMATCH
from ingestion_assets.processes import start_ticks

VERIFY_FULL = "verify-full"
_FILE_PARAMETERS = ("sslrootcert", "sslcert", "sslkey")


class TlsError(ValueError):
    """A TLS setting that would allow plaintext or an unverified server, or a handshake that failed:
    retrying does not change either, so it is permanent. The message names files, never their contents."""

    transient = False
    advice = "fix the TLS setting the message names (catalog `tls`, the certificate files), then run again"


@dataclass(frozen=True)
class TlsFiles:
    """The files of one connection's TLS: the CA that signs the server, our certificate and key (mutual TLS)."""

    ca: Path | None
    cert: Path | None = None
    key: Path | None = None

    def libpq_parameters(self) -> dict[str, str]:
        """`sslrootcert=system` (libpq 16+) trusts the system's CAs when no CA file is given."""
        parameters = {"sslmode": VERIFY_FULL, "sslrootcert": str(self.ca) if self.ca else "system"}
        if self.cert is not None and self.key is not None:
            parameters |= {"sslcert": str(self.cert), "sslkey": str(self.key)}
        return parameters


def with_verified_tls(url: str, files: TlsFiles, where: str) -> str:
    """`url` with sslmode=verify-full and the catalog's files.

    A URL that asks for a weaker mode (disable, allow, prefer, require, verify-ca) contradicts the catalog's
    `tls` and is refused rather than silently upgraded or obeyed: one of the two is wrong, and a weaker
    mode would accept plaintext or a certificate of any host. A file parameter given in both places must agree.
    """
    given = _parameters(url, where)
    mode = given.get("sslmode")
    if mode is not None and mode != VERIFY_FULL:
        raise TlsError(
            f"{where}: the connection URL asks for sslmode={mode}, which accepts plaintext or an unverified "
            f"certificate, while the catalog's `tls` requires {VERIFY_FULL}: drop sslmode from the URL"
        )
    wanted = files.libpq_parameters()
    for name in _FILE_PARAMETERS:
        if name in given and name in wanted and given[name] != wanted[name]:
            raise TlsError(f"{where}: the connection URL sets {name} to another file than the catalog's `tls`")
    missing = {name: value for name, value in wanted.items() if name not in given}
    if not url.startswith(("postgresql://", "postgres://", "postgresql+")):
        return psycopg2.extensions.make_dsn(url, **missing)
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(missing.items())
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote, safe="/")))


def require_verified(url: str, where: str) -> None:
    """Refuse a URL that would fall back to plaintext or accept an unverified certificate."""
    mode = _parameters(url, where).get("sslmode")
    if mode != VERIFY_FULL:
        raise TlsError(
            f"{where}: TLS is required but the connection would use sslmode={mode or 'prefer (the default)'}; "
            f"give the connection a catalog `tls` block (sslmode {VERIFY_FULL} with a CA file)"
        )


def _parameters(url: str, where: str) -> dict[str, str]:
    plain = url.replace("postgresql+psycopg2://", "postgresql://", 1)
    try:
        return {key: str(value) for key, value in psycopg2.extensions.parse_dsn(plain).items()}
    except psycopg2.ProgrammingError as exc:
        raise TlsError(f"{where}: the connection string does not parse as a libpq URL or DSN") from exc


def http_ssl_context(files: TlsFiles, where: str) -> ssl.SSLContext:
    """Verification always on (host name, chain to `ca` or the system's CAs), TLS 1.2 at least,
    and our certificate when the API asks for one."""
    try:
        context = ssl.create_default_context(cafile=str(files.ca) if files.ca else None)
        if files.cert is not None:
            context.load_cert_chain(str(files.cert), str(files.key) if files.key else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"{where}: cannot load the TLS files ({exc.__class__.__name__}: {exc.strerror or exc})") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


_PERMANENT_REASONS = ("CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE", "WRONG_VERSION_NUMBER")


def ssl_cause(exc: BaseException) -> ssl.SSLError | None:
    """The certificate or handshake error behind a transport error; an EOF or reset is no such error. A protocol
    version no side accepts (the server wants TLS 1.3 only, or offers no more than 1.1) heals no more than a
    certificate does."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        if isinstance(seen, ssl.SSLError) and (
            any(r in str(seen.reason or "").upper() for r in _PERMANENT_REASONS) or _protocol_mismatch(seen)
        ):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def handshake_failure(where: str, host: str, cause: ssl.SSLError, hint: str = "") -> str:
    """What a failed handshake says: its cause, and for a protocol-version mismatch which setting to align
    (else `hint`)."""
    advice = TLS_PROTOCOL_ADVICE if _protocol_mismatch(cause) else hint
    return f"{where}: TLS handshake with {host} failed: {cause}" + (f"; {advice}" if advice else "")


def _protocol_mismatch(error: ssl.SSLError) -> bool:
    return TLS_PROTOCOL_MISMATCH.search(f"{error.reason or ''} {error}") is not None


_WRITTEN: list[tuple[int, Path]] = []  # (the writing process, its file): removed when that process exits
# digest-host-pid-s<start ticks>: the start tells the writer from a later process that got the same id
_PEM_NAME = re.compile(r"^[0-9a-f]{24}-(?P<host>.+)-(?P<pid>\d+)-s(?P<start>\d+)\.(pem|tmp)$")
_PID_ONLY_NAME = re.compile(r"^[0-9a-f]{24}-(?P<host>.+)-(?P<pid>\d+)\.(pem|tmp)$")  # written before the start
_LEGACY_SECONDS = 86_400.0  # content-named files of earlier versions (no owner in the name): kept a day


def pem_file(folder: Path, text: str) -> Path:
    """PEM text (an `env` reference that holds the certificate or key itself) as a file libpq and OpenSSL can
    read: 0600 from its creation in a 0700 folder, one per process and content, removed when the process exits;
    files left by processes that died without exiting (SIGKILL) are removed by the next process that writes one
    here (or starts a Celery worker: remove_stale_pem_files)."""
    remove_stale_pem_files(folder)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    pid = os.getpid()
    path = folder / f"{digest}-{socket.gethostname()}-{pid}-s{start_ticks(pid) or 0}.pem"
    if not path.exists():
        staged = path.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text + "\n")
        staged.replace(path)
        if not _WRITTEN:
            atexit.register(_remove_written)
        _WRITTEN.append((pid, path))
    return path


def remove_stale_pem_files(folder: Path) -> None:
    """Make `folder` private (0700, created so or tightened) and remove the PEM files, and the staged files of
    writes cut short, of this host's processes that are gone. A file of a live process is never removed: a
    process id now held by a process started at another moment is not the writer's."""
    _private_folder(folder)
    host = socket.gethostname()
    for path in [*folder.glob("*.pem"), *folder.glob("*.tmp")]:
        match = _PEM_NAME.match(path.name) or _PID_ONLY_NAME.match(path.name)
        if match is None:
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > _LEGACY_SECONDS:
                    path.unlink()
        elif match["host"] == host and not _writer_alive(int(match["pid"]), match.groupdict().get("start")):
            with contextlib.suppress(OSError):
                path.unlink()


def _private_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077:
        try:
            folder.chmod(0o700)
        except OSError as exc:
            raise TlsError(
                f"{folder} holds certificates and keys and is readable by others; we cannot make it 0700 "
                f"({exc.strerror}): give it to the user running ingest, or remove it"
            ) from exc


def _remove_written() -> None:
    for pid, path in _WRITTEN:
        if pid == os.getpid():  # a forked child inherits the list: only the writer removes its files
            with contextlib.suppress(OSError):
                path.unlink()


def _writer_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    now = start_ticks(pid)
    return start is None or now is None or int(start) == 0 or int(start) == now
