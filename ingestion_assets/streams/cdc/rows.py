"""Row changes from the log as Arrow rows for one target table: upserts, delete tombstones, truncates.

Values arrive as PostgreSQL's text output, the same text a COPY reads; they go through the same Arrow CSV
parser with the table's types and the same decoding after it (values.py), so a value lands the same whether
it came from the snapshot or the log.
A row's version is its change's log position: commit LSN * 10^9 + order within the transaction.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from ingestion_assets.loading.dead_letters import DEAD_LETTER_SCHEMA, key_part, record_keys
from ingestion_assets.loading.metadata_columns import (
    DELETED_AT,
    EXTRACTED_AT,
    GENERATION,
    META,
    POSITION,
    TIMESTAMP_UTC,
)
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.sources.postgres.bad_values import NO_DECIMAL_VALUE, null_oversized
from ingestion_assets.sources.postgres.cdc import UNCHANGED_TOAST, Op, RowChange
from ingestion_assets.sources.postgres.introspect import TableShape
from ingestion_assets.sources.postgres.reader import connect, csv_options, decode_binary
from ingestion_assets.sources.postgres.temporal import TEMPORAL
from ingestion_assets.sources.postgres.temporal import needs_parse as temporal_needs_parse
from ingestion_assets.sources.postgres.values import decode_texts, plain

if TYPE_CHECKING:
    from ingestion_assets.loading.pipeline import Loader
    from ingestion_assets.streams.postgres_table import PostgresTableStream

VERSION_TYPE = pa.decimal128(38, 0)
Key = tuple[Any, ...]  # primary key values as the log's text
_UNFIT_DECIMAL = ("NaN", "Infinity", "-Infinity")
# a change's note for `_ingest_meta` (`on_bad_value: null`), kept in its row under a name no column can have (a
# PostgreSQL identifier holds no NUL): a source column named `_ingest_meta` is the source's, never our note
_NOTE = "\x00ingest_note"


def version_of(commit_lsn: int, seq: int) -> Decimal:
    return Decimal(commit_lsn) * 10**9 + seq


def snapshot_version(lsn: int) -> Decimal:
    """The version of rows copied under a snapshot whose WAL insert position was read as `lsn`: below every
    change committed at or after it (the log wins those), at or above the copy's floor."""
    return version_of(lsn, 0) - 1


def copy_floor(start_lsn: int) -> Decimal:
    """Below every version a copy that takes the log from `start_lsn` on gives a row: its ranges' (their
    snapshots' positions are at or after it, possibly equal on an idle source) and the log's. A row left below
    it once every range is copied was neither copied nor changed since the copy started: the source deleted it.
    Not the first range's version: a transaction that commits between a snapshot and the reading of its WAL
    position is invisible to it (fenced, left to the log) yet applied at a version below it."""
    return snapshot_version(start_lsn)


