"""`ingest check`: fail fast, before any sync, on what would fail halfway through one."""

from __future__ import annotations

from ingestion_assets.catalog import Catalog
from ingestion_assets.references import UnresolvedReference, resolve
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres import plan_table_read


def check_catalog(settings: Settings, catalog: Catalog) -> list[str]:
    """Every problem found, each naming the source or stream and what to change."""
    import psycopg2

    problems: list[str] = []
    for source_name, source in catalog.sources.items():
        where = f"sources.{source_name}.connection"
        try:
            url = resolve(source.connection, settings, where)
        except UnresolvedReference as exc:
            problems.append(str(exc))
            continue
        for stream_name, stream in source.streams.items():
            try:
                plan_table_read(
                    url,
                    stream.schema_name,
                    stream.table_name,
                    tuple(stream.cursor),
                    tuple(stream.primary_key),
                )
            except psycopg2.OperationalError as exc:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                problems.append(f"{where} ({source.connection.describe()}): cannot connect: {first_line}")
                break
            except LookupError as exc:
                problems.append(f"stream {source_name}.{stream_name}: {exc}")
    return problems
