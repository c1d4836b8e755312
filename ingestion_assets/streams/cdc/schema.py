"""Before a CDC stream applies the log: the table streams' schema step and target binding, per stream.

The log carries no row changes for what DDL does to existing rows (a column added with a default, a type
changed with a rewrite), so a stream whose columns changed since its checkpoint is copied again under a
snapshot, fenced against the log like a new stream; an incompatible change pauses it with the command to
accept it. A target that does not hold what the checkpoint says (a new destination or file, a dropped or
emptied table) is copied again as well, and the run says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg2 import sql

from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.sources.postgres.cdc import TableInfo
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.reader import connect
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.schema_step import (
    COLUMN_IDS,
    SchemaPaused,
    apply_to_target,
    column_ids,
    made_again,
    settle_schema,
)
from ingestion_assets.streams.target_binding import TARGET, binding_details, settle_target

SCHEMA = "schema"  # the checkpoint detail the table streams keep too (`ingest schema show` reads it)
PARTITIONS = "partitions"  # a partitioned table's partitions when the stream last settled
# Each partition's relfilenode and the xmin of its pg_inherits row then: a new one means rows changed outside the
# log (a TRUNCATE of the partition, or changes made while it was detached and then attached again)
FILES = "partition_files"
EMPTY = "target_empty"  # the log left the target empty (hard deletes, a truncate): an empty target is no loss

_PARTITIONS_SQL = """
WITH RECURSIVE tree(oid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = %(table)s::regclass
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT format('%%I.%%I', n.nspname, c.relname), c.relfilenode::text || '/' || i.xmin::text
FROM tree JOIN pg_class c ON c.oid = tree.oid JOIN pg_inherits i ON i.inhrelid = c.oid
JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY 1
"""

_TYPES_SQL = """
SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %(table)s::regclass AND attnum > 0 AND NOT attisdropped
"""
_GENERATED_SQL = """
SELECT attname FROM pg_attribute
WHERE attrelid = %(table)s::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated <> ''
"""


@dataclass
class StreamParts:
    """What one run of a CDC stream loads with: its loader (bound to the target), the table's shape, the
    schema its checkpoint stores, and why it needs a new copy (None: it continues from its position)."""

    loader: Loader
    shape: TableShape
    schema: dict[str, list[str]] | None = None
    recopy: str | None = None
    partitions: dict[str, str] | None = None  # partition -> "relfilenode/xmin of its pg_inherits row" now
    rewritten: str | None = None  # partitions rewritten outside the log: copied again once the log is caught up
    empty: bool = False  # the last load left the target without rows
    type_oids: dict[str, int] | None = None  # column -> its type's oid now (`outdated`), read once a run
    generated: frozenset[str] | None = None  # generated columns: the log carries no value of them, read once a run
    ids: dict[str, Any] | None = None  # the table's oid and column numbers now (schema_step.column_ids)
    # relation messages (by identity) found to carry every column of `shape`: see batches._logged_without_columns
    complete_relations: dict[int, tuple[TableInfo, TableShape]] = field(default_factory=dict)

    def generated_columns(self, stream: PostgresTableStream) -> frozenset[str]:
        """The table's generated columns (stored or virtual): pgoutput leaves them out of every change (unless
        a publication of PostgreSQL 18 publishes stored ones), so each change's row takes them from the source."""
        if self.generated is None:
            self.generated = generated_columns(stream)
        return self.generated

    def outdated(self, stream: PostgresTableStream, table: TableInfo) -> bool:
        """The log decoded this change with column types the table no longer has: it was made before a type
        change (an ALTER ... TYPE the run found at its start, or one made while it reads), so its values are
        of the old type, which the stream's parse of the current types may not read (text into int)."""
        if self.type_oids is None:
            self.type_oids = column_type_oids(stream)
        now = self.type_oids
        return any(name in now and now[name] != oid for name, oid in zip(table.columns, table.type_oids, strict=True))

    def checkpoint_details(self) -> dict[str, Any]:
        details = binding_details(self.loader)
        if self.empty:
            details[EMPTY] = True
        if self.schema is not None:
            details[SCHEMA] = self.schema
        if self.ids is not None:
            details[COLUMN_IDS] = self.ids
        if self.partitions is not None:  # [] too: a partition attached to a table left without any is news
            details[PARTITIONS] = sorted(self.partitions)
            if self.rewritten is None:  # else the stored ones stay until the copy starts: a failed run sees it again
                details[FILES] = self.partitions
        return details


class CdcSchemaPaused(SchemaPaused):
    """An incompatible column change: the stream stops before applying anything of the log."""