@dataclass
class TableChanges:
    """The changes of one table within a batch, as rows ready to merge (the newest per key wins)."""

    shape: TableShape
    primary_key: tuple[str, ...]
    rows: list[dict[str, Any]] = field(default_factory=list)  # column -> text value, plus bookkeeping
    truncated_at: int | None = None  # index in `rows` after which the table was truncated last
    bad: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    commit_times: list[dt.datetime] = field(default_factory=list)
    soft: bool = False  # soft deletes: a deleted row keeps its last values and gets `_ingest_deleted_at`
    generated: frozenset[str] = frozenset()  # columns the log carries no value of: read from the source
    max_value_bytes: int = 16 << 20  # the stream's `dead_letters.max_value_bytes`: a value above parks its change
    null_bad: bool = False  # `on_bad_value: null`: a value that cannot load is nulled (noted in `_ingest_meta`)
    marks: dict[Key, tuple[Decimal, dt.datetime]] = field(default_factory=dict)  # soft deletes of target rows
    _last: dict[Key, dict[str, Any]] = field(default_factory=dict)  # key -> its newest values in this batch
    _decimals: tuple[TableShape, tuple[str, ...]] | None = None  # (shape, its decimal columns)

    def add(self, change: RowChange, lookup_toast: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.commit_times.append(change.commit_time)
        version = version_of(change.commit_lsn, change.seq)
        if change.op == Op.TRUNCATE:
            self.rows.clear()
            self.marks.clear()
            self._last.clear()
            self.truncated_at = change.commit_lsn
            return
        old = dict(zip(change.table.columns, change.old, strict=False)) if change.old is not None else None
        full = change.table.replica_identity == "f"  # the old tuple carries every column, not just the key
        if change.op == Op.DELETE:
            self._delete(old or {}, full, version, change.commit_time)
            return
        new = change.new_record()
        for name in self.generated:  # left out of the change (a generated column): as if unchanged, from the source
            new.setdefault(name, UNCHANGED_TOAST)
        if any(value is UNCHANGED_TOAST for value in new.values()):
            new = self._fill_toast(new, old if full else None, lookup_toast)
        if old is not None and any(old.get(k) is not None and old.get(k) != new.get(k) for k in self.primary_key):
            self._delete(old, full, version, change.commit_time)  # the key itself changed
        problem = self._unfit(new)
        if problem is not None and self.null_bad and not self._key_unfit(new):
            new = {**new, **{name: None for name in self._decimal_columns() if new.get(name) in _UNFIT_DECIMAL}}
            new[_NOTE] = json.dumps({"nulled": problem})
        elif problem is not None:
            self._park(new, problem)
            return
        key = self._key(new)
        self.marks.pop(key, None)
        self._last[key] = new
        self.rows.append({**new, POSITION: version, DELETED_AT: None})

    def _key(self, row: dict[str, Any]) -> Key:
        return tuple(row.get(k) for k in self.primary_key)

    def _delete(self, old: dict[str, Any], full: bool, version: Decimal, when: dt.datetime) -> None:
        """A hard delete is a key-only tombstone (purged after the merge). A soft one keeps the row's last
        values: the full old row, or the row's newest version in this batch, or else (the values are in the
        target only) a mark that sets `_ingest_deleted_at` on the target's row."""
        key = self._key(old)
        values = {k: old.get(k) for k in self.primary_key}
        if self.soft:
            last = old if full and all(v is not UNCHANGED_TOAST for v in old.values()) else self._last.get(key)
            if last is None:
                self.marks[key] = (version, when)
                return
            values = dict(last)
        self._last.pop(key, None)
        self.rows.append({**values, POSITION: version, DELETED_AT: when})

    def _fill_toast(
        self, new: dict[str, Any], old: dict[str, Any] | None, lookup: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """An unchanged TOASTed value is not resent: take it from the full old row (replica identity full), or
        from the source. A key-only old tuple (the default identity, sent when the key changes) holds NULL in every
        other column: taking those as the values landed the moved row's large values as NULL (found by the CDC
        attack)."""
        missing = [name for name, value in new.items() if value is UNCHANGED_TOAST]
        if old is not None and all(old.get(name) is not UNCHANGED_TOAST and name in old for name in missing):
            return {**new, **{name: old[name] for name in missing}}
        current = lookup({k: new[k] for k in self.primary_key})
        return {**new, **{name: current.get(name) for name in missing}}

    def _unfit(self, row: dict[str, Any]) -> str | None:
        """NaN and infinity have no decimal value (and would stop the CSV parse); the rest is found in to_arrow."""
        for name in self._decimal_columns():
            value = row.get(name)
            if isinstance(value, str) and value in _UNFIT_DECIMAL:
                return f"{name}: {value} {NO_DECIMAL_VALUE}"
        return None

    def _key_unfit(self, row: dict[str, Any]) -> bool:
        return any(row.get(k) in _UNFIT_DECIMAL for k in self.primary_key if k in self._decimal_columns())

    def _decimal_columns(self) -> tuple[str, ...]:
        """The shape's decimal columns, found once per shape (asked for every change of a batch)."""
        known = self._decimals
        if known is None or known[0] is not self.shape:
            known = (self.shape, tuple(c.name for c in self.shape.columns if pa.types.is_decimal(c.arrow_type)))
            self._decimals = known
        return known[1]

    def _park(self, row: dict[str, Any], problem: str) -> None:
        """A change that cannot load (not in `rows`): parked, with the earlier rows of its key (`_set_aside`)."""
        self.bad.append((row, problem))
        key = self._key(row)
        self._last.pop(key, None)  # a soft delete after it takes no older values for the row's last
        self.rows = [r for r in self.rows if self._key(r) != key]

    def _set_aside(self, problems: dict[int, str]) -> list[bool]:
        """Park the rows at `problems`' indices (index -> why) with the earlier rows of their keys in this batch:
        a row of the key that loads in the same batch releases its dead letter (the load releases the keys it
        loads), and that older version would stand for the newest in the target, the parked change lost without a
        word (an update that fits, then one over `max_value_bytes`). The target keeps the key's version from before
        the batch, as a table stream's target keeps a row whose newest read parks; a later change that fits lands
        and releases it. Returns which of `rows` stay."""
        last: dict[Key, int] = {}  # each parked key's last parked index
        for index in sorted(problems):
            self.bad.append((self.rows[index], problems[index]))
            last[self._key(self.rows[index])] = index
        kept = [index > last.get(self._key(row), -1) for index, row in enumerate(self.rows)]
        self.rows = [row for row, keep in zip(self.rows, kept, strict=True) if keep]
        return kept

    def to_arrow(self, generation: int) -> pa.Table | None:
        """The rows as typed Arrow with the metadata columns; the parse is the snapshot's CSV parse and decoding.
        A change with a value that does not fit (an array LIST cannot hold, a value over `max_value_bytes` ...)
        moves from `rows` to `bad`, and so do the earlier rows of its key in the batch (`_set_aside`)."""
        if not self.rows:
            return None
        data = self._parsed()
        if not self.rows:
            return None
        now = dt.datetime.now(dt.UTC)
        count = data.num_rows
        return (
            data.append_column(EXTRACTED_AT, pa.repeat(pa.scalar(now, TIMESTAMP_UTC), count))
            .append_column(POSITION, pa.array([r[POSITION] for r in self.rows], VERSION_TYPE))
            .append_column(GENERATION, pa.repeat(pa.scalar(generation, pa.int64()), count))
            .append_column(DELETED_AT, pa.array([r[DELETED_AT] for r in self.rows], TIMESTAMP_UTC))
            .append_column(META, pa.array([r.get(_NOTE) for r in self.rows], pa.string()))
        )

    def _parsed(self) -> pa.Table:
        rare: dict[str, dict[int, str]] = {}  # temporal texts Arrow's CSV reader cannot parse (±infinity, BC ...)
        texts = []
        for column in self.shape.columns:
            values = [row.get(column.name) for row in self.rows]
            if column.kind in TEMPORAL:
                for index, value in enumerate(values):
                    if isinstance(value, str) and temporal_needs_parse(value, column.kind):
                        rare.setdefault(column.name, {})[index] = value
                        values[index] = None
            texts.append(_text_array(values))
        # Written by Arrow as COPY writes its CSV: every text quoted ('""' is an empty text), NULL as nothing.
        written = io.BytesIO()
        columns = pa.Table.from_arrays(texts, names=[f"c{i}" for i in range(len(texts))])
        pacsv.write_csv(columns, written, pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
        data = pacsv.read_csv(io.BytesIO(written.getvalue()), **csv_options(self.shape))
        found: dict[int, list[str]] = defaultdict(list)  # row -> its problems
        # measured as a table stream measures them (bad_values.py): bytea as its bytes, the rest as its text
        data = null_oversized(decode_binary(data, self.shape), self.max_value_bytes, found)
        data, unfitting = decode_texts(data, self.shape, rare)
        for index, items in unfitting.items():
            found[index] += [str(item) for item in items]
        if found and self.null_bad:  # the values are nulled in `data`: the rows load, unless a key value was nulled
            data, found = self._noted(data, found)
        if found:
            kept = self._set_aside({index: "; ".join(why) for index, why in found.items()})
            data = data.filter(pa.array(kept))
        return data

    def _noted(self, data: pa.Table, found: dict[int, list[str]]) -> tuple[pa.Table, dict[int, list[str]]]:
        """`on_bad_value: null`: the rows of `found` load with their unfit values nulled (as in `data`), each noted
        in `_ingest_meta` as a table stream notes it; returns the rows that still park (a key value nulled: the
        merge cannot key them)."""
        keyless = [i for i in found if any(not data.column(k)[i].is_valid for k in self.primary_key)]
        for index, why in found.items():
            if index not in keyless:
                earlier = json.loads(self.rows[index][_NOTE])["nulled"] if self.rows[index].get(_NOTE) else None
                note = "; ".join([earlier, *why] if earlier else why)
                self.rows[index] = {**self.rows[index], _NOTE: json.dumps({"nulled": note})}
        return data, {i: found[i] for i in keyless}

    def dead_letter_rows(self) -> list[tuple[str, str, str]]:
        """(record key, error, raw JSON) of the changes whose values cannot load."""
        keys = self.key_texts([row for row, _ in self.bad])
        return [
            (key, problem, json.dumps({k: v for k, v in row.items() if k != _NOTE}, default=str))
            for key, (row, problem) in zip(keys, self.bad, strict=True)
        ]

    def key_texts(self, rows: list[dict[str, Any]]) -> list[str]:
        """The rows' keys as `record_keys` spells them when the rows load (the key values parsed as the table's
        types): a parked change is released by the load of its key. The log's own text (`2024-01-01
        00:00:00+00` where the load spells `2024-01-01 00:00:00.000000Z`) left it parked for good. A key value
        the types cannot read (it can never load either) keeps the log's text."""
        if not rows:
            return []
        try:
            return self._parsed_keys(rows)
        except (pa.ArrowInvalid, ValueError, KeyError):
            pass
        texts = []
        for row in rows:  # one of them does not parse: each alone
            try:
                texts += self._parsed_keys([row])
            except (pa.ArrowInvalid, ValueError, KeyError):
                texts.append(log_key_text(row, self.primary_key))
        return texts

    def _parsed_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [str(text) for text in record_keys(self._typed_keys(rows), self.primary_key).to_pylist()]

    def _typed_keys(self, rows: list[dict[str, Any]]) -> pa.Table:
        """The rows' key columns parsed as a change's rows are (raises when a value does not fit its column)."""
        shape = replace(self.shape, columns=tuple(self.shape.column(k) for k in self.primary_key))
        keys = TableChanges(
            shape,
            self.primary_key,
            rows=[{k: row.get(k) for k in self.primary_key} for row in rows],
            max_value_bytes=sys.maxsize,  # a key's text, whatever its size
        )
        data = keys._parsed()
        if len(keys.rows) != len(rows):
            raise ValueError("a key value does not fit its column")
        return data

    def marks_table(self) -> pa.Table | None:
        """The soft-delete marks as rows: each key column typed as the table's rows load (source names), the
        delete's version and time. Matched against the target's typed key columns: as the log's text they
        matched no row whose key's text the target spells otherwise (a bool `t` against `true`, a float, bytea),
        and the run flagged nothing. A key value the types cannot read is in no target row: left out."""
        if not self.marks:
            return None
        keys = list(self.marks)
        rows = [dict(zip(self.primary_key, key, strict=True)) for key in keys]
        try:
            data, kept = self._typed_keys(rows), keys
        except (pa.ArrowInvalid, ValueError, KeyError):
            pieces, kept = [], []
            for key, row in zip(keys, rows, strict=True):
                try:
                    pieces.append(self._typed_keys([row]))
                except (pa.ArrowInvalid, ValueError, KeyError):
                    continue
                kept.append(key)
            if not pieces:
                return None
            data = pa.concat_tables(pieces)
        return data.append_column(POSITION, pa.array([self.marks[k][0] for k in kept], VERSION_TYPE)).append_column(
            DELETED_AT, pa.array([self.marks[k][1] for k in kept], TIMESTAMP_UTC)
        )


def log_key_text(row: dict[str, Any], primary_key: Sequence[str]) -> str:
    """A change's key as the log's text of its values (what CDC parked rows under before `key_texts`)."""
    return "|".join(key_part(str(row.get(k))) for k in primary_key)


def _text_array(values: list[Any]) -> pa.Array:
    """One column's values as Arrow text: the log's texts as they are, anything else by its `str`."""
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.array([None if value is None else str(value) for value in values], pa.string())


def mark_deleted(loader: Loader, marks: pa.Table | None) -> int:
    """Soft deletes of rows whose values only the target holds: flag them, keep every value. A row already
    at a newer version (a copy, a later change) is left alone. `marks` (`marks_table`, key columns named as the
    target names them): keys compare as typed values, as the rows landed."""
    if marks is None or not marks.num_rows:
        return 0
    if loader.destination.is_lake:  # no UPDATE statement there: the table format's own MERGE (loading/lake.py)
        return int(loader.mark_deleted(marks))  # type: ignore[attr-defined]
    flagged = 0
    with loader.client() as client:
        table = client.make_qualified_table_name(loader.target.table)
        if not table_exists(client, table):
            return 0
        where = " AND ".join(f"{client.escape_column_name(k)} = %s" for k in loader.key)
        deleted, position = client.escape_column_name(DELETED_AT), client.escape_column_name(POSITION)
        keys = [marks.column(k) for k in loader.key]
        versions, times = marks.column(POSITION).to_pylist(), marks.column(DELETED_AT).to_pylist()
        for index, (version, when) in enumerate(zip(versions, times, strict=True)):
            client.execute_sql(
                f"UPDATE {table} SET {deleted} = %s, {position} = {int(version)} WHERE {where} "
                f"AND {deleted} IS NULL AND ({position} IS NULL OR {position} < {int(version)})",
                when,
                *[plain(column[index]) for column in keys],
            )
            flagged += 1
    return flagged


def dead_letter_table(stream: PostgresTableStream, changes: TableChanges, run_id: str) -> pa.Table | None:
    rows = changes.dead_letter_rows()
    if not rows:
        return None
    now = dt.datetime.now(dt.UTC)
    records = [
        {
            "stream": stream.name,
            "partition": "",
            "record_key": key,
            "run_id": run_id,
            "position": "{}",
            "error": error,
            "raw_record": raw,
            "dead_lettered_at": now,
        }
        for key, error, raw in rows
    ]
    return pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)


@dataclass
class SourceRows:
    """The source's current rows by key, as text: values a change does not carry (an unchanged TOASTed value,
    a generated column). One connection for a whole batch of changes, opened at the first lookup."""

    url: str
    _conn: Any = field(default=None, init=False, repr=False)

    def lookup(self, stream: PostgresTableStream, shape: TableShape) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda key: self._current_row(stream, key, shape)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _current_row(self, stream: PostgresTableStream, key: dict[str, Any], shape: TableShape) -> dict[str, Any]:
        from psycopg2 import sql

        if self._conn is None:
            self._conn = connect(self.url, "ingest-cdc-toast")
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT {cols} FROM {table} WHERE {where}").format(
                    cols=sql.SQL(", ").join(_as_logged(sql, c.name) for c in shape.columns),
                    table=sql.Identifier(stream.spec.schema_name, stream.spec.table_name),
                    # The log's text read as the column's type (an untyped literal): compared as text, a bool
                    # key's `t` met `true` and no row was found (the large value landed as NULL).
                    where=sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in key),
                ),
                [str(v) for v in key.values()],
            )
            row = cur.fetchone()
        return dict(zip([c.name for c in shape.columns], row, strict=True)) if row else {}


def _as_logged(sql: Any, column: str) -> Any:
    """A column's value as the log sends it: its type's output text (`format('%s', ...)`). A cast to text is
    not always that: a bool reads `true` (the log: `t`), a char(n) loses its padding, an inet gains its mask."""
    name = sql.Identifier(column)
    text = "CASE WHEN {} IS NULL THEN NULL ELSE format('%%s', {}) END"  # %%: the statement takes parameters
    return sql.SQL(text).format(name, name)
