"""Values MariaDB/MySQL cannot hold are parked as dead letters with the reason, never loaded altered.

DOUBLE has no NaN or infinity (the driver refuses the whole slice); DATETIME and DATE span the years
1000-9999 (PostgreSQL reaches 4713 BC and 294276 AD). What MariaDB holds differently but exactly is
written in the README (timestamptz lands as DATETIME(6) in UTC; numeric without a precision as its text).
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.loading.bindings import set_generation
from ingestion_assets.loading.dead_letters import DEAD_LETTER_SCHEMA, record_keys
from ingestion_assets.loading.lake_sql import keep_newest_in_duckdb
from ingestion_assets.loading.metadata_columns import POSITION
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import table_exists
from ingestion_assets.loading.sql_targets import target_versions
from ingestion_assets.loading.versions import KeyCheck

MIN_YEAR, MAX_YEAR = 1000, 9999


def unfit_reasons(table: pa.Table) -> list[str | None]:
    """Per row: why MariaDB cannot hold it as it is (None: it can)."""
    reasons: list[str | None] = [None] * table.num_rows
    for name in table.column_names:
        column = table.column(name)
        kind = column.type
        if pa.types.is_floating(kind):
            bad = pc.or_(pc.is_nan(column), pc.is_inf(column))
            why = f"column {name}: MariaDB's DOUBLE holds no NaN or infinity"
        elif pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            years = pc.year(column)
            bad = pc.or_(pc.less(years, MIN_YEAR), pc.greater(years, MAX_YEAR))
            why = f"column {name}: MariaDB's DATE/DATETIME span the years {MIN_YEAR}-{MAX_YEAR}"
        else:
            continue
        for index, flagged in enumerate(pc.fill_null(bad, False).to_pylist()):
            if flagged and reasons[index] is None:
                reasons[index] = why
    return reasons


@dataclass
class MariaDbLoader(Loader):
    """Before each slice loads: rows with a value MariaDB would refuse or alter go to the dead letters."""

    def load(self, table: pa.Table | None, dead_letters: pa.Table | None = None) -> int:
        if table is None or not table.num_rows:
            return super().load(table, dead_letters)
        reasons = unfit_reasons(table)
        if not any(reasons):
            return super().load(table, dead_letters)
        unfit = pa.array([r is not None for r in reasons])
        parked = self._dead_letters(table.filter(unfit), [r for r in reasons if r is not None])
        merged = parked if dead_letters is None else pa.concat_tables([dead_letters, parked])
        return super().load(table.filter(pc.invert(unfit)), merged)

    def _check_versions(self, table: pa.Table) -> KeyCheck:
        """The version guard: the target's versions of the slice's keys, compared in DuckDB."""
        with self._pipeline.sql_client() as client:
            found = target_versions(client, self.target.table, self.key, table, self.source_column)
        return keep_newest_in_duckdb(found, table, self.key, self.source_column)

    def swap_in(self, shadow: str, table: str, generation: int | None = None) -> None:
        """MySQL's DDL commits on its own: the swap is one RENAME TABLE of both names, which MySQL does
        atomically; the retired table is dropped after it and the generation recorded last (a crash between
        them leaves the new generation in place, which the next run recognises by its rows)."""
        with self._lock(), self._pipeline.sql_client() as client:
            target = client.make_qualified_table_name(table)
            source = client.make_qualified_table_name(shadow)
            retired = client.make_qualified_table_name(f"_ingest_retired_{zlib.crc32(shadow.encode()):08x}")
            if not table_exists(client, source):  # the refresh read no row: the stream's table holds none
                if table_exists(client, target):
                    client.execute_sql(f"DELETE FROM {target}")
            elif table_exists(client, target):
                client.execute_sql(f"DROP TABLE IF EXISTS {retired}")
                client.execute_sql(f"RENAME TABLE {target} TO {retired}, {source} TO {target}")
                client.execute_sql(f"DROP TABLE {retired}")
            else:
                client.execute_sql(f"RENAME TABLE {source} TO {target}")
            if generation is not None:
                set_generation(client, table, generation)
        self._pipeline.drop()

    def _dead_letters(self, rows: pa.Table, reasons: list[str]) -> pa.Table:
        now = dt.datetime.now(dt.UTC)
        keys = record_keys(rows, self.target.primary_key).to_pylist()
        records: list[dict[str, Any]] = []
        for key, reason, row in zip(keys, reasons, as_text_temporals(rows).to_pylist(), strict=True):
            records.append(
                {
                    "stream": self.stream_name,
                    "partition": self._bound_partition or "",
                    "record_key": key,
                    "run_id": "",
                    "position": json.dumps({POSITION: row.get(POSITION)}, default=str),
                    "error": f"{self.where()} cannot hold this row: {reason}",
                    "raw_record": json.dumps(row, default=str),
                    "dead_lettered_at": now,
                }
            )
        return pa.Table.from_pylist(records, schema=DEAD_LETTER_SCHEMA)


def as_text_temporals(rows: pa.Table) -> pa.Table:
    """Dates and times as Arrow's own text: Python's datetime stops at the year 9999 (a Parquet timestamp of the
    year 10000 would raise while being parked), and parking must never fail on the value it parks."""
    for index, kind in enumerate(rows.schema.types):
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            rows = rows.set_column(index, rows.field(index).name, pc.cast(rows.column(index), pa.string()))
    return rows
