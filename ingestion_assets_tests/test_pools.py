"""Sizing a source's Dagster concurrency pool: several processes size a new pool at once (two CLI runs of a new
source started together before `ingest up`), and each ends with the catalog's size, none with an error."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ingestion_assets.catalog import Catalog, load_catalog
from ingestion_assets.definitions import defs
from ingestion_assets.defs.assets import pool_name
from ingestion_assets.settings import Settings
from ingestion_assets.state.summary import size_pools

SIZERS = 4
ROUNDS = 15


def _catalog(tmp_path: Path, source: str, slots: int) -> Path:
    path = tmp_path / "catalog.yaml"
    stream = {"path": "/feed", "primary_key": "id"}
    source_spec = {
        "type": "rest",
        "base_url": "http://127.0.0.1:9/",
        "max_concurrency": slots,
        "streams": {"s": stream},
    }
    path.write_text(yaml.safe_dump({"sources": {source: source_spec}}))
    return path


def _size(gate: threading.Barrier, errors: list[BaseException], settings: Settings, catalog: Catalog) -> None:
    """One process's sizing, released with the others by the barrier."""
    gate.wait()
    try:
        size_pools(settings, catalog)
    except Exception as exc:  # noqa: BLE001 - the test reports whatever a sizer raised
        errors.append(exc)


def test_sizers_started_together_on_a_new_pool_all_succeed(
    tmp_path: Path, session_settings: Settings, instance: dg.DagsterInstance
) -> None:
    """The first sizing of a pool inserts its row: two at once both inserted, and the loser failed with a raw
    unique violation on `concurrency_limits_concurrency_key_key` (PostgreSQL aborts its transaction)."""
    source = f"pools_{uuid.uuid4().hex[:8]}"
    catalog = load_catalog(_catalog(tmp_path, source, 3))
    settings = Settings(home=session_settings.home, catalog_path=tmp_path / "catalog.yaml")
    storage = instance.event_log_storage
    try:
        for _ in range(ROUNDS):
            storage.delete_concurrency_limit(pool_name(source))  # a new pool again
            gate = threading.Barrier(SIZERS)
            errors: list[BaseException] = []
            threads = [threading.Thread(target=_size, args=(gate, errors, settings, catalog)) for _ in range(SIZERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert not errors, f"a sizer failed: {errors[0]!r}"
            limits = {p.name: p for p in storage.get_pool_limits()}
            assert limits[pool_name(source)].limit == 3 and not limits[pool_name(source)].from_default
            assert storage.get_concurrency_info(pool_name(source)).slot_count == 3
    finally:
        storage.delete_concurrency_limit(pool_name(source))


def test_loading_the_definitions_sizes_each_source_pool_before_any_step_claims_it(
    tmp_path: Path, session_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `ingest up`, a run's first step created its pool with Dagster's default size (4, not the catalog's
    max_concurrency), and two runs doing so at once failed with the same unique violation inside Dagster: every
    run's definitions size the pools first."""
    source = f"pools_{uuid.uuid4().hex[:8]}"
    path = _catalog(tmp_path, source, 2)
    monkeypatch.setenv("INGEST_HOME", str(session_settings.home))
    monkeypatch.setenv("INGEST_CATALOG", str(path))
    monkeypatch.setenv("DAGSTER_HOME", str(session_settings.dagster_home))
    try:
        defs()
        limits = {p.name: p for p in instance.event_log_storage.get_pool_limits()}
        assert limits[pool_name(source)].limit == 2 and not limits[pool_name(source)].from_default
        instance.event_log_storage.set_concurrency_slots(pool_name(source), 5)  # sized on purpose: it stays
        path.write_text(path.read_text() + "# loaded again\n")  # another catalog text: the definitions are built again
        defs()
        limits = {p.name: p for p in instance.event_log_storage.get_pool_limits()}
        assert limits[pool_name(source)].limit == 5
    finally:
        instance.event_log_storage.delete_concurrency_limit(pool_name(source))
