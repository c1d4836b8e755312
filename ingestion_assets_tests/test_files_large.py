"""A 1 GB CSV streams through in bounded batches: the loading process's memory stays flat (slow-marked)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ingestion_assets_tests.files_helpers import Drops

SIZE_BYTES = int(os.environ.get("FILES_LARGE_BYTES", str(1 << 30)))
ROWS_PER_CHUNK = 500_000


def _write_big_csv(path: Path) -> int:
    """Written in chunks, so the test itself never holds the file either; returns the row count."""
    rows = 0
    with pacsv.CSVWriter(
        str(path), pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    ) as out:
        while path.stat().st_size < SIZE_BYTES:
            ids = pa.array(range(rows, rows + ROWS_PER_CHUNK), pa.int64())
            names = pa.compute.binary_join_element_wise("customer-name-", pa.compute.cast(ids, pa.string()), "")
            out.write_table(pa.table({"id": ids, "name": names, "amount": pa.compute.divide(ids, 7.0)}))
            rows += ROWS_PER_CHUNK
    return rows


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 22M rows: minutes on a loaded 2-core machine
def test_a_1gb_csv_loads_with_flat_memory(tmp_path: Path) -> None:
    drops = Drops(tmp_path)
    rows = _write_big_csv(drops.folder / "big.csv")
    drops.catalog(path="*.csv", write_disposition="append")
    script = "import sys; from ingestion_assets_tests.files_helpers import Drops; from pathlib import Path; Drops(Path(sys.argv[1])).run()"
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stderr=subprocess.DEVNULL)
    watched = psutil.Process(process.pid)
    samples: list[int] = []
    while process.poll() is None:
        try:
            samples.append(watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    peak = max(samples)
    assert process.returncode == 0
    with __import__("duckdb").connect(str(drops.warehouse), read_only=True) as con:
        count, low, high, total = con.execute("SELECT count(*), min(id), max(id), sum(id) FROM drops.orders").fetchone()
    assert (count, low, high, total) == (rows, 0, rows - 1, rows * (rows - 1) // 2)
    file_size = (drops.folder / "big.csv").stat().st_size
    print(f"{file_size >> 20} MB CSV, {rows:,} rows: peak RSS of the loading process {peak >> 20} MB")
    assert peak < 900 << 20, f"peak RSS {peak >> 20} MB"
    first, second = samples[: len(samples) // 2], samples[len(samples) // 2 :]
    assert max(second) < max(first) * 1.25 + (64 << 20), "memory grew with the part of the file read"
