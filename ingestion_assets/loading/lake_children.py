"""The child rows of API records' nested lists on a lake: a merged record keeps only the children its load wrote.

dlt merges a nested table on the child row's own `_dlt_id`, a hash of its parent's id and its list index, and a
record merged again keeps its root `_dlt_id` (a hash of its key). On a SQL target dlt deletes a merged root's children
before inserting the new ones; on Delta and Iceberg it only upserts them, so a list that shrank, emptied or vanished
kept its old items (attack26). Here the ids dlt is about to write are read from its normalized load package, and
after the load every child row (any level) under a merged root that the load did not write is deleted.

Delta and Iceberg commit one table at a time: dlt's commits of the root and each nested table, then one delete commit
per nested table that held stale rows (deepest first: no child outlives its parent), then the binding and the
checkpoint. A kill in between leaves the slice's new rows with stale children beside them, as before this cleanup;
the next run re-reads the slice from the checkpoint, merges the same ids again and deletes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingestion_assets.loading.lake_tables import TableStore


@dataclass(frozen=True)
class Written:
    """What dlt's normalized packages hold for a root table and its nested tables: table -> the `_dlt_id`s."""

    ids: dict[str, set[str]]

    @classmethod
    def of(cls, pipeline: Any, tables: list[str], load_ids: list[str]) -> Written:
        """Read from the normalized packages `load_ids` (this slice's: a package left by an earlier failed load in
        the process is loaded first by the same `load`, and its children of the same records count as stale)."""
        id_column = pipeline.default_schema.naming.normalize_identifier("_dlt_id")
        ids: dict[str, set[str]] = {table: set() for table in tables}
        for load_id in load_ids:
            for job in pipeline.get_load_package_info(load_id).jobs.get("new_jobs", []):
                table = job.job_file_info.table_name
                if table in ids:
                    if job.job_file_info.file_format != "parquet":
                        raise RuntimeError(f"nested rows of {tables[0]} staged as {job.job_file_info.file_format}")
                    ids[table].update(str(v) for v in pq.read_table(job.file_path, columns=[id_column])[0].to_pylist())
        return cls(ids)


def nested_of(schema: Any, root: str) -> list[str]:
    """dlt's nested tables of `root` in its schema, parents before their children."""
    from dlt.common.schema.utils import get_nested_tables

    return [str(table["name"]) for table in get_nested_tables(schema.tables, root, include_self=False)]


def stale_children(
    tables: TableStore, schema: Any, root: str, nested: list[str], written: Written
) -> dict[str, pa.Array]:
    """Per nested table, the `_dlt_id`s under a root of `written` that the load did not write (found parent by
    parent, so it also holds for tables without `_dlt_root_id`). Read before anything is deleted."""
    naming = schema.naming
    id_column, parent_column = naming.normalize_identifier("_dlt_id"), naming.normalize_identifier("_dlt_parent_id")
    under: dict[str, pa.Array] = {root: pa.array(sorted(written.ids[root]), pa.string())}  # every row of the roots
    stale: dict[str, pa.Array] = {}
    for table in nested:
        parents = under.get(schema.tables[table].get("parent", ""))
        dataset = tables.dataset(table)
        if parents is None or not len(parents) or dataset is None:
            continue
        # batch by batch: only the merged records' rows are held, not the whole table's ids (no scan filter: Delta
        # types text as string_view over files holding string, which a pushed-down filter's statistics refuse)
        found = [
            batch.column(0).filter(pc.is_in(batch.column(1), value_set=parents)).cast(pa.string())
            for batch in dataset.to_batches(columns=[id_column, parent_column])
        ]
        under[table] = pa.concat_arrays(found) if found else pa.array([], pa.string())
        kept = pa.array(sorted(written.ids.get(table, set())), pa.string())
        gone = under[table].filter(pc.invert(pc.is_in(under[table], value_set=kept)))
        if len(gone):
            stale[table] = gone
    return stale


def retire_stale_children(tables: TableStore, schema: Any, stale: dict[str, pa.Array]) -> int:
    """Delete the stale child rows, one commit per table, the deepest tables first; how many went."""
    id_column = schema.naming.normalize_identifier("_dlt_id")
    removed = 0
    for table in reversed(list(stale)):
        removed += tables.retire_keys(table, pa.table({id_column: stale[table]}), soft=False)
    return removed
