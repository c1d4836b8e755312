"""A timestamp written without a zone lands as one (`timestamp without time zone`, what `ingest schema show` and
the README say), with its wall time as written; one written with a zone lands as an instant."""

from __future__ import annotations

import datetime as dt

from ingestion_assets_tests.files_helpers import Target, target, target_catalog

__all__ = ["target"]  # the fixture: each test once on DuckDB, once on PostgreSQL


def test_a_timestamp_without_a_zone_lands_without_one(target: Target) -> None:
    target.drops.write("a.csv", "id,at,zoned\n1,2026-01-01 10:00:00,2026-01-01T10:00:00+02:00\n", 1_700_000_000)
    target.drops.write("b.csv", "id,at\n2,2026-01-02 11:30:00\n", 1_700_000_100)
    target_catalog(target, "*.csv")
    target.drops.run()
    assert target.column_type("at") == ("timestamp" if target.url is None else "timestamp without time zone")
    assert "with time zone" in target.column_type("zoned")
    rows = target.query('SELECT id, "at" FROM drops.orders ORDER BY id')
    naive = [(1, dt.datetime(2026, 1, 1, 10, 0)), (2, dt.datetime(2026, 1, 2, 11, 30))]  # noqa: DTZ001 (what the file says)
    assert rows == naive
