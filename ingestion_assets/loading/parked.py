"""The dead-letter table in the destination: write, list, release, discard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ingestion_assets.loading.dead_letters import DEAD_LETTER_HINTS, DEAD_LETTER_KEY, DEAD_LETTER_TABLE
from ingestion_assets.loading.storable_text import storable_dead_letters
from ingestion_assets.loading.target_sql import TargetSqlClient, undefined_relation


def dead_letter_resource(records: pa.Table, postgres: bool = False) -> Any:
    """Merged on (stream, partition, record_key): a re-read slice updates its entries, never doubles them.
    `postgres`: the target is PostgreSQL, whose text and jsonb cannot hold a NUL (written out as `\\u0000`); no
    target's JSON holds half a surrogate pair (written out as `\\ud800`)."""
    json_columns = tuple(name for name, hint in DEAD_LETTER_HINTS.items() if hint["data_type"] == "json")
    import dlt  # dead letters load through dlt: a run that parks none never imports it

    records = storable_dead_letters(records, json_columns, postgres)
    hints: dict[str, Any] = {
        "name": DEAD_LETTER_TABLE,
        "table_name": DEAD_LETTER_TABLE,
        "write_disposition": "merge",
        "primary_key": list(DEAD_LETTER_KEY),
        "columns": DEAD_LETTER_HINTS,
    }
    return dlt.resource([records], **hints)


def parked_keys(loader: Any, stream: str) -> set[str]:
    """`loader`: the stream's Loader (anything with dlt's `sql_client()`)."""
    with loader.sql_client() as client:
        return parked_keys_in(client, stream)


def parked_keys_in(client: Any, stream: str) -> set[str]:
    """With a client already open (under the writer lock: taking it again from this process would wait)."""
    if isinstance(client, TargetSqlClient) and not client.has_table(DEAD_LETTER_TABLE):
        return set()  # no dead letter yet (most streams): asked without a failing statement
    table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
    key, name = (client.escape_column_name(c) for c in ("record_key", "stream"))
    try:
        rows = client.execute_sql(f"SELECT {key} FROM {table} WHERE {name} = %s", stream) or []
    except undefined_relation():
        return set()
    return {str(row[0]) for row in rows}


def parked_rows(loader: Any) -> list[dict[str, Any]]:
    """The loader's stream's dead letters, oldest first, read through the loader's own client (a lake's is a
    read-only view over the table format's reader: no DuckDB extension to download)."""
    columns = ("partition", "record_key", "run_id", "error", "raw_record", "dead_lettered_at")
    with loader.client() as client:
        table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
        quoted = {c: client.escape_column_name(c) for c in (*columns, "stream")}
        statement = (
            f"SELECT {', '.join(quoted[c] for c in columns)} FROM {table} WHERE {quoted['stream']} = %s "
            f"ORDER BY {quoted['dead_lettered_at']}, {quoted['record_key']}"
        )
        try:
            found = list(client.execute_sql(statement, loader.stream_name) or [])
        except undefined_relation():
            return []
    return [dict(zip(columns, row, strict=True)) for row in found]


def release_parked(loader: Any, keys: list[str]) -> None:
    """Dead letters of the loader's stream leave, under its writer lock, through its own way of deleting them
    (SQL on a SQL target, the Delta API on a lake)."""
    with loader._lock():
        loader._parked_keys = None
        loader._release_parked_keys(keys)


class UnknownDeadLetters(LookupError):
    """Keys asked to be discarded that the stream has not parked (a typo, or already released)."""


def discard_parked(loader: Any, keys: Sequence[str] | None, apply: bool) -> list[dict[str, Any]]:
    """The loader's stream's dead letters named by `keys` (None: all of them), and with `apply` they leave through
    the release path a load takes (`release_parked`), all under one hold of the writer lock: a running load cannot
    park or release between the look and the delete. A key not parked raises before anything leaves."""
    with loader.held():
        rows = parked_rows(loader)
        if keys is not None:
            known = {row["record_key"] for row in rows}
            unknown = [key for key in dict.fromkeys(keys) if key not in known]
            if unknown:
                raise UnknownDeadLetters(unknown, len(known))
            rows = [row for row in rows if row["record_key"] in set(keys)]
        if apply and rows:
            release_parked(loader, sorted({row["record_key"] for row in rows}))
    return rows


def release_file_keys(loader: Any, whole: dict[str, set[str]]) -> None:
    """A file read again in full (fixed, rewritten): its dead letters (keys `file:line3`, `file:row1`, `file:file`)
    that this read did not park again leave. `whole`: each such file with the keys this read parked."""
    known = loader._parked_keys if loader._parked_keys is not None else loader.parked()
    stale = [key for key in known if _stale(key, whole)]
    if stale:
        release_parked(loader, stale)


def _stale(key: str, whole: dict[str, set[str]]) -> bool:
    """The key names a file of `whole` (its name is the key up to one of its colons) and was not parked again."""
    starts = (key[:at] for at, char in enumerate(key) if char == ":")
    return any(file in whole and key not in whole[file] for file in starts)


def delete_parked(loader: Any, stream: str, keys: list[str]) -> None:
    with loader.sql_client() as client:
        delete_parked_in(client, stream, keys)


def delete_parked_in(client: Any, stream: str, keys: list[str]) -> None:
    """With a client already open (inside a batch's transaction: the table exists, its keys were read)."""
    table = client.make_qualified_table_name(DEAD_LETTER_TABLE)
    key, name = (client.escape_column_name(c) for c in ("record_key", "stream"))
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ", ".join(["%s"] * len(chunk))
        client.execute_sql(f"DELETE FROM {table} WHERE {name} = %s AND {key} IN ({marks})", stream, *chunk)
