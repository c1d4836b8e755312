"""What an API stream's target remembers of its deletions, in the table `_ingest_tombstones` of the source's dataset:

- each tombstone carrying only its key (no cursor) once seen, with the version its key held then, so the same
  tombstone served again after the key's re-creation (a newer version) was loaded deletes nothing;
- under `deletes: hard`, the version each key was deleted at, so an older live copy served after the deletion does
  not bring the key back (what a soft-deleted row's `_ingest_position` does under `soft`).

Rows are per stream and generation: `ingest refresh` starts afresh with its new table. A key is its values as JSON.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ingestion_assets.loading.metadata_columns import DELETED_AT, EXTRACTED_AT, GENERATION, META, POSITION
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists

Key = tuple[Any, ...]
TOMBSTONES = "_ingest_tombstones"
SEEN = "seen"  # a tombstone carrying only its key: `version` is what its key held when it was first seen
DELETED = "deleted"  # a key hard-deleted: `version` is the version it was deleted at
_CHUNK = 500
_OURS = frozenset({EXTRACTED_AT, POSITION, GENERATION, DELETED_AT, META})


def key_id(key: Key) -> str:
    return json.dumps(list(key), default=str, separators=(",", ":"))


def fingerprint(record: Mapping[str, Any]) -> str:
    """A tombstone's identity: its fields and values as the API served them (our metadata left out)."""
    fields = {k: v for k, v in record.items() if k not in _OURS}
    text = json.dumps(fields, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _text(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


class Tombstones:
    """One stream's (and generation's) remembered tombstones and hard-deleted versions in its target."""

    def __init__(self, loader: Loader, stream: str, generation: int) -> None:
        self.loader, self.stream, self.generation = loader, stream, int(generation)
        self._exists = False

    def seen(self, wanted: Iterable[tuple[Key, str]]) -> dict[tuple[Key, str], str | None]:
        """(key, fingerprint) -> the version its key held when that tombstone was first seen, for those seen before."""
        wanted = set(wanted)
        by_id = {(key_id(k), f): (k, f) for k, f in wanted}
        found: dict[tuple[Key, str], str | None] = {}
        for ident, tombstone, version in self._rows(SEEN, {k for k, _ in wanted}):
            if tombstone is not None and (ident, tombstone) in by_id:
                found[by_id[(ident, tombstone)]] = version
        return found

    def deleted_versions(self, keys: Iterable[Key]) -> dict[Key, str]:
        """key -> the version it was hard-deleted at, for those remembered."""
        keys = set(keys)
        by_id = {key_id(k): k for k in keys}
        return {by_id[i]: v for i, _, v in self._rows(DELETED, keys) if v is not None and i in by_id}

    def remember_seen(self, entries: Mapping[tuple[Key, str], str | None]) -> None:
        """Tombstones seen for the first time (those already remembered keep their first version)."""
        known = self.seen(entries)
        new = [(key_id(k), f, v) for (k, f), v in sorted(entries.items(), key=repr) if (k, f) not in known]
        if not new:
            return
        with self.loader.client() as client:
            table = self._create(client)
            for start in range(0, len(new), _CHUNK):
                self._insert(client, table, SEEN, new[start : start + _CHUNK])

    def remember_deleted(self, versions: Mapping[Key, str]) -> None:
        """The versions keys were hard-deleted at, replacing what was remembered for them."""
        if not versions:
            return
        rows = [(key_id(k), None, v) for k, v in sorted(versions.items(), key=repr)]
        with self.loader.client() as client:
            table = self._create(client)
            for start in range(0, len(rows), _CHUNK):  # a key's old version goes as its new one comes
                chunk = rows[start : start + _CHUNK]
                with client.begin_transaction():
                    ids = ", ".join(_text(ident) for ident, _, _ in chunk)
                    client.execute_sql(f"DELETE FROM {table} WHERE {self._where(DELETED)} AND record_key IN ({ids})")
                    self._insert(client, table, DELETED, chunk)

    def _rows(self, kind: str, keys: Iterable[Key]) -> Iterator[tuple[str, str | None, str | None]]:
        ids = sorted({key_id(k) for k in keys})
        if not ids:
            return
        with self.loader.client() as client:
            table = client.make_qualified_table_name(TOMBSTONES)
            if not self._exists and not table_exists(client, table):
                return
            self._exists = True
            for start in range(0, len(ids), _CHUNK):
                chunk = ", ".join(_text(i) for i in ids[start : start + _CHUNK])
                statement = (
                    f"SELECT record_key, tombstone, version FROM {table} "
                    f"WHERE {self._where(kind)} AND record_key IN ({chunk})"
                )
                for row in client.execute_sql(statement) or []:
                    yield str(row[0]), None if row[1] is None else str(row[1]), None if row[2] is None else str(row[2])

    def _insert(self, client: Any, table: str, kind: str, rows: Sequence[tuple[str, str | None, str | None]]) -> None:
        now = _text(dt.datetime.now(dt.UTC).isoformat())
        values = ", ".join(
            f"({_text(self.stream)}, {self.generation}, {_text(kind)}, {_text(ident)}, "
            f"{'NULL' if tombstone is None else _text(tombstone)}, {'NULL' if version is None else _text(version)}, "
            f"{now})"
            for ident, tombstone, version in rows
        )
        client.execute_sql(
            f"INSERT INTO {table} (stream, generation, kind, record_key, tombstone, version, seen_at) VALUES {values}"
        )

    def _create(self, client: Any) -> str:
        table = client.make_qualified_table_name(TOMBSTONES)
        if not self._exists:
            client.execute_sql(
                f"CREATE TABLE IF NOT EXISTS {table} (stream text, generation bigint, kind text, record_key text, "
                "tombstone text, version text, seen_at text)"
            )
            if self.loader.destination.type == "postgres":  # looked up by key, 500 at a time: no scan of them all
                client.execute_sql(f"CREATE INDEX IF NOT EXISTS {TOMBSTONES}_key ON {table} (record_key)")
            self._exists = True
        return table

    def _where(self, kind: str) -> str:
        return f"stream = {_text(self.stream)} AND generation = {self.generation} AND kind = {_text(kind)}"
