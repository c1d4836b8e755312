"""The systems streams read from, as external assets upstream of them: each source table (kind `postgres`),
each API endpoint (kind `api`) and each CDC source's replication slot, so the lineage graph starts where the
data comes from. Dagster does not materialize these; their metadata says what and where they are."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit, urlunsplit

import dagster as dg

from ingestion_assets.catalog import (
    Catalog,
    FilesSource,
    FilesStream,
    PostgresSource,
    PostgresStream,
    RestSource,
    RestStream,
)
from ingestion_assets.catalog.postgres import split_table_name

SOURCE_PREFIX = "source"


def table_key(source_name: str, table: str) -> dg.AssetKey:
    """Dagster names allow only [A-Za-z0-9_]: a schema or table named otherwise (spaces, quotes, unicode) gets
    that spelling plus a short hash of its real name, so two tables never share a key."""
    return dg.AssetKey([SOURCE_PREFIX, source_name, *(_key_part(part) for part in split_table_name(table))])


def _key_part(name: str) -> str:
    plain = re.sub(r"[^A-Za-z0-9_]+", "_", name)
    return plain if plain == name else f"{plain.strip('_') or 'x'}_{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def endpoint_key(source_name: str, path: str) -> dg.AssetKey:
    return dg.AssetKey([SOURCE_PREFIX, source_name, re.sub(r"[^A-Za-z0-9_]+", "_", path).strip("_") or "root"])


def slot_key(source_name: str, source: PostgresSource) -> dg.AssetKey:
    return dg.AssetKey([SOURCE_PREFIX, source_name, "slot", slot_name(source_name, source)])


def slot_name(source_name: str, source: PostgresSource) -> str:
    return source.cdc.slot or f"ingest_{source_name}"


def files_key(source_name: str, pattern: str) -> dg.AssetKey:
    return dg.AssetKey(
        [SOURCE_PREFIX, source_name, "files", re.sub(r"[^A-Za-z0-9_]+", "_", pattern).strip("_") or "all"]
    )


def stream_source_key(source_name: str, spec: PostgresStream | RestStream | FilesStream) -> dg.AssetKey:
    """What a (table-polling, API or files) stream reads; a CDC stream reads its source's slot instead."""
    if isinstance(spec, FilesStream):
        return files_key(source_name, spec.path)
    return (
        table_key(source_name, spec.table) if isinstance(spec, PostgresStream) else endpoint_key(source_name, spec.path)
    )


def source_specs(catalog: Catalog) -> list[dg.AssetSpec]:
    """One spec per table, endpoint and slot the catalog reads (a table two streams read appears once)."""
    specs: dict[dg.AssetKey, dg.AssetSpec] = {}
    for source_name, source in catalog.sources.items():
        if isinstance(source, PostgresSource):
            tables = {spec.table for spec in source.streams.values()}
            for table in sorted(tables):
                key = table_key(source_name, table)
                specs.setdefault(key, _table_spec(key, source_name, source, table))
            if source.mode == "cdc":
                key = slot_key(source_name, source)
                deps = [table_key(source_name, t) for t in sorted(tables)]
                specs[key] = _slot_spec(key, source_name, source, deps)
        elif isinstance(source, FilesSource):
            for files in source.streams.values():
                key = files_key(source_name, files.path)
                specs.setdefault(key, _files_spec(key, source_name, source, files))
        elif isinstance(source, RestSource):
            for spec in source.streams.values():
                key = endpoint_key(source_name, spec.path)
                specs.setdefault(key, _endpoint_spec(key, source_name, source, spec))
    return list(specs.values())


def _table_spec(key: dg.AssetKey, source_name: str, source: PostgresSource, table: str) -> dg.AssetSpec:
    readers = [name for name, spec in source.streams.items() if spec.table == table]
    how = "its replication slot" if source.mode == "cdc" else "cursor reads"
    return dg.AssetSpec(
        key,
        group_name=source_name,
        kinds={"postgres"},
        description=f"PostgreSQL table {table} of source {source_name}, read by {how}",
        metadata={
            "source": source_name,
            "table": table,
            "connection": source.connection.describe(),  # the reference, never the value
            "read by streams": ", ".join(readers),
            "capture": source.mode,
        },
    )


def _slot_spec(key: dg.AssetKey, source_name: str, source: PostgresSource, deps: list[dg.AssetKey]) -> dg.AssetSpec:
    return dg.AssetSpec(
        key,
        group_name=source_name,
        kinds={"postgres", "cdc"},
        deps=deps,
        description=f"logical replication slot of source {source_name} (pgoutput): its streams read their "
        "changes from it; the slot sensor records its retained WAL and lag",
        metadata={
            "source": source_name,
            "slot": slot_name(source_name, source),
            "publication": source.cdc.publication or f"ingest_{source_name}",
            "connection": source.connection.describe(),
            "max retained WAL (MB)": source.cdc.max_retained_wal_mb,
        },
    )


def _endpoint_spec(key: dg.AssetKey, source_name: str, source: RestSource, spec: RestStream) -> dg.AssetSpec:
    return dg.AssetSpec(
        key,
        group_name=source_name,
        kinds={"api"},
        description=f"HTTP API endpoint {spec.path} of source {source_name}",
        metadata={
            "source": source_name,
            "base url": _safe_url(source.base_url) if isinstance(source.base_url, str) else source.base_url.describe(),
            "path": spec.path,
            "auth": source.auth.type,
            "pagination": spec.pagination.style,
            "rate limit (requests/s)": source.rate_limit.requests_per_second,
        },
    )


def _files_spec(key: dg.AssetKey, source_name: str, source: FilesSource, spec: FilesStream) -> dg.AssetSpec:
    return dg.AssetSpec(
        key,
        group_name=source_name,
        kinds={"files"},
        description=f"files {spec.path} under {_safe_url(source.url)} of source {source_name}",
        metadata={
            "source": source_name,
            "url": _safe_url(source.url),
            "pattern": spec.path,
            "format": spec.format or "(from the file suffix)",
        },
    )


def _safe_url(url: str) -> str:
    """A literal base URL without any user and password it may carry."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
