"""Loading the code location imports no loader: dlt and sqlglot come in with a step that loads, not with the
definitions every Dagster process (CLI, webserver, daemon, each step process) builds first; nor the clients of
the destinations and APIs (DuckDB, MySQL, httpx), which only a step or a sensor tick uses; nor Celery, which
only a distributed deployment uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CATALOG = """
sources:
  shop:
    type: postgres
    connection: {env: NO_SUCH_SOURCE_URL}
    schedule: "*/15 * * * *"
    streams:
      orders: {table: public.orders, primary_key: id, cursor: updated_at}
      by_key: {table: public.orders, primary_key: id, cursor: updated_at, partitions: {by: key, chunk: 1000}}
      by_day:
        table: public.orders
        primary_key: id
        cursor: updated_at
        partitions: {by: time, column: updated_at, start: "2024-01-01"}
  shop_cdc:
    type: postgres
    mode: cdc
    connection: {env: NO_SUCH_SOURCE_URL}
    streams:
      products: {table: public.products, primary_key: sku}
  api:
    type: rest
    base_url: http://127.0.0.1:9/
    streams:
      orders: {path: /v1/orders, primary_key: id, cursor: updated_at}
  drops:
    type: files
    url: {drops}
    streams:
      rows: {path: "*.csv", primary_key: id}
"""

# Fails the import of any module that loads data, and names who asked for it.
PROBE = """
import importlib.abc, sys, traceback
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("dlt", "sqlglot", "pyarrow", "duckdb", "pymysql", "httpx", "celery", "kombu"):
            asked = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "ingestion_assets" in f.filename]
            raise ImportError(f"{name} imported while loading the definitions, by {asked[-3:]}")
        return None
sys.meta_path.insert(0, Refuse())
from ingestion_assets.definitions import defs
built = defs()
import json
print(json.dumps(sorted("/".join(k.path) for k in built.resolve_asset_graph().get_all_asset_keys())))
print(json.dumps(sorted(s.name for s in built.sensors or [])))
"""


def test_building_the_definitions_imports_no_loader(tmp_path: Path) -> None:
    (tmp_path / "drops").mkdir()
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG.replace("{drops}", str(tmp_path / "drops")))
    env = {**os.environ, "INGEST_HOME": str(tmp_path / "home"), "INGEST_CATALOG": str(catalog)}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assets, sensors = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    streams = ["api/orders", "drops/rows", "shop/by_day", "shop/by_key", "shop/orders", "shop_cdc/products"]
    assert set(streams) <= set(assets)
    assert sensors == ["shop__by_key__plan_key_ranges", "shop_cdc__cdc_slot"]
