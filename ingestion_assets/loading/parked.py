"""The dead-letter table in the destination: write, list, release."""

from __future__ import annotations

from typing import Any

import dlt
import pyarrow as pa
from dlt.destinations.exceptions import DatabaseUndefinedRelation

from ingestion_assets.loading.dead_letters import DEAD_LETTER_HINTS, DEAD_LETTER_KEY, DEAD_LETTER_TABLE


def dead_letter_resource(records: pa.Table) -> Any:
    """Merged on (stream, partition, record_key): a re-read slice updates its entries, never doubles them."""
    hints: dict[str, Any] = {
        "name": DEAD_LETTER_TABLE,
        "table_name": DEAD_LETTER_TABLE,
        "write_disposition": "merge",
        "primary_key": list(DEAD_LETTER_KEY),
        "columns": DEAD_LETTER_HINTS,
    }
    return dlt.resource([records], **hints)


def parked_keys(pipeline: Any, stream: str) -> set[str]:
    with pipeline.sql_client() as client:
        return parked_keys_in(client, stream)


def parked_keys_in(client: Any, stream: str) -> set[str]:
    """With a client already open (under the writer lock: taking it again from this process would wait)."""
    table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
    try:
        rows = client.execute_sql(f"SELECT record_key FROM {table} WHERE stream = %s", stream) or []
    except DatabaseUndefinedRelation:
        return set()
    return {str(row[0]) for row in rows}


def parked_rows(pipeline: Any, stream: str) -> list[dict[str, Any]]:
    columns = ("partition", "record_key", "run_id", "error", "raw_record", "dead_lettered_at")
    statement = f"SELECT {', '.join(columns)} FROM {{table}} WHERE stream = %s ORDER BY dead_lettered_at, record_key"
    return [dict(zip(columns, row, strict=True)) for row in _query(pipeline, statement, (stream,))]


def delete_parked(pipeline: Any, stream: str, keys: list[str]) -> None:
    with pipeline.sql_client() as client:
        delete_parked_in(client, stream, keys)


def delete_parked_in(client: Any, stream: str, keys: list[str]) -> None:
    """With a client already open (inside a batch's transaction: the table exists, its keys were read)."""
    table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ", ".join(["%s"] * len(chunk))
        client.execute_sql(f"DELETE FROM {table} WHERE stream = %s AND record_key IN ({marks})", stream, *chunk)


def _query(pipeline: Any, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with pipeline.sql_client() as client:
        table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
        try:
            return list(client.execute_sql(statement.format(table=table), *params) or [])
        except DatabaseUndefinedRelation:
            return []
