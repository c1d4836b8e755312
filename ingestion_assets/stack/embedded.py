"""The embedded PostgreSQL server that holds Dagster's storage and the demo source, under INGEST_HOME."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL

import psycopg2
from psycopg2 import sql

from ingestion_assets.stack.host import (
    SYSTEM_USER,
    EmbeddedServerError,
    free_port,
    grant_to,
    run_as_user,
    user_ids,
    wait_for_port,
    wheel_bin_dir,
)

__all__ = ["SYSTEM_USER", "EmbeddedPostgres", "EmbeddedServerError", "run_as_user", "user_ids"]

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
            return wheel_bin_dir()

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
            server_tls.write_server_config(self, user_ids(SYSTEM_USER) if run_as_user() else None)

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
        user = run_as_user()
        if user is not None:
            grant_to(user, self.root, self.data_dir, self.bin_dir())
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
        port = free_port(self._previous_port())
        self.port_file.write_text(str(port))
        if run_as_user() is not None and self.log_file.exists():
            os.chown(self.log_file, *user_ids(SYSTEM_USER))
        result = self._pg_ctl(["-w", "-t", "60", "-l", str(self.log_file), "-o", f"-p {port}", "start"], check=False)
        if result.returncode != 0:
            raise EmbeddedServerError(
                f"embedded PostgreSQL failed to start (exit {result.returncode}); see {self.log_file}: "
                f"{result.stderr.strip()[-500:]}"
            )
        wait_for_port(port)

    def include_conf(self, name: str) -> None:
        """Have postgresql.conf include `name` (a file in the data folder; takes effect at the next start)."""
        conf, line = self.data_dir / "postgresql.conf", f"include_if_exists = '{name}'"
        if line not in conf.read_text():
            with conf.open("a") as handle:
                handle.write(f"\n# ingestion_assets\n{line}\n")
        if run_as_user() is not None and (self.data_dir / name).exists():
            os.chown(self.data_dir / name, *user_ids(SYSTEM_USER))

    def prepare_root(self, bin_dir: Path) -> None:
        """A folder for a server whose data comes from elsewhere (a base backup): owned by its user."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "bin_dir").write_text(str(bin_dir))
        if run_as_user() is not None:
            os.chown(self.root, *user_ids(SYSTEM_USER))

    def run_tool(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """One of the server's programs (pg_basebackup, pg_ctl ...) as the server's user."""
        return self._run(argv)

    def _pg_ctl(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(["pg_ctl", "-D", str(self.data_dir), *args], check=check)

    def _previous_port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir() / argv[0]), *argv[1:]]
        user = run_as_user()
        if user is not None:  # `runuser` rather than subprocess(user=...), which forks without vfork
            command = ["runuser", "-u", user, "--", *command]
        # libpq's messages come in the server's and the locale's encoding, not always UTF-8: never a decode crash
        result = subprocess.run(
            command, capture_output=True, encoding="utf-8", errors="replace", check=False, cwd="/", stdin=DEVNULL
        )
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
