"""A polled table stream's partitions (the leaf tables under a partitioned table, at any depth): a leaf the stream
has not seen (attached, or created and filled) is read whole, whatever its rows' cursor values; a leaf gone
(detached or dropped) took its rows away without touching the cursor, so the run says so and compares the whole
table."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from psycopg2 import sql

from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.query import Position, ReadPlan
from ingestion_assets.sources.postgres.reader import connect

LEAVES = "partitions"  # the table's leaf partitions the checkpoint has read (CDC streams keep the same detail)
GONE = "partitions_gone"  # what a run found detached or dropped: it compares the whole table
# Each leaf's oid and the xmin of its pg_inherits row when it was read: a leaf dropped and made again under its name,
# or detached, changed and attached again, has new ones and is read whole again
LEAF_IDS = "partition_ids"
# Marks an identity whose read saw writers in flight that had not ended when the run finished: read whole again
UNSETTLED = "?"

# One catalog query per run, on pg_inherits only (no lock on the table): every leaf under the table, any depth.
_LEAVES_SQL = """
WITH RECURSIVE tree(oid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = %(table)s::regclass
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT format('%%I.%%I', n.nspname, c.relname), n.nspname, c.relname, c.oid::text || '/' || i.xmin::text
FROM tree JOIN pg_class c ON c.oid = tree.oid JOIN pg_inherits i ON i.inhrelid = c.oid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind <> 'p' ORDER BY 1, 2
"""


@dataclasses.dataclass(frozen=True)
class LeafChanges:
    now: list[str]  # every leaf, schema-qualified ("schema.table", as `format('%I.%I')` writes it)
    new: list[str]  # leaves the checkpoint has not read: read whole this run
    gone: list[str]  # leaves the checkpoint read that are no longer under the table
    first_look: bool  # the checkpoint kept no list (a first run, or one from before this check)
    names: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # leaf -> (schema, table)
    ids: dict[str, str] = dataclasses.field(default_factory=dict)  # leaf -> "oid/xmin of its pg_inherits row"
    # Leaves read before under their name that were dropped and made again, or detached and attached again: rows
    # deleted from them meanwhile left no cursor behind, so, as for a leaf gone, the whole table is compared
    remade: list[str] = dataclasses.field(default_factory=list)

    def note(self, stream: str, loaded: int) -> str | None:
        said = []
        if self.new:
            said.append(
                f"stream {stream}: partition(s) {', '.join(self.new)} attached, created, or made again since the "
                f"last run: their rows are read whole, whatever their cursor ({loaded} row(s) loaded)"
            )
        if self.remade:
            said.append(
                f"stream {stream}: partition(s) {', '.join(self.remade)} dropped and made again, or detached and "
                "attached again: rows deleted from them meanwhile are no longer in the source and polling cannot see "
                "it; the whole table is compared with the target"
            )
        if self.gone:
            said.append(
                f"stream {stream}: partition(s) {', '.join(self.gone)} detached or dropped since the last run: their "
                "rows are no longer in the source and polling cannot see it; the whole table is compared with the "
                "target (reconcile.deletes says whether those rows are deleted, flagged or only reported)"
            )
        return "; ".join(said) or None


def leaf_names(url: str, schema: str, table: str) -> dict[str, tuple[str, str, str]]:
    """Every leaf partition under the table, by qualified name, with its schema, table and identity (empty: not
    partitioned, or no partition)."""
    conn = connect(url, "ingest-partitions")
    try:
        with conn.cursor() as cur:
            cur.execute(_LEAVES_SQL, {"table": sql.Identifier(schema, table).as_string(conn)})
            return {str(name): (str(s), str(t), str(ident)) for name, s, t, ident in cur.fetchall()}
    finally:
        conn.close()


def compare(stored: dict[str, Any], now: dict[str, str]) -> LeafChanges:
    """`now`: each leaf's identity. New: a name not read before, or one whose identity changed since."""
    before = stored.get(LEAVES)
    if not isinstance(before, list):
        return LeafChanges(sorted(now), [], [], first_look=True, ids=dict(now))
    stored_ids = stored.get(LEAF_IDS)
    known: dict[str, Any] = stored_ids if isinstance(stored_ids, dict) else {}
    remade = sorted(
        name for name, ident in now.items() if name in before and str(known.get(name, ident)).rstrip(UNSETTLED) != ident
    )
    unsettled = {name for name, ident in known.items() if str(ident).endswith(UNSETTLED)}
    new = sorted({*remade, *unsettled.intersection(now), *(name for name in now if name not in before)})
    gone = sorted(set(before) - set(now))
    return LeafChanges(sorted(now), new, gone, first_look=False, ids=dict(now), remade=remade)


def leaf_plan(plan: ReadPlan, schema: str, table: str) -> ReadPlan:
    """The stream's read, of one leaf: the parent's columns in the parent's order (a leaf attached may order its
    columns otherwise)."""
    return dataclasses.replace(plan, shape=TableShape(schema, table, plan.shape.columns))


@contextlib.contextmanager
def pinned_snapshot(url: str) -> Iterator[tuple[str, list[int]]]:
    """A snapshot to read a leaf under (exported: the read imports it), and the transactions that had written and
    were still in flight in it: whatever they wrote is not in that read, whatever their rows' cursor."""
    conn = connect(url, "ingest-partitions")
    try:
        with conn.cursor() as cur:  # one statement: the snapshot exported is the one whose writers are listed
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SELECT pg_export_snapshot(), array(SELECT txid_snapshot_xip(txid_current_snapshot()))")
            row = cur.fetchone()
        assert row is not None
        yield str(row[0]), [int(x) for x in row[1]]
    finally:
        conn.close()


# Of the transactions given (32-bit xids), those holding a lock on the relation: they have written into it
_WRITING_HERE = """
SELECT DISTINCT x.transactionid::text::bigint FROM pg_locks x
JOIN pg_locks r ON r.virtualtransaction = x.virtualtransaction
WHERE x.locktype = 'transactionid' AND x.transactionid::text::bigint = ANY(%s::bigint[])
  AND r.locktype = 'relation' AND r.relation = %s::regclass
"""


@dataclasses.dataclass(frozen=True)
class LateWriters:
    rows: int  # rows behind the checkpoint that writers in flight at the leaf's read committed since (it missed them)
    still_open: int  # writers in flight at the read still open after waiting (for those that wrote into the leaf)


def late_writers(url: str, plan: ReadPlan, after: Position, in_flight: list[int], wait_seconds: float) -> LateWriters:
    """After a leaf was read under a snapshot with `in_flight` writers: wait up to `wait_seconds` for them to end,
    then count the leaf's rows at or before the checkpoint (`after`) those that committed wrote (by xmin; one scan
    of the leaf, only when one did). Rows past the checkpoint are the keyset read's and the late-commit guard's."""
    if not in_flight:
        return LateWriters(0, 0)
    conn = connect(url, "ingest-partitions")
    try:
        deadline = time.monotonic() + wait_seconds
        leaf = sql.Identifier(plan.shape.schema, plan.shape.table).as_string(conn)
        with conn.cursor() as cur:
            while True:
                cur.execute("SELECT x, txid_status(x) FROM unnest(%s::bigint[]) x", (in_flight,))
                status = dict(cur.fetchall())
                still_open = [int(x) % (1 << 32) for x, state in status.items() if state == "in progress"]
                writing_here: list[int] = []
                if still_open:  # waited for: those that wrote into this leaf already (they hold its lock)
                    cur.execute(_WRITING_HERE, (still_open, leaf))
                    writing_here = [x for (x,) in cur.fetchall()]
                if not writing_here or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            # Any of them still open may yet write old rows into the leaf (not waited for: a long transaction
            # elsewhere would cost every new leaf the whole wait): the leaf is read whole again by the next run
            committed = [int(x) % (1 << 32) for x, state in status.items() if state == "committed"]
            if not committed:
                return LateWriters(0, len(still_open))
            statement = sql.SQL(
                "SELECT count(*) FROM {table} t WHERE t.xmin::text::bigint = ANY(%s::bigint[]) AND {behind}"
            ).format(table=sql.Identifier(plan.shape.schema, plan.shape.table), behind=plan.at_or_before(after))
            cur.execute(statement, (committed,))
            (rows,) = cur.fetchone() or (0,)
        return LateWriters(int(rows), len(still_open))
    finally:
        conn.close()
