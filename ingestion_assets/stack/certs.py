"""A private certificate authority (openssl) for the embedded stack's mutual TLS: CA, server and client certificates."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class CertificateError(RuntimeError):
    """openssl failed; the message carries its own words."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path


def make_ca(folder: Path, name: str, days: int = 3650) -> Issued:
    """A self-signed CA; its key signs the server and client certificates and nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    issued = Issued(folder / f"{name}.crt", folder / f"{name}.key")
    ca_extensions = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    files = ["-keyout", str(issued.key), "-out", str(issued.cert)]
    _openssl(["req", "-x509", *_EC_KEY, *files, "-days", str(days), "-subj", f"/CN={name}", *ca_extensions])
    issued.key.chmod(0o600)
    return issued


def issue(
    ca: Issued, folder: Path, name: str, common_name: str, hosts: tuple[str, ...] = (), days: int = 825
) -> Issued:
    """A leaf certificate signed by `ca`: for a server, `hosts` are its names (subjectAltName DNS or IP);
    for a client, `common_name` is the database role it logs in as (PostgreSQL `cert` authentication)."""
    folder.mkdir(parents=True, exist_ok=True)
    issued = Issued(folder / f"{name}.crt", folder / f"{name}.key")
    names = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    extensions = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'serverAuth' if hosts else 'clientAuth'}",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid",
    ] + ([f"subjectAltName={names}"] if names else [])
    with tempfile.TemporaryDirectory(prefix="ingest-certs-") as scratch:
        request, extfile = Path(scratch) / "req.csr", Path(scratch) / "ext.cnf"
        extfile.write_text("\n".join(extensions) + "\n")
        subject = ["-subj", f"/CN={common_name}"]
        _openssl(["req", "-new", *_EC_KEY, "-keyout", str(issued.key), "-out", str(request), *subject])
        signer = ["-CA", str(ca.cert), "-CAkey", str(ca.key), "-set_serial", str(int.from_bytes(os.urandom(8), "big"))]
        output = ["-days", str(days), "-out", str(issued.cert), "-extfile", str(extfile)]
        _openssl(["x509", "-req", "-in", str(request), *signer, *output])
    issued.key.chmod(0o600)  # libpq and PostgreSQL refuse a private key that others can read
    return issued


def _openssl(args: list[str]) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed (exit {result.returncode}): {result.stderr.strip()[-400:]}")
