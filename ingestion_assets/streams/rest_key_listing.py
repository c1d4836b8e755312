"""The periodic key listing of an API stream: every key the API serves, compared with the target, retiring the keys
it no longer serves (with the figures a reconciliation reports)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from ingestion_assets.catalog.rest import KeyListing, RestDeletes
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.target_keys import Key, TargetKeys, key_text, last_listing, record_listing
from ingestion_assets.sources.rest import EndpointSpec, RestClient, read_pages
from ingestion_assets.sources.rest.incremental import usable
from ingestion_assets.streams.rest_deletes import SAMPLE, is_deletion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyListingResult:
    """One key listing compared with the target; the fields a table's reconciliation reports."""

    compared: int  # live keys in the target compared with the listing
    listed: int  # keys the API serves
    missing: int  # served but not in the target: changed after the read, the next read brings them
    stale: int  # older in the target than on the server: a key listing carries no versions, so 0
    target_only: int  # live in the target, no longer served: deleted at the source
    deletions_applied: int
    refused: str | None = None  # why nothing was retired (a listing that would empty the target, say)
    sample: list[str] = field(default_factory=list)  # some retired (or refused) keys

    @property
    def passed(self) -> bool:
        return self.refused is None

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)


def listing_endpoint(endpoint: EndpointSpec, listing: KeyListing) -> EndpointSpec:
    """The stream's endpoint read in full (no cursor filter), or the configured keys endpoint."""
    return EndpointSpec(
        path=listing.path or endpoint.path,
        primary_key=endpoint.primary_key,
        records_path=endpoint.records_path if listing.records_path is None else listing.records_path,
        cursor_field=None,
        cursor_param=None,
        pagination=endpoint.pagination,
        page_size=listing.page_size or endpoint.page_size,
        params={**(endpoint.params if listing.path is None else {}), **listing.params},
    )


def retire_unlisted(
    client: RestClient, endpoint: EndpointSpec, loader: Loader, deletes: RestDeletes, stream: str
) -> KeyListingResult | None:
    """If the stream's listing is due: list every key the API serves, and retire the target's live keys it
    no longer lists (hard or soft). Runs after the read's final checkpoint, so every key in the target was
    read before the listing began: one the listing misses was deleted since, not created since."""
    listing = deletes.key_listing
    if listing is None or not _due(loader, stream, listing):
        return None
    began = dt.datetime.now(dt.UTC)
    served: set[Key] = set()
    doubt: str | None = None
    for page in read_pages(client, listing_endpoint(endpoint, listing), None):
        doubt = page.doubt or doubt
        served |= {
            tuple(r[k] for k in endpoint.primary_key)
            for r in page.records
            if all(usable(r.get(k)) for k in endpoint.primary_key)  # a keyless record names no target key
            and (deletes.marker is None or not is_deletion(r, deletes.marker))
        }
    keys = TargetKeys(loader)
    live = keys.live()
    gone = sorted(live - served, key=repr)
    sample = [key_text(k) for k in gone[:SAMPLE]]
    figures: dict[str, Any] = {
        "compared": len(live),
        "listed": len(served),
        "missing": len(served - live),
        "stale": 0,
        "target_only": len(gone),
    }
    if gone and doubt is not None:
        refused = (
            f"the key listing of {stream} may have ended early ({doubt}): nothing retired. A key it did not reach is "
            "no deleted key; check the stream's pagination"
        )
        result = KeyListingResult(**figures, deletions_applied=0, refused=refused, sample=sample)
    elif live and len(gone) > listing.max_retire_share * len(live):
        refused = (
            f"the key listing of {stream} would retire {len(gone):,} of {len(live):,} live keys, over "
            f"max_retire_share {listing.max_retire_share}: nothing retired. Check the listing's path and "
            "records_path (a listing that finds too few keys would empty the target), then raise the share "
            "if that many deletions are real"
        )
        result = KeyListingResult(**figures, deletions_applied=0, refused=refused, sample=sample)
    else:
        applied = keys.delete(gone) if deletes.mode == "hard" else keys.mark_deleted(gone)
        result = KeyListingResult(**figures, deletions_applied=applied, sample=sample)
    record_listing(loader, stream, began, result.as_metadata())
    logger.info("%s: key listing %s", stream, result.as_metadata())
    return result


def _due(loader: Loader, stream: str, listing: KeyListing) -> bool:
    last = last_listing(loader, stream)
    return last is None or dt.datetime.now(dt.UTC) - last >= dt.timedelta(hours=listing.every_hours)
