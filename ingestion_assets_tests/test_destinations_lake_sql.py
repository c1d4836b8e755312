"""The lake's SQL view: readers query the table format's rows; a statement that would change them is refused."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dlt.destinations.exceptions import DatabaseUndefinedRelation

from ingestion_assets.loading.lake_sql import ReadOnlyLake, lake_sql_view


def test_the_view_reads_a_lake_table_and_refuses_to_change_it() -> None:
    tables = {"items": pa.table({"id": [1, 2, 3], "name": ["a", "b", None]})}
    with lake_sql_view(tables.get) as view:
        table = view.make_qualified_table_name("items")
        assert view.execute_sql(f"SELECT id FROM {table} WHERE name = %s", "b") == [(2,)]
        with pytest.raises(DatabaseUndefinedRelation):
            view.execute_sql(f"SELECT 1 FROM {view.make_qualified_table_name('gone')}")
        with pytest.raises(ReadOnlyLake, match="DELETE is not built"):
            view.execute_sql(f"DELETE FROM {table} WHERE id = 1")  # would otherwise read as "no such table"
        with pytest.raises(ReadOnlyLake, match="a transaction"):
            view.begin_transaction()
    assert tables["items"].num_rows == 3
