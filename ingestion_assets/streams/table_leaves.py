"""A polled table stream's partitions (the leaf tables under a partitioned table, at any depth): a leaf the stream
has not seen (attached, or created and filled) is read whole, whatever its rows' cursor values; a leaf gone
(detached or dropped) took its rows away without touching the cursor, so the run says so and compares the whole
table."""

from __future__ import annotations

import dataclasses
from typing import Any

from psycopg2 import sql

from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.sources.postgres.reader import connect

LEAVES = "partitions"  # the table's leaf partitions the checkpoint has read (CDC streams keep the same detail)
GONE = "partitions_gone"  # what a run found detached or dropped: it compares the whole table

# One catalog query per run, on pg_inherits only (no lock on the table): every leaf under the table, any depth.
_LEAVES_SQL = """
WITH RECURSIVE tree(oid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = %(table)s::regclass
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT format('%%I.%%I', n.nspname, c.relname), n.nspname, c.relname FROM tree JOIN pg_class c ON c.oid = tree.oid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind <> 'p' ORDER BY 1, 2
"""


@dataclasses.dataclass(frozen=True)
class LeafChanges:
    now: list[str]  # every leaf, schema-qualified ("schema.table", as `format('%I.%I')` writes it)
    new: list[str]  # leaves the checkpoint has not read: read whole this run
    gone: list[str]  # leaves the checkpoint read that are no longer under the table
    first_look: bool  # the checkpoint kept no list (a first run, or one from before this check)
    names: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # leaf -> (schema, table)

    def note(self, stream: str, loaded: int) -> str | None:
        said = []
        if self.new:
            said.append(
                f"stream {stream}: partition(s) {', '.join(self.new)} attached or created since the last run: "
                f"their rows are read whole, whatever their cursor ({loaded} row(s) loaded)"
            )
        if self.gone:
            said.append(
                f"stream {stream}: partition(s) {', '.join(self.gone)} detached or dropped since the last run: their "
                "rows are no longer in the source and polling cannot see it; the whole table is compared with the "
                "target (reconcile.deletes says whether those rows are deleted, flagged or only reported)"
            )
        return "; ".join(said) or None


def leaf_names(url: str, schema: str, table: str) -> dict[str, tuple[str, str]]:
    """Every leaf partition under the table, by qualified name (empty: not partitioned, or no partition)."""
    conn = connect(url, "ingest-partitions")
    try:
        with conn.cursor() as cur:
            cur.execute(_LEAVES_SQL, {"table": sql.Identifier(schema, table).as_string(conn)})
            return {str(name): (str(s), str(t)) for name, s, t in cur.fetchall()}
    finally:
        conn.close()


def compare(stored: dict[str, Any], now: list[str]) -> LeafChanges:
    before = stored.get(LEAVES)
    if not isinstance(before, list):
        return LeafChanges(sorted(now), [], [], first_look=True)
    new = sorted(set(now) - set(before))
    gone = sorted(set(before) - set(now))
    return LeafChanges(sorted(now), new, gone, first_look=False)


def leaf_plan(plan: ReadPlan, schema: str, table: str) -> ReadPlan:
    """The stream's read, of one leaf: the parent's columns in the parent's order (a leaf attached may order its
    columns otherwise)."""
    return dataclasses.replace(plan, shape=TableShape(schema, table, plan.shape.columns))
