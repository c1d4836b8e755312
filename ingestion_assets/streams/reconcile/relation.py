"""One side's rows in scope as SQL: per-bucket count and checksum, and the rows of chosen buckets.

The same statements run on the source (PostgreSQL) and on the target (DuckDB or PostgreSQL), each with
its own column names, quoting and literal types; only the canonical text (canonical.py) must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ingestion_assets.loading.number_order import number_order, number_order_sql
from ingestion_assets.sources.postgres.query import Position, Window
from ingestion_assets.streams.reconcile.canonical import Dialect, Expr, mysql_datetime, row_hash
from ingestion_assets.streams.reconcile.predicates import compare

Buckets = dict[int, tuple[int, int]]  # bucket -> (rows, checksum: the XOR of the rows' hashes)
# The aggregate's bucket for rows with a NULL in a key column (a table whose key no constraint guards): such a row
# cannot be merged, so the load parks it as a dead letter; it is counted apart, never compared or diffed.
NULL_KEY_BUCKET = -1


@dataclass(frozen=True)
class Scope:
    """Which rows are compared: a partition's window, and for `window` scope the cursor range a run read."""

    name: str  # window | full
    window: Window | None = None
    cursor: tuple[str, ...] = ()
    lowest: Position | None = None  # window scope: from the cursor the run started at (None: the start)
    highest: Position | None = None  # ... up to the checkpoint's cursor (None: the end)

    @property
    def full(self) -> bool:
        return self.name == "full"


def key_alias(index: int) -> str:
    return f"k{index}"


def version_alias(index: int) -> str:
    return f"v{index}"


