"""A file bringing a new column that updates a key already in an Iceberg table: pyiceberg's upsert read the matched
rows in the schema of the table's last snapshot, without the column dlt had just added, and every run failed
("Target schema's field names are not matching the table's field names"; README: `evolve` adds columns). Now the
merge takes the column, also in a table a failed run left with its schema ahead of its snapshot."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import yaml

from ingestion_assets.streams.postgres_table import Target
from ingestion_assets_tests.destination_targets import iceberg_rows
from ingestion_assets_tests.files_helpers import Drops

BASE = 1_700_000_000.0


def _iceberg(drops: Drops) -> Path:
    drops.catalog(path="*.jsonl", primary_key="id")
    catalog = yaml.safe_load(drops.settings.catalog_path.read_text())
    lake = drops.root / "lake"
    catalog["destination"] = {"type": "filesystem", "bucket_url": str(lake), "table_format": "iceberg"}
    drops.settings.catalog_path.write_text(yaml.safe_dump(catalog))
    return lake / "drops" / "orders"


def test_a_new_column_updating_an_existing_key_merges_into_iceberg(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    table = _iceberg(drops)
    drops.write("f1.jsonl", '{"id":1,"v":"a"}\n{"id":2,"v":"b"}\n', BASE)
    drops.run()
    drops.write("f2.jsonl", '{"id":1,"v":"a2","extra":5}\n{"id":3,"v":"c","extra":7}\n', BASE + 10)
    assert drops.run().result.rows == 2
    assert iceberg_rows(str(table), ["id", "v", "extra"], "id") == [(1, "a2", 5), (2, "b", None), (3, "c", 7)]


def test_a_table_left_with_its_schema_ahead_of_its_snapshot_merges_again(tmp_path: Path) -> None:
    """The state a failed run left (dlt added the column, the upsert then failed): the next run merges."""
    drops = Drops(tmp_path)
    table = _iceberg(drops)
    drops.write("f1.jsonl", '{"id":1,"v":"a"}\n', BASE)
    drops.run()
    stream = drops.stream()
    loader = stream.loader(Target(stream.name, 1), None)
    iceberg = loader.tables.open("orders")  # type: ignore[attr-defined]
    with iceberg.update_schema() as update:
        update.union_by_name(pa.schema([pa.field("extra", pa.int64())]))
    drops.write("f2.jsonl", '{"id":1,"v":"a2","extra":5}\n', BASE + 10)
    drops.run()
    assert iceberg_rows(str(table), ["id", "v", "extra"], "id") == [(1, "a2", 5)]
