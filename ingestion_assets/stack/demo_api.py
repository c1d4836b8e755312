"""The demo SaaS API as a background process under INGEST_HOME, with its client secrets in files."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ingestion_assets.settings import Settings

SECRETS = {"demo_api_client_id": "client_id", "demo_api_client_secret": "client_secret"}


@dataclass(frozen=True)
class DemoApiProcess:
    root: Path  # INGEST_HOME/demo_api: data, port, pid, log
    secrets: Path  # INGEST_HOME/secrets: the client's credentials, one file each

    @classmethod
    def for_settings(cls, settings: Settings) -> DemoApiProcess:
        return cls(settings.home / "demo_api", settings.home / "secrets")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port()}"

    def ensure_running(self) -> DemoApiProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock():
            self._write_client_secrets()
            if not self.is_running():
                self.stop()  # one that did not answer in time (a loaded machine) would be left behind for good
                self._start()
        return self

    def is_running(self) -> bool:
        try:
            port = self._port()
        except (OSError, ValueError):
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int((self.root / "pid").read_text()), 15)

    def mutate(self, resource: str, inserts: int, updates: int) -> None:
        """What changes between two syncs of a live API (the demo's admin endpoint)."""
        import httpx

        from ingestion_assets.demo.api_server import DemoConfig

        response = httpx.post(
            f"{self.url}/admin/mutate",
            json={"resource": resource, "inserts": inserts, "updates": updates},
            headers={"Authorization": f"Bearer {DemoConfig().admin_token}"},
            timeout=30,
        )
        response.raise_for_status()

    def _start(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        log = (self.root / "server.log").open("ab")
        command = [
            sys.executable,
            "-m",
            "ingestion_assets.demo.api_server",
            "--port",
            str(port),
            "--data-dir",
            str(self.root),
        ]
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.root,
        )
        (self.root / "pid").write_text(str(process.pid))
        (self.root / "port").write_text(str(port))
        deadline = time.monotonic() + 20
        while not self.is_running():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the demo API did not start; see {self.root / 'server.log'}")
            time.sleep(0.05)

    def _port(self) -> int:
        return int((self.root / "port").read_text().strip())

    def _write_client_secrets(self) -> None:
        """The demo's OAuth client, as a user would keep it: one file per secret, mode 0600."""
        from ingestion_assets.demo.api_server import DemoConfig
        from ingestion_assets.sources.rest.secret_store import FileSecretStore

        store = FileSecretStore(self.secrets)
        config = DemoConfig()
        for name, field in SECRETS.items():
            if not store.path(name).exists():
                store.write(name, getattr(config, field))

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with (self.root / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
