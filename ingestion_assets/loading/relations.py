"""What the target holds, asked through its SQL client (DuckDB and PostgreSQL alike)."""

from __future__ import annotations

from typing import Any

from ingestion_assets.loading.target_sql import undefined_relation


def table_exists(client: Any, qualified: str) -> bool:
    """Whether the (qualified) table is there. On PostgreSQL call it outside a transaction: the failed
    statement that says "no" would abort one."""
    try:
        client.execute_sql(f"SELECT 1 FROM {qualified} LIMIT 0")
    except undefined_relation():
        return False
    return True
