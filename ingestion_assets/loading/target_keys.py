"""Deletes by primary key in a target table (and its nested child tables), and the key-listing audit table.

API streams learn of deletions as keys (a tombstone record, a key missing from a listing); these are the
statements that apply them, on DuckDB and PostgreSQL alike, under the loader's writer lock.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ingestion_assets.loading.metadata_columns import DELETED_AT, EXTRACTED_AT, POSITION
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.loading.target_sql import undefined_relation

Key = tuple[Any, ...]
LISTINGS = "_ingest_key_listings"  # one row per key listing: when, for which stream, what it found and did
_CHUNK = 500  # keys per statement


def _literal(value: Any) -> str:
    """A key value as SQL: keys come from JSON, so they are numbers, booleans or strings."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


class TargetKeys:
    """The keys of one loader's target table: which exist, which are live, and removing or flagging them."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.primary_key = loader.key  # as the target names the columns

    def existing(self, keys: Iterable[Key]) -> set[Key]:
        """Those of `keys` the target holds (live or soft-deleted)."""
        found: set[Key] = set()
        with self.loader.client() as client:
            for where in self._predicates(client, keys):
                found |= set(self._select(client, f"WHERE {where}"))
        return found

    def positions(self, keys: Iterable[Key]) -> dict[Key, str | None]:
        """The version (`_ingest_position`) the target holds for each of `keys` it has. None: the row has no version
        to order by, a key first seen as a tombstone carrying only its key (NULL; before, its read time, which is
        our clock and no server cursor: a soft-deleted row whose version is its own `_ingest_extracted_at`)."""
        return {key: version for key, (version, _) in self.held(keys).items()}

    def held(self, keys: Iterable[Key]) -> dict[Key, tuple[str | None, bool]]:
        """(version as `positions` says, whether the row is live) for each of `keys` the target has."""
        found: dict[Key, tuple[str | None, bool]] = {}
        with self.loader.client() as client:
            columns = ", ".join(client.escape_column_name(k) for k in self.primary_key)
            table = client.make_qualified_table_name(self.loader.target.table)
            for where in self._predicates(client, keys):
                statement = f"SELECT {columns}, {POSITION}, {EXTRACTED_AT}, {DELETED_AT} FROM {table} WHERE {where}"
                for row in client.execute_sql(statement) or []:
                    position, extracted, deleted = row[-3:]
                    read_time = deleted is not None and _same_moment(position, extracted)
                    version = None if position is None or read_time else str(position)
                    found[tuple(row[:-3])] = (version, deleted is None)
        return found

    def live(self) -> set[Key]:
        """Every key the target holds that is not soft-deleted."""
        with self.loader.client() as client:
            return set(self._select(client, f"WHERE {DELETED_AT} IS NULL"))

    def delete(self, keys: Iterable[Key]) -> int:
        """Hard deletes: the rows and their nested rows (child tables of lists in the records) go."""
        removed = 0
        pipeline = self.loader.pipeline  # dlt's schema restored from the destination first: before the writer lock
        # no schema: dlt never loaded this stream (a first slice of tombstones only), so no table holds its keys
        tables = pipeline.default_schema.tables if pipeline.default_schema_name else {}
        with self.loader.client() as client:
            root = client.make_qualified_table_name(self.loader.target.table)
            nested = self._nested_tables(client, tables)
            for where in self._predicates(client, keys):
                with client.begin_transaction():
                    for table in nested:
                        client.execute_sql(
                            f"DELETE FROM {table} WHERE _dlt_root_id IN (SELECT _dlt_id FROM {root} WHERE {where})"
                        )
                    removed += self._count(client, f"SELECT count(*) FROM {root} WHERE {where}")
                    client.execute_sql(f"DELETE FROM {root} WHERE {where}")
        return removed

    def mark_deleted(self, keys: Iterable[Key], versions: Mapping[Key, str] | None = None) -> int:
        """Soft deletes: the rows keep their last values and get `_ingest_deleted_at` (if not set already), and
        the version in `versions` (a tombstone's cursor), so an older copy served later does not bring them back."""
        keys = list(keys)
        marked = 0
        with self.loader.client() as client:
            root = client.make_qualified_table_name(self.loader.target.table)
            for where in self._predicates(client, keys):
                live = f"WHERE ({where}) AND {DELETED_AT} IS NULL"
                marked += self._count(client, f"SELECT count(*) FROM {root} {live}")
                client.execute_sql(f"UPDATE {root} SET {DELETED_AT} = CURRENT_TIMESTAMP {live}")
            by_version: dict[str, list[Key]] = {}
            for key in keys:
                if versions and (version := versions.get(key)) is not None:
                    by_version.setdefault(version, []).append(key)
            for version, same in sorted(by_version.items()):
                for where in self._predicates(client, same):
                    client.execute_sql(f"UPDATE {root} SET {POSITION} = {_literal(version)} WHERE {where}")
        return marked

    def _select(self, client: Any, where: str) -> Iterator[Key]:
        columns = ", ".join(client.escape_column_name(k) for k in self.primary_key)
        try:
            rows = client.execute_sql(
                f"SELECT {columns} FROM {client.make_qualified_table_name(self.loader.target.table)} {where}"
            )
        except undefined_relation():
            return  # nothing loaded yet
        for row in rows or []:
            yield tuple(row)

    def _predicates(self, client: Any, keys: Iterable[Key]) -> Iterator[str]:
        """WHERE conditions matching `keys`, a chunk at a time (none if the table does not exist yet)."""
        ordered = sorted(set(keys), key=repr)
        if not ordered or not table_exists(client, client.make_qualified_table_name(self.loader.target.table)):
            return
        names = [client.escape_column_name(k) for k in self.primary_key]
        for start in range(0, len(ordered), _CHUNK):
            chunk = ordered[start : start + _CHUNK]
            if len(names) == 1:
                yield f"{names[0]} IN ({', '.join(_literal(key[0]) for key in chunk)})"
            else:
                yield " OR ".join(
                    "(" + " AND ".join(f"{n} = {_literal(v)}" for n, v in zip(names, key, strict=True)) + ")"
                    for key in chunk
                )

    def _nested_tables(self, client: Any, tables: dict[str, Any]) -> list[str]:
        """Child tables (any depth) of the target that exist; dlt gives them `_dlt_root_id` under merge."""
        root, found = self.loader.target.table, []
        for name, table in tables.items():
            parent = table.get("parent")
            while parent is not None and parent != root:
                parent = tables.get(parent, {}).get("parent")
            if parent == root and "_dlt_root_id" in table.get("columns", {}):
                qualified = client.make_qualified_table_name(name)
                if table_exists(client, qualified):
                    found.append(qualified)
        return found

    @staticmethod
    def _count(client: Any, statement: str) -> int:
        rows = client.execute_sql(statement)
        return int(rows[0][0]) if rows else 0


def last_listing(loader: Loader, stream: str) -> dt.datetime | None:
    """When the stream's keys were last listed (None: never, or the audit table is gone)."""
    with loader.client() as client:
        table = client.make_qualified_table_name(LISTINGS)
        try:
            rows = client.execute_sql(f"SELECT max(listed_at) FROM {table} WHERE stream = {_literal(stream)}")
        except undefined_relation():
            return None
    value = rows[0][0] if rows else None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return None


def record_listing(loader: Loader, stream: str, listed_at: dt.datetime, figures: dict[str, Any]) -> None:
    """Append the listing's figures to the audit table (created on first use)."""
    with loader.client() as client:
        table = client.make_qualified_table_name(LISTINGS)
        client.execute_sql(f"CREATE TABLE IF NOT EXISTS {table} (stream text, listed_at timestamptz, figures text)")
        stamp = listed_at.astimezone(dt.UTC).isoformat()
        client.execute_sql(
            f"INSERT INTO {table} VALUES ({_literal(stream)}, CAST({_literal(stamp)} AS timestamptz), "
            f"{_literal(json.dumps(figures, sort_keys=True))})"
        )


def _same_moment(position: Any, extracted: Any) -> bool:
    """Whether a version (text) is the moment `extracted` (a timestamp; naive: UTC, as MariaDB returns it)."""
    if not isinstance(position, str) or not isinstance(extracted, dt.datetime):
        return False
    try:
        moment = dt.datetime.fromisoformat(position)
    except ValueError:
        return False
    with_zone = [m if m.tzinfo else m.replace(tzinfo=dt.UTC) for m in (moment, extracted)]
    return with_zone[0] == with_zone[1]


def key_text(key: Sequence[Any]) -> str:
    """A key as the dead-letter table writes it (`a|b`), for samples in messages and metadata."""
    return "|".join("" if part is None else str(part) for part in key)
