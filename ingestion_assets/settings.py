"""Where the product keeps its files (INGEST_HOME) and which catalog it reads (INGEST_CATALOG)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingestion_assets.stack.embedded import EmbeddedPostgres

DEFAULT_HOME = ".ingest"


def demo_catalog_path() -> Path:
    return Path(__file__).parent / "demo" / "catalog.yaml"


@dataclass(frozen=True)
class Settings:
    """Resolved once per process from the environment, then passed explicitly."""

    home: Path
    catalog_path: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("INGEST_HOME") or DEFAULT_HOME).expanduser().resolve()
        catalog = env.get("INGEST_CATALOG")
        return cls(home=home, catalog_path=Path(catalog).expanduser().resolve() if catalog else demo_catalog_path())

    @property
    def embedded(self) -> EmbeddedPostgres:
        """INGEST_HOME/pg, or the server a standby promotion or a storage restore made primary."""
        from ingestion_assets.stack.durability import active_server

        return active_server(self.home)

    @property
    def warehouse_path(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def dagster_home_conflict(self, environ: Mapping[str, str] | None = None) -> str | None:
        """Why the `ingest` commands must not run here, if DAGSTER_HOME names another instance than theirs.

        `dagster` commands read DAGSTER_HOME; the `ingest` commands read and bring up INGEST_HOME's instance.
        When the two differ, runs would checkpoint into one instance while `ingest status`, `state` and
        `storage` read or restore the other: "never synced" after good runs, resets that miss their stream."""
        env = os.environ if environ is None else environ
        given = env.get("DAGSTER_HOME")
        if not given or Path(given).expanduser().resolve() == self.dagster_home.resolve():
            return None
        return (
            f"DAGSTER_HOME is {Path(given).expanduser().resolve()}, but the instance of INGEST_HOME "
            f"({self.home}) is {self.dagster_home}: `dagster` commands would use the first while `ingest` reads "
            f'and changes the second. Set DAGSTER_HOME={self.dagster_home} (`eval "$(ingest env)"`) or unset '
            "it; or set INGEST_HOME to the folder whose `dagster/` DAGSTER_HOME is"
        )

    @property
    def dlt_dir(self) -> Path:
        return self.home / "dlt"
