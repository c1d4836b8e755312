"""A CDC stream paused because its table lost its replica identity (a primary key dropped after it was
published): the table leaves the product's publication at once, the stream stops, the others go on, and
once the table has an identity again the stream is copied again (the log of the pause is not complete)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion_assets.sources.postgres.cdc.identity import Unidentified, unpublish_unidentified

if TYPE_CHECKING:
    from ingestion_assets.catalog import PostgresSource

PAUSED = "paused"  # the checkpoint detail of a paused stream: the message (it holds no log position)
RECOPY = "recopy"  # ... of a stream whose next run copies its table again: why (it holds no log position)


def pause_message(source_name: str, stream_name: str, publication: str, entry: Unidentified) -> str:
    """Names the stream, the table, what was done to the publication and the fix."""
    table = ".".join(entry.table)
    if entry.removed:
        done = (
            f"it was taken out of the product's publication {publication} at once (PostgreSQL rejects the "
            "application's UPDATE and DELETE on a published table without one)"
        )
    elif entry.published:
        done = (
            f"it is still in publication {publication}, which the product does not own, so PostgreSQL rejects the "
            f"application's UPDATE and DELETE on it: run {entry.unpublish} now"
        )
    else:
        done = f"it is not in publication {publication}"
    return (
        f"stream {source_name}.{stream_name} is paused: table {table} {entry.reason}, so its updates and deletes "
        f"carry no key; {done}. To resume it, {entry.fix}: the next run publishes the table again and copies it "
        "again. The other streams of the source go on"
    )


def unread_message(source_name: str, publication: str, entry: Unidentified) -> str:
    """A table no stream of the source reads any more, still in the product's publication, that lost its
    replica identity: it was taken out (no stream to pause)."""
    return (
        f"source {source_name}: table {'.'.join(entry.table)}, which no stream reads any more, {entry.reason} and was "
        f"still in the product's publication {publication}: it was taken out at once (PostgreSQL rejects the "
        "application's UPDATE and DELETE on a published table without a replica identity)"
    )


def unpublish_for_source(url: str, source_name: str, source: PostgresSource) -> tuple[list[str], set[str]]:
    """What `ingest check`, `ingest cdc status` and the slot sensor do between runs to shorten the outage: every
    published table of the source's streams without a replica identity leaves the product's own publication
    (a user's publication is left as it is). Returns a message per such table, and the tables' names."""
    publication = source.cdc.publication or f"ingest_{source_name}"
    streams = {(s.schema_name, s.table_name): name for name, s in source.streams.items()}
    found = unpublish_unidentified(url, publication, list(streams), source.cdc.publication is None)
    published = [e for e in found if e.published]
    messages = [
        pause_message(source_name, streams[e.table], publication, e)
        if e.table in streams
        else unread_message(source_name, publication, e)
        for e in published
    ]
    return messages, {".".join(e.table) for e in published}
