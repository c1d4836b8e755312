"""Deletes for API streams: deletion markers applied with the slice that carries them, under the version guard and
what the target remembers of earlier deletions (the periodic key listing: rest_key_listing.py)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pyarrow as pa

from ingestion_assets.catalog.rest import DeletionMarker, RestDeletes
from ingestion_assets.loading.dead_letters import key_part
from ingestion_assets.loading.metadata_columns import DELETED_AT, GENERATION, POSITION, version_text
from ingestion_assets.loading.parked import release_parked
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.target_keys import Key, TargetKeys, key_text
from ingestion_assets.loading.tombstones import Tombstones, fingerprint
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
    decides (`_not_older`, `_not_outdated`), and what it remembers of its deletions (`_ingest_tombstones`): a
    tombstone carrying only its key served again after its key's re-creation deletes nothing (`_not_replayed`),
    a hard-deleted key keeps the version it was deleted at. Deletions are applied after the load and before the
    checkpoint: a crash in between re-reads the slice and applies them again, which changes nothing the second
    time.
    """
    merge = loader.target.write_disposition == "merge"
    served = records
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
    hard = deletes.mode == "hard"
    # what the target remembers of its deletions: streams with a cursor (a full read has no versions to compare)
    generation = records[0].get(GENERATION) if records else None
    # per stream (its name, not its table's: a refresh reads into a shadow table, then swapped in) and generation
    memory = Tombstones(loader, stream or loader.stream_name, generation) if merge and cursor and generation else None
    newest = {_key(r, loader): r for r in records}
    live = [r for r in newest.values() if not is_deletion(r, marker)]
    if guarded:
        assert cursor is not None
        live = _not_older(keys, live, cursor, stream, memory if hard else None)
    deleted = {key: r for key, r in newest.items() if is_deletion(r, marker)}
    deleted = _not_outdated(keys, deleted, cursor, stream, memory if hard else None)
    keyless: dict[tuple[Key, str], str | None] = {}
    if memory is not None:
        assert cursor is not None
        keyless = _keyless_tombstones(keys, served, marker, cursor)
        deleted = _not_replayed(keys, memory, deleted, keyless, cursor, stream)
    present = keys.existing(deleted) if deleted and deletes.mode == "soft" else set()
    if deletes.mode == "soft":  # a key deleted before we ever saw it: its tombstone is its last known state
        now = dt.datetime.now(dt.UTC)
        live += [{**r, DELETED_AT: now, POSITION: _version(r, cursor)} for k, r in deleted.items() if k not in present]
    loaded = loader.load_records(live, dead_letters=dead_letters, column_hints=hints)
    if hard:
        last = keys.positions(deleted) if memory is not None and deleted else {}
        keys.delete(deleted)
        if memory is not None:  # the version each key was deleted at: its tombstone's cursor, else its row's last
            gone = {key: _version(r, cursor) or last.get(key) for key, r in deleted.items()}
            memory.remember_deleted({key: version for key, version in gone.items() if version is not None})
    else:  # the row keeps its last values; its version becomes the tombstone's cursor, if it carries one
        versions = {key: v for key, r in deleted.items() if key in present and (v := _version(r, cursor)) is not None}
        keys.mark_deleted(present, versions)
    if memory is not None:  # after the deletions: a crash before this applies them again on the re-read
        memory.remember_seen(keyless)
    if deleted:  # a key parked before (a record that could not load) is settled by its deletion
        release_parked(loader, ["|".join(key_part(str(part)) for part in key) for key in deleted])
    return loaded


def _keyless_tombstones(
    keys: TargetKeys, served: list[dict[str, Any]], marker: DeletionMarker, cursor: str
) -> dict[tuple[Key, str], str | None]:
    """The slice's tombstones carrying only their key, as (key, fingerprint) -> the newest version their key had
    when each was served: the target's, or that of a copy of the key served before it in the slice (None: none)."""
    keyless = [r for r in served if is_deletion(r, marker) and not usable(r.get(cursor))]
    if not keyless:
        return {}
    known: dict[Key, str | None] = dict(keys.positions({_key(r, keys.loader) for r in keyless}))
    found: dict[tuple[Key, str], str | None] = {}
    for record in served:
        key = _key(record, keys.loader)
        if usable(record.get(cursor)):
            version, held = version_text(record[cursor]), known.get(key)
            if held is None or order_key(version) > order_key(held):
                known[key] = version
        elif is_deletion(record, marker):
            found.setdefault((key, fingerprint(record)), known.get(key))
    return found


