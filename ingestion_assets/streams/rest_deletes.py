"""Deletes for API streams: deletion markers applied with the slice that carries them, and the periodic key
listing that retires the keys an API no longer serves (with the figures a reconciliation reports)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from ingestion_assets.catalog.rest import DeletionMarker, KeyListing, RestDeletes
from ingestion_assets.loading.dead_letters import key_part
from ingestion_assets.loading.metadata_columns import DELETED_AT, POSITION, version_text
from ingestion_assets.loading.parked import release_parked
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.target_keys import Key, TargetKeys, key_text, last_listing, record_listing
from ingestion_assets.sources.rest import EndpointSpec, RestClient, read_pages
from ingestion_assets.sources.rest.incremental import order_key, usable

logger = logging.getLogger(__name__)
SAMPLE = 10


def is_deletion(record: dict[str, Any], marker: DeletionMarker) -> bool:
    """Whether the record is a tombstone; types must match too (`1` is not `true`)."""
    value = record.get(marker.field)
    return any(type(value) is type(wanted) and value == wanted for wanted in marker.values)


def newest_per_key(
    records: list[dict[str, Any]], primary_key: tuple[str, ...], cursor: str | None, stream: str = ""
) -> list[dict[str, Any]]:
    """Each key's newest record of a slice, in the order the keys were first served.

    Newest is the greater cursor; on equal cursors, the copy served later (what the server said last: a server
    that lists one key twice with one cursor changed it in between). A tombstone carrying only its key has no
    cursor: it is placed by when it was read, newer than every copy served before it and older than every copy
    served after it, so a live version read after it wins. Without a cursor (full reads) the later copy wins.
    """
    newest: dict[Key, dict[str, Any]] = {}
    differing = 0
    for record in records:
        key = tuple(record[k] for k in primary_key)
        held = newest.get(key)
        if held is None:
            newest[key] = record
            continue
        new, old = (record.get(cursor), held.get(cursor)) if cursor else (None, None)
        if cursor and usable(new) and usable(old):
            if order_key(new) < order_key(old):
                continue
            differing += order_key(new) == order_key(old) and record != held
        newest[key] = record
    if differing:
        logger.warning(
            "%s: %d key(s) served twice in one slice with the same cursor and different values: the copy served "
            "last is loaded",
            stream or "an API stream",
            differing,
        )
    return list(newest.values())


def load_slice(
    loader: Loader,
    records: list[dict[str, Any]],
    dead_letters: pa.Table | None,
    deletes: RestDeletes | None,
    column_hints: dict[str, dict[str, Any]] | None = None,
    cursor: str | None = None,
    stream: str = "",
) -> int:
    """Load a slice's records and apply its deletions; returns the rows loaded.

    Under merge only each key's newest record in the slice counts (`newest_per_key`), so a record deleted
    and created again within one slice ends live, one updated then deleted ends deleted, and a tombstone older
    than a live version of its key in the slice deletes nothing. Across slices and runs the target's version
    decides (`_not_older`, `_not_outdated`). Deletions are applied after the load and before the checkpoint: a
    crash in between re-reads the slice and applies them again, which changes nothing the second time.
    """
    merge = loader.target.write_disposition == "merge"
    if merge:
        records = newest_per_key(records, loader.target.primary_key, cursor, stream)
    # `_ingest_position` is text (version_text), also where a slice holds only versionless tombstones (NULL)
    hints = {**(column_hints or {}), POSITION: {"data_type": "text"}}
    keys = TargetKeys(loader)
    guarded = merge and cursor is not None and not loader.append_only  # the initial load: nothing to compare
    marker = deletes.marker if deletes is not None else None
    if marker is None:
        if guarded:
            assert cursor is not None
            records = _not_older(keys, records, cursor, stream)
        return loader.load_records(records, dead_letters=dead_letters, column_hints=hints)
    assert deletes is not None
    newest = {_key(r, loader): r for r in records}
    live = [r for r in newest.values() if not is_deletion(r, marker)]
    if guarded:
        assert cursor is not None
        live = _not_older(keys, live, cursor, stream)
    deleted = {key: r for key, r in newest.items() if is_deletion(r, marker)}
    deleted = _not_outdated(keys, deleted, cursor, stream)
    present = keys.existing(deleted) if deleted and deletes.mode == "soft" else set()
    if deletes.mode == "soft":  # a key deleted before we ever saw it: its tombstone is its last known state
        now = dt.datetime.now(dt.UTC)
        live += [{**r, DELETED_AT: now, POSITION: _version(r, cursor)} for k, r in deleted.items() if k not in present]
    loaded = loader.load_records(live, dead_letters=dead_letters, column_hints=hints)
    if deletes.mode == "hard":
        keys.delete(deleted)
    else:  # the row keeps its last values; its version becomes the tombstone's cursor, if it carries one
        versions = {key: v for key, r in deleted.items() if key in present and (v := _version(r, cursor)) is not None}
        keys.mark_deleted(present, versions)
    if deleted:  # a key parked before (a record that could not load) is settled by its deletion
        release_parked(loader, ["|".join(key_part(str(part)) for part in key) for key in deleted])
    return loaded


def _key(record: dict[str, Any], loader: Loader) -> Key:
    return tuple(record[k] for k in loader.target.primary_key)


def _version(record: dict[str, Any], cursor: str | None) -> str | None:
    """A record's version as the target holds it; None for a tombstone carrying only its key: its read time is
    our clock, not the API's, so it orders against no server cursor (a key re-created after it must load)."""
    return version_text(record[cursor]) if cursor and usable(record.get(cursor)) else None