@dataclass(frozen=True)
class Relation:
    dialect: Dialect
    table: str  # qualified and quoted
    keys: tuple[Expr, ...]
    versions: tuple[Expr, ...]
    window_column: Expr | None  # the partition column, when the stream is partitioned
    quote: Callable[[str], str]  # a string literal, quoted the way this side's server reads it
    live: str | None = None  # the condition for rows that count (target: not soft-deleted)
    # versions (by index) holding a numeric's text, bounded by value (number_order), compared with `collate`
    numbers: frozenset[int] = frozenset()
    collate: str = ""

    def literal(self, expr: Expr, text: str | None) -> str | None:
        if text is not None and self.dialect == "mysql" and expr.cast.startswith("DATETIME"):
            text = mysql_datetime(text)
        return None if text is None else f"CAST({self.quote(text)} AS {expr.cast})"

    def where(self, scope: Scope) -> str:
        conditions = [self.live] if self.live else []
        window, column = scope.window, self.window_column
        if window is not None and column is not None:
            if window.lower is not None:
                conditions.append(f"{column.sql} >= {self.literal(column, window.lower)}")
            if window.upper is not None:
                conditions.append(f"{column.sql} < {self.literal(column, window.upper)}")
        if not scope.full and self.versions:
            columns = [(self._ordered(i, v.sql), v.nullable) for i, v in enumerate(self.versions)]
            ranged = []
            for bound, op in ((scope.lowest, ">="), (scope.highest, "<=")):
                if bound is not None:
                    pairs = enumerate(zip(self.versions, scope.cursor, strict=True))
                    values = [self._bound(i, version, bound.get(name)) for i, (version, name) in pairs]
                    ranged.append(compare(columns, values, op))
            first = self.versions[0]
            if ranged and first.nullable:
                # A NULL cursor sorts lowest, behind every checkpoint: a row inserted or updated to NULL there is
                # never read by an incremental run. Every window check compares those rows, so such a row fails
                # the check (named as missing or newer) instead of being lost unnoticed.
                conditions.append(f"(({' AND '.join(ranged)}) OR {first.sql} IS NULL)")
            else:
                conditions += ranged
        return " AND ".join(conditions) if conditions else "TRUE"

    def _ordered(self, index: int, sql: str) -> str:
        return number_order_sql(sql) + self.collate if index in self.numbers else sql

    def _bound(self, index: int, version: Expr, text: str | None) -> str | None:
        """A checkpoint's cursor value as a literal the version compares with (numeric text: by its value)."""
        if index in self.numbers and text is not None:
            return self.quote(number_order(text)) + self.collate
        return self.literal(version, text)

    @property
    def estimate_sql(self) -> str:
        """About how many rows the table holds, to size the buckets: DuckDB counts (cheaply), PostgreSQL has
        its statistics, or counts where the table was never analyzed (reltuples -1)."""
        if self.dialect in ("duckdb", "mysql"):
            return f"SELECT count(*) FROM {self.table}"
        return (
            f"SELECT CASE WHEN reltuples >= 0 THEN reltuples::bigint ELSE (SELECT count(*) FROM {self.table}) END "
            f"FROM pg_class WHERE oid = {self.quote(self.table)}::regclass"
        )

    @property
    def keyless(self) -> str | None:
        """The condition for a row with a NULL in any key column; None when no key column can hold a NULL."""
        nullable = [f"{e.sql} IS NULL" for e in self.keys if e.nullable]
        return f"({' OR '.join(nullable)})" if nullable else None

    def keyed(self, scope: Scope) -> str:
        """`where`, for rows whose key has no NULL: the only rows that can be compared key by key."""
        where, keyless = self.where(scope), self.keyless
        return where if keyless is None else f"{where} AND NOT {keyless}"

    @property
    def hash(self) -> str:
        return row_hash(self.dialect, self.keys, self.versions)

    @property
    def integer_key(self) -> bool:
        return len(self.keys) == 1 and self.keys[0].kind.name == "int"

    def bucket(self, buckets: int, hashed: str) -> str:
        """A row's bucket: its key modulo `buckets` for one integer key column (the diff then finds a bucket's
        rows by arithmetic, without hashing the table again), else its hash modulo `buckets`."""
        if self.integer_key:
            key = self.keys[0].sql
            return f"((({key}) % {buckets}) + {buckets}) % {buckets}"  # non-negative in both dialects
        return f"{hashed} % {buckets}"

    def aggregate_sql(self, scope: Scope, buckets: int) -> str:
        """Rows and the XOR of their hashes per bucket (a bigint state: the hash table stays small, where sum's
        numeric state spilled to disk); OFFSET 0 keeps PostgreSQL from computing the hash twice. Rows with a NULL
        key go to NULL_KEY_BUCKET, counted in the same scan."""
        key_bucket = f", {self.bucket(buckets, '')} AS b" if self.integer_key else ""
        keyless = f", {self.keyless} AS z" if self.keyless else ""
        fence = "" if self.dialect == "mysql" else " OFFSET 0"  # MySQL takes no OFFSET without LIMIT
        inner = f"SELECT {self.hash} AS h{key_bucket}{keyless} FROM {self.table} t WHERE {self.where(scope)}{fence}"
        bucket = "b" if self.integer_key else self.bucket(buckets, "h")
        if keyless:
            bucket = f"CASE WHEN z THEN {NULL_KEY_BUCKET} ELSE {bucket} END"
        return f"SELECT {bucket} AS b, count(*) AS n, bit_xor(h) AS s FROM ({inner}) q GROUP BY 1"

    def rows_sql(self, scope: Scope, buckets: int, only: Sequence[int] | None) -> str:
        """Key and version of every row in scope, or of the rows in the buckets `only` names."""
        where = self.keyed(scope)
        if only is not None:
            where += f" AND {self.bucket(buckets, self.hash)} IN ({', '.join(str(b) for b in only)})"
        return f"SELECT {self.select_list} FROM {self.table} t WHERE {where}"

    def rows_with_keys_sql(self, keys: str) -> str:
        """Rows whose key is in `keys`, a relation aliased k with columns k0, k1, ..., whatever their version or
        window (a row the other side has elsewhere is not missing)."""
        on = " AND ".join(f"{e.sql} = k.{key_alias(i)}" for i, e in enumerate(self.keys))
        live = f" WHERE {self.live}" if self.live else ""
        return f"SELECT {self.select_list} FROM {self.table} t JOIN {keys} ON {on}{live}"

    @property
    def select_list(self) -> str:
        columns = [f"{e.kind.identity(self.dialect, e.sql)} AS {key_alias(i)}" for i, e in enumerate(self.keys)]
        columns += [f"{e.sql} AS {version_alias(i)}" for i, e in enumerate(self.versions)]
        return ", ".join(columns)

    @property
    def aliases(self) -> list[str]:
        return [key_alias(i) for i in range(len(self.keys))] + [version_alias(i) for i in range(len(self.versions))]


def work_mem(buckets: int) -> str:
    """PostgreSQL's work_mem for an aggregate of `buckets` groups (about 100 bytes each), at least the default."""
    return f"'{max(4 << 10, buckets * 128 >> 10)}kB'"


def fold(rows: Sequence[Sequence[object]]) -> Buckets:
    """(bucket, rows, checksum) rows from either dialect as Python ints."""
    return {int(b): (int(n), int(s)) for b, n, s in rows}  # type: ignore[call-overload]
