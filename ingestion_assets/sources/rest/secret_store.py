"""Secrets by reference: a value that never prints itself, and a directory of files holding one secret each."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ingestion_assets.sources.redact import remember

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class SecretStoreError(LookupError):
    """A secret cannot be read or written; the message names the file, never the value."""


class Secret:
    """A secret value; its repr and str name where it came from, so logging one by mistake leaks nothing."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str = "a value given in code") -> None:
        self._value = value
        self.source = source
        remember(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(from {self.source})"

    __str__ = __repr__


class FileSecretStore:
    """One secret per file in `directory` (mode 0700, files 0600), replaced atomically on write.

    Rotated credentials (OAuth refresh tokens) are written back here, so a restarted process reads
    the newest one; a crash mid-write leaves the old file whole, never a torn one.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).expanduser()

    def path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise SecretStoreError(f"secret name {name!r} must be letters, digits, '.', '_' or '-'")
        return self.directory / name

    def read(self, name: str) -> Secret:
        path = self.path(name)
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise SecretStoreError(f"cannot read secret file {path}: {exc.strerror}") from exc
        if not value:
            raise SecretStoreError(f"secret file {path} is empty")
        return Secret(value, source=f"secret file {path}")

    def write(self, name: str, value: str | Secret) -> None:
        text = value.reveal() if isinstance(value, Secret) else value
        remember(text)
        path = self.path(name)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.")  # created with mode 0600
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            Path(temporary).unlink(missing_ok=True)
            raise SecretStoreError(f"cannot write secret file {path}: {exc.strerror}") from exc
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Hold the secret's lock file (shared by every process and thread that opens it) while in use."""
        path = self.path(name)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            handle = os.open(self.directory / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SecretStoreError(f"cannot lock secret file {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # closing releases the lock

    def ref(self, name: str) -> SecretRef:
        self.path(name)  # a bad name fails here, where the reference is made
        return SecretRef(self, name)


@dataclass(frozen=True)
class SecretRef:
    """A named secret in a store: read when needed, written back when it rotates."""

    store: FileSecretStore
    name: str

    def read(self) -> Secret:
        return self.store.read(self.name)

    def write(self, value: str | Secret) -> None:
        self.store.write(self.name, value)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return self.store.locked(self.name)

    def __str__(self) -> str:
        return f"secret file {self.store.path(self.name)}"
