"""The catalog's streams as the definitions see them: what a stream is (names, spec, source, destination), not
how it runs. The running stream (readers, loaders, dlt) is built only where a step or a sensor needs it, so
loading the definitions (the CLI process, the webserver, every step process before its step) never imports
dlt, sqlglot or the readers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion_assets.catalog import (
    Catalog,
    Destination,
    FilesSource,
    FilesStream,
    PostgresSource,
    PostgresStream,
    RestSource,
    RestStream,
)
from ingestion_assets.settings import Settings

if TYPE_CHECKING:
    from ingestion_assets.streams.runner import Stream


@dataclass(frozen=True)
class StreamRef:
    """One catalog stream, with the attributes the definitions read; `open_stream` gives the running one."""

    settings: Settings
    destination: Destination
    source_name: str
    source: PostgresSource | RestSource | FilesSource
    name: str
    spec: PostgresStream | RestStream | FilesStream

    @property
    def qualified_name(self) -> str:
        return f"{self.source_name}.{self.name}"


def catalog_refs(settings: Settings, catalog: Catalog) -> list[StreamRef]:
    """Every table, API and files stream of the catalog, in its order."""
    refs: list[StreamRef] = []
    for source_name, source, stream_name, spec in catalog.streams():
        if (
            (isinstance(source, RestSource) and isinstance(spec, RestStream))
            or (isinstance(source, FilesSource) and isinstance(spec, FilesStream))
            or (isinstance(source, PostgresSource) and isinstance(spec, PostgresStream))
        ):
            refs.append(StreamRef(settings, catalog.destination, source_name, source, stream_name, spec))
    return refs


def open_stream(ref: StreamRef | Stream) -> Stream:
    """The running stream of `ref` (a running stream is returned as it is)."""
    if not isinstance(ref, StreamRef):
        return ref
    where = (ref.settings, ref.destination, ref.source_name)
    if isinstance(ref.source, RestSource) and isinstance(ref.spec, RestStream):
        from ingestion_assets.streams.rest_api import RestApiStream  # each kind's readers: only its own

        return RestApiStream(*where, ref.source, ref.name, ref.spec)
    if isinstance(ref.source, FilesSource) and isinstance(ref.spec, FilesStream):
        from ingestion_assets.streams.files import FileSourceStream

        return FileSourceStream(*where, ref.source, ref.name, ref.spec)
    from ingestion_assets.streams.postgres_table import PostgresTableStream

    assert isinstance(ref.source, PostgresSource) and isinstance(ref.spec, PostgresStream)
    return PostgresTableStream(*where, ref.source, ref.name, ref.spec)


def catalog_streams(settings: Settings, catalog: Catalog) -> list[Stream]:
    """The running streams of the catalog (for the CLI, checks and tests that drive them directly)."""
    return [open_stream(ref) for ref in catalog_refs(settings, catalog)]


def is_cdc(stream: StreamRef | Stream) -> bool:
    """Streams of a `mode: cdc` source are materialized together, from their slot (defs/cdc.py)."""
    return isinstance(stream.source, PostgresSource) and stream.source.mode == "cdc"


def is_table(stream: StreamRef | Stream) -> bool:
    """A PostgreSQL table stream (what `isinstance(stream, PostgresTableStream)` says of a running one)."""
    return isinstance(stream.spec, PostgresStream)
