"""History of a CDC source as Dagster backfill partitions: integer key ranges copied while the log runs on.

A chunk run holds the slot, exports a snapshot, applies the log up to the snapshot's WAL position (noting
every key that a transaction invisible to the snapshot touched: a fence), then loads the chunk's rows but
the fenced ones, at a version just below any change the snapshot does not see. The log wins where it is
newer, the chunk wins where the log is older, whatever order later runs load in.

The one case this does not decide: a transaction already applied and checkpointed by an earlier run that
the snapshot still lists as running (its commit record written, the process table not yet updated: a
sub-millisecond window, against a load and a storage write before any checkpoint). It would count as
seen; it is not guarded.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.partitions import LIVE
from ingestion_assets.sources.postgres import occupied_buckets, plan_table_read
from ingestion_assets.sources.postgres.cdc import ChangeBatch, Op, RowChange
from ingestion_assets.sources.postgres.cdc.chunks import ChunkSnapshot
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.streams.cdc.rows import TableChanges
from ingestion_assets.streams.postgres_table import PostgresTableStream

HISTORY = "history"  # checkpoint detail: {"chunk", "buckets"}: key // chunk of every range holding rows


def plan_history(url: str, streams: list[PostgresTableStream], chunk: int) -> dict[str, Any]:
    """The key ranges holding a row now (read after the slot exists: rows inserted later come through the
    log). Only ranges with rows: sparse keys plan no empty partitions."""
    buckets: set[int] = set()
    for stream in streams:
        column = stream.spec.primary_key[0]
        plan = plan_table_read(url, stream.spec.schema_name, stream.spec.table_name, (), (column,))
        kind = plan.shape.column(column).type_name
        if kind not in ("int2", "int4", "int8"):
            raise LookupError(
                f"stream {stream.qualified_name}: cdc.history_chunk needs an integer primary key; {column!r} is "
                f"{kind}. Unset history_chunk to copy the history in one snapshot"
            )
        buckets |= occupied_buckets(url, stream.spec.schema_name, stream.spec.table_name, column, chunk)
    return {"chunk": chunk, "buckets": sorted(buckets)}


def history_keys(state: dict[str, Any]) -> list[str]:
    """`live` and the key ranges planned when the log started."""
    space = state.get(HISTORY) or {"chunk": 1, "buckets": []}
    chunk = space["chunk"]
    return [LIVE, *(f"{b * chunk}-{b * chunk + chunk - 1}" for b in space["buckets"])]


@dataclass
class Fences:
    """Keys touched by log transactions a copy's snapshot does not see: the log, not the copy, has them.
    A key is kept as the log's text of its values and compared with the copy's rows as `record_keys` spells
    both, the log's parsed as the copy's types: compared as the log's text against Arrow's, a timestamptz, bool,
    float or bytea key was never fenced (its old row copied over the log's newer one) or stopped the copy."""

    snapshot: ChunkSnapshot
    keys: dict[tuple[str, str], set[tuple[str, ...]]] = field(default_factory=dict)  # (schema, table) -> keys
    truncated: set[tuple[str, str]] = field(default_factory=set)  # tables emptied after the snapshot
    columns: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # (schema, table) -> key columns
    read: set[int] = field(default_factory=set)  # xids (32 bits, as the log names them) of the batches seen
    _texts: dict[tuple[str, str], pa.Array] = field(default_factory=dict)  # table -> fenced keys as record_keys

    def see(self, batch: ChangeBatch) -> None:
        for tx in batch.transactions:
            self.read.add(tx.xid % _XID_SPACE)
            if self.snapshot.sees(tx.xid):
                continue
            for change in tx.changes:
                self._fence(change)

    def unfenceable(self, applied: array[int]) -> list[int]:
        """Transactions the snapshot does not see that the log did not bring after it, so that no fence
        can hold their keys: `applied` (delivered and applied before the snapshot was taken) or committed and
        waiting for a standby (delivered before it). A copy would set their rows back to before them; it may go
        on only when this is empty."""
        waiting = self.snapshot.committed_unseen - self.read
        return sorted(set(self.snapshot.unseen_of(applied)) | waiting)

    def _fence(self, change: RowChange) -> None:
        table = (change.table.schema, change.table.table)
        column = self.columns.get(table)
        if column is None:
            return
        if change.op == Op.TRUNCATE:
            self.truncated.add(table)
            return
        for row in (change.new, change.old):
            if row is None:
                continue
            values = dict(zip(change.table.columns, row, strict=False))
            key = [values.get(name) for name in column]
            if all(isinstance(value, str) for value in key):
                self.keys.setdefault(table, set()).add(tuple(str(v) for v in key))
                self._texts.pop(table, None)

    def drop_fenced(self, table: tuple[str, str], rows: pa.Table, shape: TableShape) -> pa.Table:
        """`rows` less the fenced keys; `shape`: the types the copy read `rows` as."""
        fenced = self.keys.get(table)
        if not fenced:
            return rows
        columns = self.columns[table]
        texts = self._texts.get(table)
        if texts is None:
            changes = TableChanges(shape, columns)
            keys = changes.key_texts([dict(zip(columns, key, strict=True)) for key in sorted(fenced)])
            texts = self._texts[table] = pa.array(sorted(set(keys)), pa.string())
        keep = pc.invert(pc.is_in(record_keys(rows, columns), value_set=texts))
        return rows.filter(pc.fill_null(keep, True))


_XID_SPACE = 1 << 32


def fences_for(snapshot: ChunkSnapshot, streams: Iterable[PostgresTableStream]) -> Fences:
    fences = Fences(snapshot)
    for stream in streams:
        fences.columns[(stream.spec.schema_name, stream.spec.table_name)] = tuple(stream.spec.primary_key)
    return fences
