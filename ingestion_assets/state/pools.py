"""Each source's Dagster concurrency pool sized from the catalog, safely when several processes size it at once."""

from __future__ import annotations

import dagster as dg
from sqlalchemy.exc import IntegrityError

from ingestion_assets.catalog import Catalog

_ATTEMPTS = 5


def pool_name(source_name: str) -> str:
    """The Dagster concurrency pool that caps how many of a source's streams read at once."""
    return f"ingest_{source_name}"


def size_pools_of(instance: dg.DagsterInstance, catalog: Catalog, missing_only: bool = False) -> None:
    """Each source's pool gets the catalog's max_concurrency slots, so a backfill cannot flood it. A pool already
    of that size is left alone. `missing_only` (as the definitions of every run size them): only pools that do not
    exist yet or hold Dagster's default size; one sized on purpose (`dagster instance concurrency set`) stays."""
    storage = instance.event_log_storage
    sized = {pool.name: pool for pool in storage.get_pool_limits()}
    for source_name, source in catalog.sources.items():
        name = pool_name(source_name)
        found = sized.get(name)
        if found is not None and not found.from_default and (missing_only or found.limit == source.max_concurrency):
            continue
        set_pool(instance, name, source.max_concurrency)


def set_pool(instance: dg.DagsterInstance, name: str, slots: int) -> None:
    """Dagster creates a pool's row on its first sizing, after reading that there is none: two processes sizing a
    new pool at once (two runs of a new source started together) both insert it, and one failed with a raw unique
    violation on `concurrency_limits`. The row then exists: sizing it again updates it."""
    for attempt in range(_ATTEMPTS):
        try:
            instance.event_log_storage.set_concurrency_slots(name, slots)
            return
        except IntegrityError:
            if attempt == _ATTEMPTS - 1:
                raise