def settle_stream(
    stream: PostgresTableStream, details: dict[str, Any], partition: str | None, guard: bool
) -> StreamParts:
    """The schema step (raises CdcSchemaPaused on an incompatible change) and the target binding."""
    try:
        step = settle_schema(stream, details)
    except SchemaPaused as exc:
        raise CdcSchemaPaused(str(exc), exc.changes) from exc
    assert step.plan is not None
    loader = stream.loader(Target(stream.name, 1), None, step.plan, guard=guard)
    apply_to_target(step, loader)
    assert step.plan is not None
    parts = StreamParts(loader, step.plan.shape, step.stored)
    lsn = details.get("lsn") if details.get("snapshot_done") else None
    left_empty = bool(lsn) and _left_empty(loader, partition, details)  # before settle_target binds anew
    settled = settle_target(loader, partition, details, {"lsn": lsn} if lsn else None, 1)
    rewritten = [c for c in step.applied if c.kind != "dropped"]
    parts.ids = column_ids(stream)
    retyped = [c.column for c in step.applied if c.old is not None and c.new is not None]
    remade = made_again(details.get(COLUMN_IDS), parts.ids, retyped)
    loaded = int((details.get(TARGET) or {}).get("seq", 1)) > 0  # a log run that changed nothing loads nothing
    parts.partitions = partitions_of(stream)
    now = parts.partitions or {}
    moved = _partitions_moved(details[PARTITIONS], list(now)) if PARTITIONS in details else None
    refiled = _partitions_refiled(details.get(FILES), now)
    if lsn and settled.reason and loaded and not left_empty:
        parts.recopy = f"its target changed: {settled.reason}"
    elif lsn and (rewritten or remade):
        said = [c.describe() for c in rewritten] + ([f"{', '.join(remade)} changed in place"] if remade else [])
        what = "; ".join(said)
        parts.recopy = f"{what}: the log carries no values for the rows that already existed"
    elif lsn and moved:
        parts.recopy = f"{moved}: the log carries neither the rows a partition brings nor those it takes away"
    elif lsn and refiled:
        parts.rewritten = (
            f"{refiled}: the log carries neither the rows a TRUNCATE of a partition takes away (PostgreSQL "
            "publishes it only for the whole table) nor the changes made to a partition while it was detached"
        )
    return parts


def _left_empty(loader: Loader, partition: str | None, details: dict[str, Any]) -> bool:
    """The target is empty because the log emptied it: its checkpoint says so and the target still holds
    the binding and every slice that checkpoint counts (a table emptied or dropped outside us does not)."""
    stored = details.get(TARGET)
    if not details.get(EMPTY) or not isinstance(stored, dict):
        return False
    state = loader.inspect(partition)
    marker = state.marker
    return (
        state.exists
        and not state.has_rows
        and marker is not None
        and marker.binding == str(stored.get("binding"))
        and marker.seq >= int(stored.get("seq", 0))
    )


def generated_columns(stream: PostgresTableStream) -> frozenset[str]:
    conn = connect(stream.source_url(), "ingest-generated-columns")
    try:
        table = sql.Identifier(stream.spec.schema_name, stream.spec.table_name).as_string(conn)
        with conn.cursor() as cur:
            cur.execute(_GENERATED_SQL, {"table": table})
            return frozenset(str(row[0]) for row in cur.fetchall())
    finally:
        conn.close()


def column_type_oids(stream: PostgresTableStream) -> dict[str, int]:
    """Each column of the stream's table and its type's oid, as the log's relation messages name them."""
    conn = connect(stream.source_url(), "ingest-column-types")
    try:
        table = sql.Identifier(stream.spec.schema_name, stream.spec.table_name).as_string(conn)
        with conn.cursor() as cur:
            cur.execute(_TYPES_SQL, {"table": table})
            return {str(name): int(oid) for name, oid in cur.fetchall()}
    finally:
        conn.close()


def partitions_of(stream: PostgresTableStream) -> dict[str, str] | None:
    """Every partition under the stream's table, as schema-qualified names, with its relfilenode and the xmin of
    the row attaching it (None: not a partitioned table). TRUNCATE, VACUUM FULL and CLUSTER give a partition a
    new relfilenode; DETACH then ATTACH a new pg_inherits row."""
    conn = connect(stream.source_url(), "ingest-partitions")
    try:
        table = sql.Identifier(stream.spec.schema_name, stream.spec.table_name).as_string(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = %(table)s::regclass", {"table": table})
            found = cur.fetchone()
            if found is None or not found[0]:
                return None
            cur.execute(_PARTITIONS_SQL, {"table": table})
            return {str(name): str(files) for name, files in cur.fetchall()}
    finally:
        conn.close()


def _partitions_moved(before: list[str] | None, now: list[str]) -> str | None:
    """What ATTACH/DETACH PARTITION did since the stream last settled, or None."""
    attached, detached = sorted(set(now) - set(before or [])), sorted(set(before or []) - set(now))
    said = [f"partition(s) {', '.join(attached)} attached"] if attached else []
    said += [f"partition(s) {', '.join(detached)} detached or dropped"] if detached else []
    return "; ".join(said) or None


def _partitions_refiled(before: dict[str, str] | None, now: dict[str, str]) -> str | None:
    """The partitions (there before and now) rewritten or attached again since the stream last settled, or None."""
    changed = sorted(name for name, files in now.items() if (before or {}).get(name, files) != files)
    if not changed:
        return None
    return (
        f"partition(s) {', '.join(changed)} rewritten or attached again (TRUNCATE, VACUUM FULL or CLUSTER of the "
        "partition, or DETACH then ATTACH)"
    )
