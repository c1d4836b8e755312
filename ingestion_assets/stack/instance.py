"""The Dagster instance on the embedded stack: storage database, dagster.yaml, environment."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ingestion_assets.settings import Settings

DAGSTER_DATABASE = "dagster"
_HEADER = "# written by `ingest up`; the embedded PostgreSQL under INGEST_HOME holds all storage\n"
_OURS = (
    "# This file is ours: every `ingest` command that opens the instance writes it again (the storage URL follows\n"
    "# the embedded server: a restore or promotion moves it). A hand edit is replaced, with a WARNING, and kept\n"
    "# beside it as dagster.yaml.edited-<time>. A storage of your own: a DAGSTER_HOME of your own (README).\n"
)
_SEAL = "# ingest: sha256="  # the digest of what we wrote above it: a file that no longer matches was edited


def bring_up(settings: Settings, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """Start the embedded server, create Dagster's database, write the instance's dagster.yaml.

    Returns the environment under which `dagster` commands use this instance. A dagster.yaml edited by hand is
    replaced all the same (the `ingest` commands work on the embedded storage only), never silently: `warn`
    (else a logged warning) names the file, the settings replaced and the copy kept of the edited file.
    """
    server = settings.embedded.ensure_running()
    server.ensure_database(DAGSTER_DATABASE)
    settings.dagster_home.mkdir(parents=True, exist_ok=True)
    config = instance_config(server.url(DAGSTER_DATABASE, driver="psycopg2"), settings)
    target = settings.dagster_home / "dagster.yaml"
    body = _HEADER + _OURS + yaml.safe_dump(config, sort_keys=False)
    text = f"{body}{_SEAL}{_digest(body)}\n"
    found = target.read_text() if target.exists() else None
    if found == text:
        return instance_env(settings)
    if found is not None and _edited(found, _HEADER + yaml.safe_dump(config, sort_keys=False)):
        kept = _keep_edited(target, found)
        (warn or logging.getLogger(__name__).warning)(_replaced(target, found, config, kept))
    target.write_text(text)
    return instance_env(settings)


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _edited(text: str, unsealed: str) -> bool:
    """Whether `text` is not what we wrote: its seal does not match it; a file without a seal (written by a
    version before it) is ours only if it says what that version would write now (`unsealed`)."""
    body, _, seal = text.rpartition(_SEAL)
    return seal.strip() != _digest(body) if body else text != unsealed


def _keep_edited(target: Path, text: str) -> Path:
    kept = target.with_name(f"{target.name}.edited-{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}")
    kept.write_text(text)
    kept.chmod(target.stat().st_mode & 0o777)
    return kept


def _replaced(target: Path, found: str, config: dict[str, Any], kept: Path) -> str:
    """What the warning says: which settings the edit had changed (names, never values: a URL may hold a
    password), where the edited file went, and where settings of one's own belong."""
    try:
        edited = yaml.safe_load(found)
    except yaml.YAMLError:
        edited = None
    changed = _differences(edited, config) if isinstance(edited, dict) else ["(the file does not parse as YAML)"]
    return (
        f"{target} was edited by hand ({', '.join(changed) or 'comments only'}); it is written by ingest and "
        f"was rewritten: the `ingest` commands use the embedded storage under INGEST_HOME only. The edited file is "
        f"kept as {kept}. For a storage of your own, give `dagster` a DAGSTER_HOME of its own (the repository's "
        f"dagster.yaml shows the settings; README: Scale-out), not INGEST_HOME/dagster"
    )


def _differences(edited: Any, ours: Any, where: str = "") -> list[str]:
    if isinstance(edited, dict) and isinstance(ours, dict):
        keys = list(dict.fromkeys([*ours, *edited]))
        return [d for key in keys for d in _differences(edited.get(key), ours.get(key), f"{where}{key}.")]
    return [] if edited == ours else [where.rstrip(".")]


def instance_env(settings: Settings) -> dict[str, str]:
    return {
        "INGEST_HOME": str(settings.home),
        "INGEST_CATALOG": str(settings.catalog_path),
        "DAGSTER_HOME": str(settings.dagster_home),
    }


def instance_config(storage_url: str, settings: Settings) -> dict[str, Any]:
    """The same shape as the repository's dagster.yaml, with the embedded server's URL filled in."""
    return {
        "storage": {"postgres": {"postgres_url": storage_url}},
        "local_artifact_storage": {
            "module": "dagster._core.storage.root",
            "class": "LocalArtifactStorage",
            "config": {"base_dir": str(settings.dagster_home / "storage")},
        },
        "concurrency": {
            "runs": {"max_concurrent_runs": 8},
            "pools": {"default_limit": 4, "granularity": "op"},
        },
        # with the daemon: runs that ended without freeing their pool slots (terminated, crashed) free them
        "run_monitoring": {"enabled": True, "poll_interval_seconds": 30, "free_slots_after_run_end_seconds": 10},
        "telemetry": {"enabled": False},
    }
