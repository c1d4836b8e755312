"""MariaDB/MySQL targets: values they cannot hold are parked (loading/unfit.py: DOUBLE has no NaN or infinity,
the driver refused the whole slice; DATETIME and DATE span the years 1000-9999), the version guard compares in
DuckDB, and the refresh swap is one RENAME TABLE. What MariaDB holds differently but exactly is written in the
README (timestamptz lands as DATETIME(6) in UTC; numeric without a precision as its text).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import pyarrow as pa

from ingestion_assets.loading.bindings import set_generation
from ingestion_assets.loading.lake_sql import keep_newest_in_duckdb
from ingestion_assets.loading.pipeline import Loader
from ingestion_assets.loading.relations import nested_tables, table_exists
from ingestion_assets.loading.sql_targets import column_types, index_keys, table_columns, target_versions
from ingestion_assets.loading.unfit import MARIADB, split_unfit, with_parked
from ingestion_assets.loading.versions import KeyCheck


@dataclass
class MariaDbLoader(Loader):
    """Before each slice loads: rows with a value MariaDB would refuse or alter go to the dead letters."""

    _keys_indexed: bool = field(default=False, init=False)

    def load(self, table: pa.Table | None, dead_letters: pa.Table | None = None) -> int:
        if table is not None and table.num_rows:
            partition = self._bound_partition or ""
            table, parked = split_unfit(
                table, MARIADB, self.where(), self.stream_name, partition, self.target.primary_key, self.run_id
            )
            dead_letters = with_parked(dead_letters, parked)
            self._parked_here += 0 if parked is None else parked.num_rows
        self._index_keys()  # before a merge's delete runs: dlt's staging copy gets its index first
        loaded = super().load(table, dead_letters)
        self._index_keys()  # the table the load created
        return loaded

    def _index_keys(self) -> None:
        if self._keys_indexed or not self.key or self.target.write_disposition != "merge":
            return
        with self._lock(), self._pipeline.sql_client() as client:
            self._keys_indexed = index_keys(client, self.target.dataset, self.target.table, self.key)

    def _check_versions(self, table: pa.Table) -> KeyCheck:
        """The version guard: the target's versions of the slice's keys, compared in DuckDB."""
        with self._pipeline.sql_client() as client:
            found = target_versions(client, self.target.table, self.key, table, self.source_column)
        return keep_newest_in_duckdb(
            found, table, self.key, self.source_column, self.released_sources, self.target.numeric_position
        )

    def held_columns(self) -> frozenset[str] | None:
        with self._lock(), self._pipeline.sql_client() as client:
            return frozenset(table_columns(client, self.target.dataset, self.target.table))

    def held_types(self) -> dict[str, str] | None:
        with self._lock(), self._pipeline.sql_client() as client:
            return column_types(client, self.target.dataset, self.target.table)

    def swap_in(self, shadow: str, table: str, generation: int | None = None) -> None:
        """MySQL's DDL commits on its own: the swap is one RENAME TABLE of both names, which MySQL does
        atomically; the retired table is dropped after it and the generation recorded last (a crash between
        them leaves the new generation in place, which the next run recognises by its rows)."""
        with self._lock(), self._pipeline.sql_client() as client:
            target = client.make_qualified_table_name(table)
            source = client.make_qualified_table_name(shadow)
            retired_name = f"_ingest_retired_{zlib.crc32(shadow.encode()):08x}"
            # the nested tables (lists in API records) go with their root, in the same RENAME TABLE
            old_nested, new_nested = nested_tables(client, table), nested_tables(client, shadow)
            if not table_exists(client, source):  # the refresh read no row: the stream's table holds none
                for emptied in [target, *(client.make_qualified_table_name(n) for n in old_nested)]:
                    if table_exists(client, emptied):
                        client.execute_sql(f"DELETE FROM {emptied}")
            else:
                pairs, dropped = [], []
                for index, old in enumerate([table, *old_nested] if table_exists(client, target) else old_nested):
                    gone = client.make_qualified_table_name(f"{retired_name}_{index}")
                    client.execute_sql(f"DROP TABLE IF EXISTS {gone}")
                    pairs.append(f"{client.make_qualified_table_name(old)} TO {gone}")
                    dropped.append(gone)
                pairs.append(f"{source} TO {target}")
                qualified = client.make_qualified_table_name
                pairs += [f"{qualified(n)} TO {qualified(table + n[len(shadow) :])}" for n in new_nested]
                client.execute_sql(f"RENAME TABLE {', '.join(pairs)}")
                for gone in dropped:
                    client.execute_sql(f"DROP TABLE {gone}")
            if generation is not None:
                set_generation(client, table, generation)
        self._pipeline.drop()
