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


def nested_tables(client: Any, table: str) -> list[str]:
    """dlt's nested tables of `table` in the client's dataset (`table__field`, and theirs), by their names there:
    what a stream's API records or JSON documents with lists land in, tied to their row by `_dlt_parent_id`."""
    rows = client.execute_sql(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", client.dataset_name
    )
    prefix = f"{table}__"
    return sorted(str(name) for (name, *_) in rows or [] if str(name).startswith(prefix))
