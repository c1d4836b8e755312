"""The key-by-key diff of the buckets whose checksums differ, joined in an in-process DuckDB.

Both sides' rows (k0.. key, v0.. version, each typed as its side stores it) are joined on the key; a row
is then missing, stale (target older), newer in the target, only in the target (deleted at the source)
or not yet synced (the source's version is past the checkpoint, so the next run reads it).

A `numeric` without limits arrives as text on both sides; its order (a version older or newer, a row before or
past the checkpoint) is its value's, so each such column gets a text whose byte order is the value order (9.5
before 10), while equality stays the exact text (a version 1.0 updated to 1.00 differs, as older in the target).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import duckdb
import pyarrow as pa

from ingestion_assets.loading.number_order import number_order
from ingestion_assets.sources.postgres.query import Position
from ingestion_assets.streams.reconcile.predicates import columns_equal, columns_less, compare
from ingestion_assets.streams.reconcile.relation import key_alias, version_alias

MISSING, STALE, NEWER, DELETED, UNSYNCED = "missing", "stale", "newer", "deleted", "unsynced"
# a source row another row of the same key outranks (a key the source does not enforce: the target keeps the newest)
DUPLICATE = "duplicate"


class Diff:
    """Rows of both sides; more can be added (keys looked up outside the scope) before classifying."""

    def __init__(
        self, source: pa.Table, target: pa.Table, keys: int, versions: int, numbers: Collection[str] = ()
    ) -> None:
        """`numbers`: the aliases (k0.., v0..) of columns holding numeric text, ordered by value."""
        self.keys = [key_alias(i) for i in range(keys)]
        self.versions = [version_alias(i) for i in range(versions)]
        self.numbers = [alias for alias in (*self.keys, *self.versions) if alias in numbers]
        self.con = duckdb.connect()
        self.tables = {"src": self._ordered(source), "tgt": self._ordered(target)}
        for name, table in self.tables.items():
            self.con.register(name, table)  # scanned in place: no copy into DuckDB

    @property
    def rows(self) -> int:
        return sum(table.num_rows for table in self.tables.values())

    def close(self) -> None:
        self.con.close()

    def add(self, side: str, rows: pa.Table) -> None:
        """Rows looked up by keys this side did not hold, so they add no duplicate."""
        if rows.num_rows:
            rows = self._ordered(rows).cast(self.tables[side].schema)
            self.tables[side] = pa.concat_tables([self.tables[side], rows])
            self.con.unregister(side)
            self.con.register(side, self.tables[side])

    def only_in(self, side: str) -> pa.Table:
        """Keys of `side` (src or tgt) the other side's rows here do not hold."""
        other = "tgt" if side == "src" else "src"
        keys = ", ".join(self.keys)
        on = " AND ".join(f"a.{k} = b.{k}" for k in self.keys)
        query = f"SELECT DISTINCT {', '.join('a.' + k for k in self.keys)} FROM {side} a ANTI JOIN {other} b ON {on}"
        return self.con.sql(f"SELECT {keys} FROM ({query})").to_arrow_table()

    def classify(self, ordering: Sequence[str], checkpoint: Position | None, names: Sequence[str]) -> pa.Table:
        """One row per difference: `kind` and both sides' keys (s_k0.., t_k0..). `ordering` lists the aliases
        of the read order (cursor, then key) and `names` the column names the checkpoint holds them under."""
        source, target = [f"s.{v}" for v in self.versions], [f"t.{v}" for v in self.versions]
        covered = self._covered(ordering, checkpoint, names)
        # not newer in the target: older, or the same value spelled otherwise (a numeric's scale)
        newer = columns_less(*([self._order(side, v) for v in self.versions] for side in ("s", "t")))
        older = f"NOT {newer}"
        kind = (
            f"CASE WHEN t._in IS NULL THEN (CASE WHEN {covered} THEN '{MISSING}' ELSE '{UNSYNCED}' END) "
            f"WHEN s._in IS NULL THEN '{DELETED}' "
            f"WHEN {older} THEN (CASE WHEN {covered} THEN '{STALE}' ELSE '{UNSYNCED}' END) "
            f"ELSE '{NEWER}' END"
        )
        on = " AND ".join(f"s.{k} = t.{k}" for k in self.keys)
        sides = ", ".join([f"s.{k} AS s_{k}" for k in self.keys] + [f"t.{k} AS t_{k}" for k in self.keys])
        # Rows repeating a key at the source (one no constraint guards) are merged into one target row, the
        # newest: only that one is compared, the others are told as repeated, not as newer in the target.
        newest = ", ".join(f"{self._order('', v)} DESC" for v in self.versions) or "1"
        keys = ", ".join(self.keys)
        ranked = f"SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {newest}) AS _rank FROM src"
        repeated = ", ".join([f"{k} AS s_{k}" for k in self.keys] + [f"NULL AS t_{k}" for k in self.keys])
        query = (
            f"WITH ranked AS ({ranked}) "
            f"SELECT {kind} AS kind, {sides} "
            f"FROM (SELECT *, TRUE AS _in FROM ranked WHERE _rank = 1) s "
            f"FULL OUTER JOIN (SELECT *, TRUE AS _in FROM tgt) t ON {on} "
            f"WHERE s._in IS NULL OR t._in IS NULL OR NOT {columns_equal(source, target)} "
            f"UNION ALL SELECT '{DUPLICATE}', {repeated} FROM ranked WHERE _rank > 1"
        )
        return self.con.sql(query).to_arrow_table()

    def _covered(self, ordering: Sequence[str], checkpoint: Position | None, names: Sequence[str]) -> str:
        """Whether a source row's position is at or before the checkpoint: the run should have read it."""
        if checkpoint is None:
            return "FALSE"
        source = self.con.sql("SELECT * FROM src")
        types = dict(zip(source.columns, source.types, strict=True))
        values = []
        for alias, name in zip(ordering, names, strict=True):
            text = checkpoint.get(name)
            if text is not None and alias in self.numbers:
                text = number_order(str(text))
            quoted = "'" + str(text).replace("'", "''") + "'"
            cast = "VARCHAR" if alias in self.numbers else types[alias]
            values.append(None if text is None else f"CAST({quoted} AS {cast})")
        return compare([(self._order("s", alias), True) for alias in ordering], values, "<=")

    def _order(self, side: str, alias: str) -> str:
        """The column (of `side`: s, t) that orders as the value: numeric text's order column, else itself."""
        column = f"{alias}{ORDER}" if alias in self.numbers else alias
        return f"{side}.{column}" if side else column

    def _ordered(self, table: pa.Table) -> pa.Table:
        for alias in self.numbers:
            texts = table.column(alias).to_pylist()
            orders = [None if text is None else number_order(text) for text in texts]
            table = table.append_column(alias + ORDER, pa.array(orders, pa.string()))
        return table


ORDER = "_order"

