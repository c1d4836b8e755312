"""Resolve catalog references (env var, secret file, embedded database, project service) at run time."""

from __future__ import annotations

import os
from pathlib import Path

from ingestion_assets.catalog import Reference, Tls
from ingestion_assets.settings import Settings
from ingestion_assets.sources.redact import remember_origin, remember_resolved
from ingestion_assets.sources.tls import TlsFiles, pem_file, with_verified_tls

PEM_PREFIX = "-----BEGIN "


class UnresolvedReference(LookupError):
    """A reference points nowhere; the message names the reference and never a value."""

    transient = False


def resolve(ref: Reference, settings: Settings, where: str) -> str:
    """Return the referenced value; `where` names the catalog key for the error message."""
    if ref.env:
        value = os.environ.get(ref.env)
        if not value:
            raise UnresolvedReference(f"{where}: environment variable {ref.env} is not set or empty")
        remember_resolved(value)
        return value
    if ref.file:
        path = reference_path(ref, settings)
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise UnresolvedReference(f"{where}: cannot read secret file {path}: {exc.strerror}") from exc
        if not value:
            raise UnresolvedReference(f"{where}: secret file {path} is empty")
        remember_resolved(value)
        return value
    if ref.service == "demo_api":
        from ingestion_assets.stack.demo_api import DemoApiProcess

        return DemoApiProcess.for_settings(settings).ensure_running().url
    assert ref.embedded is not None
    server = settings.embedded.ensure_running()
    return server.url(ref.embedded)


def reference_path(ref: Reference, settings: Settings) -> Path:
    """A `file` reference's path; `${INGEST_HOME}` in it is this installation's home folder."""
    assert ref.file is not None
    return Path(ref.file.replace("${INGEST_HOME}", str(settings.home))).expanduser()


def postgres_url(connection: Reference, tls: Tls | None, settings: Settings, where: str) -> str:
    """The connection URL of `where` (a catalog key such as sources.shop.connection), with the catalog's
    `tls` applied: sslmode verify-full, the CA file and the client certificate; a weaker URL is refused."""
    url = resolve(connection, settings, where)
    if tls is None:
        return url
    tls_where = f"{where.rsplit('.', 1)[0]}.tls"
    return with_verified_tls(url, tls_files(tls, settings, tls_where), tls_where)


def tls_files(tls: Tls, settings: Settings, where: str) -> TlsFiles:
    ca, cert, key = (
        None if ref is None else resolve_file(ref, settings, f"{where}.{name}")
        for name, ref in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key))
    )
    return TlsFiles(ca=ca, cert=cert, key=key)


def resolve_file(ref: Reference, settings: Settings, where: str) -> Path:
    """A certificate or key as a file libpq and OpenSSL can read.

    A `file` reference is used in place (it must be readable); an `env` reference holds a path, or the PEM
    text itself (as secret stores inject it), written to a 0600 file under INGEST_HOME/tls for this process;
    messages name that file by the reference."""
    if ref.file:
        path = reference_path(ref, settings)
        if not os.access(path, os.R_OK):
            raise UnresolvedReference(f"{where}: cannot read the file {path} (missing, or not readable by us)")
        return path
    if not ref.env:
        raise UnresolvedReference(f"{where}: a certificate or key is a `file` or `env` reference")
    value = resolve(ref, settings, where)
    if not value.startswith(PEM_PREFIX):
        return resolve_file(Reference(file=value), settings, f"{where} (env {ref.env})")
    path = pem_file(settings.home / "tls", value)
    remember_origin(path, ref.describe())  # libpq's and OpenSSL's errors name the file: say what the user wrote
    return path
