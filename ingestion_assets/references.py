"""Resolve catalog references (env var, secret file, embedded database, project service) at run time."""

from __future__ import annotations

import os
from pathlib import Path

from ingestion_assets.catalog import Reference
from ingestion_assets.settings import Settings


class UnresolvedReference(LookupError):
    """A reference points nowhere; the message names the reference and never a value."""

    transient = False


def resolve(ref: Reference, settings: Settings, where: str) -> str:
    """Return the referenced value; `where` names the catalog key for the error message."""
    if ref.env:
        value = os.environ.get(ref.env)
        if not value:
            raise UnresolvedReference(f"{where}: environment variable {ref.env} is not set or empty")
        return value
    if ref.file:
        path = reference_path(ref, settings)
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise UnresolvedReference(f"{where}: cannot read secret file {path}: {exc.strerror}") from exc
        if not value:
            raise UnresolvedReference(f"{where}: secret file {path} is empty")
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