def _not_replayed(
    keys: TargetKeys,
    memory: Tombstones,
    deleted: dict[Key, dict[str, Any]],
    keyless: dict[tuple[Key, str], str | None],
    cursor: str,
    stream: str,
) -> dict[Key, dict[str, Any]]:
    """The tombstones to apply, less those carrying only their key that were seen before (the same fields and
    values) while their key held an older version than the live row the target holds now: the key was created
    again after that tombstone, which is no deletion of the new version, only the old one served again."""
    mine = {key: fingerprint(r) for key, r in deleted.items() if not usable(r.get(cursor))}
    before = memory.seen(mine.items()) if mine else {}
    if not before:
        return deleted
    rows = keys.held(key for key, print_ in mine.items() if (key, print_) in before)
    replayed = set()
    for key, print_ in mine.items():
        version, live = rows.get(key, (None, False))
        if (key, print_) in before and live and version is not None:
            then = before[(key, print_)]
            if then is None or order_key(version) > order_key(then):
                replayed.add(key)
    if replayed:
        sample = ", ".join(key_text(k) for k in sorted(replayed, key=repr)[:SAMPLE])
        logger.warning(
            "%s: %d tombstone(s) carrying only their key served again after their key was created again (a newer "
            "version loaded since): not applied (keys %s). The same tombstone was applied before; a key deleted "
            "again whose tombstone carries exactly the same fields cannot be told from it: a key listing "
            "(deletes.key_listing) or the cursor field in tombstones would",
            stream,
            len(replayed),
            sample,
        )
    return {key: r for key, r in deleted.items() if key not in replayed}


def _key(record: dict[str, Any], loader: Loader) -> Key:
    return tuple(record[k] for k in loader.target.primary_key)


def _version(record: dict[str, Any], cursor: str | None) -> str | None:
    """A record's version as the target holds it; None for a tombstone carrying only its key: its read time is
    our clock, not the API's, so it orders against no server cursor (a key re-created after it must load)."""
    return version_text(record[cursor]) if cursor and usable(record.get(cursor)) else None


def _not_older(
    keys: TargetKeys, records: list[dict[str, Any]], cursor: str, stream: str, memory: Tombstones | None = None
) -> list[dict[str, Any]]:
    """The live records to load (one per key): a record whose cursor is older than the version the target holds
    for its key (an API listing one key's versions newest first, across slices or runs) is left out, so it
    never overwrites the newer one; on an equal cursor the later load wins. A soft-deleted row's version is its
    tombstone's cursor (or its last live version's, the tombstone carrying none): an older copy does not bring
    it back, a re-creation does. A row without a version (a key first seen as a tombstone with only its key)
    holds nothing back. Under `hard` (`memory`), a key the target no longer holds is compared with the version it
    was deleted at, as a soft-deleted row would be."""
    dated = {_key(r, keys.loader): r for r in records if usable(r.get(cursor))}
    older = _older_than_target(keys, dated, cursor, memory)
    if not older:
        return records
    logger.info("%s: %d record(s) older than the version the target holds: not loaded", stream, len(older))
    return [r for r in records if _key(r, keys.loader) not in older]


def _not_outdated(
    keys: TargetKeys,
    deleted: dict[Key, dict[str, Any]],
    cursor: str | None,
    stream: str,
    memory: Tombstones | None = None,
) -> dict[Key, dict[str, Any]]:
    """The tombstones to apply: one with a cursor deletes only a target row no newer than itself (a tombstone from
    before its key's re-creation, met in a later slice of a list not in cursor order, deletes nothing); one with
    only its key is placed by when it was read, after every row loaded before it, and always applies."""
    if cursor is None or not (dated := {key: r for key, r in deleted.items() if usable(r.get(cursor))}):
        return deleted
    outdated = _older_than_target(keys, dated, cursor, memory)
    if outdated:
        logger.info("%s: %d tombstone(s) older than the row the target holds: not applied", stream, len(outdated))
    return {key: r for key, r in deleted.items() if key not in outdated}


def _older_than_target(
    keys: TargetKeys, dated: dict[Key, dict[str, Any]], cursor: str, memory: Tombstones | None = None
) -> set[Key]:
    """The keys whose record's cursor is older than the version the target holds (compared as the API's cursors
    are: numbers by value, timestamps as moments with their offsets, other text as text), or, for a key it no
    longer holds, than the version the key was hard-deleted at (`memory`)."""
    held = keys.positions(dated) if dated else {}
    if memory is not None and (absent := [key for key in dated if key not in held]):
        held = {**held, **memory.deleted_versions(absent)}
    return {
        key
        for key, record in dated.items()
        if (stored := held.get(key)) is not None and order_key(version_text(record[cursor])) < order_key(stored)
    }