def _not_older(
    keys: TargetKeys, records: list[dict[str, Any]], cursor: str, stream: str
) -> list[dict[str, Any]]:
    """The live records to load (one per key): a record whose cursor is older than the version the target holds
    for its key (an API listing one key's versions newest first, across slices or runs) is left out, so it
    never overwrites the newer one; on an equal cursor the later load wins. A soft-deleted row's version is its
    tombstone's cursor (or its last live version's, the tombstone carrying none): an older copy does not bring
    it back, a re-creation does. A row without a version (a key first seen as a tombstone with only its key)
    holds nothing back."""
    older = _older_than_target(keys, {_key(r, keys.loader): r for r in records if usable(r.get(cursor))}, cursor)
    if not older:
        return records
    logger.info("%s: %d record(s) older than the version the target holds: not loaded", stream, len(older))
    return [r for r in records if _key(r, keys.loader) not in older]


def _not_outdated(
    keys: TargetKeys, deleted: dict[Key, dict[str, Any]], cursor: str | None, stream: str
) -> dict[Key, dict[str, Any]]:
    """The tombstones to apply: one with a cursor deletes only a target row no newer than itself (a tombstone from
    before its key's re-creation, met in a later slice of a list not in cursor order, deletes nothing); one with
    only its key is placed by when it was read, after every row loaded before it, and always applies."""
    if cursor is None or not (dated := {key: r for key, r in deleted.items() if usable(r.get(cursor))}):
        return deleted
    outdated = _older_than_target(keys, dated, cursor)
    if outdated:
        logger.info("%s: %d tombstone(s) older than the row the target holds: not applied", stream, len(outdated))
    return {key: r for key, r in deleted.items() if key not in outdated}


def _older_than_target(keys: TargetKeys, dated: dict[Key, dict[str, Any]], cursor: str) -> set[Key]:
    """The keys whose record's cursor is older than the version the target holds (compared as the API's cursors
    are: numbers by value, timestamps as moments with their offsets, other text as text)."""
    held = keys.positions(dated) if dated else {}
    return {
        key
        for key, record in dated.items()
        if (stored := held.get(key)) is not None and order_key(version_text(record[cursor])) < order_key(stored)
    }


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
