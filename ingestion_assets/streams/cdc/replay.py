"""`ingest dlq replay` of a CDC stream: its parked changes' rows read again from the source table by key.

A row read now is at least as new as every change the stream applied (all committed before its checkpoint)
and may be newer than changes the log still holds for it. So it loads at the version between the two: just
above every change applied (it replaces the target's row) and below every change not yet applied (the log,
applied after it, takes its key on to the same end). The source's slot lock is held meanwhile: no run applies
a change between the read and the load (a delete applied there, then the row loaded, would bring back a row
the log will not delete again). Not the parked change's own values at its position: the source may have
deleted the row since, and a hard delete leaves no version in the target to compare with.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from ingestion_assets.loading.dead_letters import Split
from ingestion_assets.sources.postgres.cdc.errors import SlotInUseError
from ingestion_assets.sources.postgres.cdc.slot_lock import REPLAY, reading_slot
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.streams.cdc.copy import at_version, fitted_plan, table_plan
from ingestion_assets.streams.cdc.outcome import ColumnsUnlandable
from ingestion_assets.streams.cdc.rows import snapshot_version
from ingestion_assets.streams.cdc.state import SourceState, stream_checkpoint
from ingestion_assets.streams.postgres_table import PostgresTableStream, StreamError, Target
from ingestion_assets.streams.replay import Replay, read_again


def replay_cdc_dead_letters(
    stream: PostgresTableStream,
    slot: str,
    checkpoint: Callable[[], Checkpoint | None],
    say: Callable[[str], None] | None = None,
) -> Replay:
    """`checkpoint`: the stream's newest, read once the lock is held (a run may move it while we wait)."""
    url = stream.source_url()
    try:
        with reading_slot(url, slot, stream.source.cdc.lock_wait_seconds, REPLAY, say=say):
            lsn = applied_position(stream, checkpoint())
            plan = table_plan(url, stream)
            loader = stream.loader(Target(stream.name, 1), None, plan, guard=True)
            version = snapshot_version(lsn)

            def stamped(split: Split) -> pa.Table:
                return at_version(split.rows, version, split.meta)

            plan = fitted_plan(stream, plan, loader)
            return read_again(stream, plan, loader, stamped, REPLAY, release_superseded=True)
    except ColumnsUnlandable as exc:  # its own words speak of a copy
        raise StreamError(f"{exc.problem}; nothing was replayed (the stream's next run settles it)") from exc
    except SlotInUseError as exc:
        held = str(exc).split(";")[0]  # the rest speaks of a run that did not start
        raise StreamError(
            f"stream {stream.qualified_name}: a replay takes the source's replication slot lock while it reads and "
            f"loads (no run may apply a change between the two); {held}. Nothing was replayed: try again when the "
            "run is over"
        ) from exc


def applied_position(stream: PostgresTableStream, checkpoint: Checkpoint | None) -> int:
    """The log position up to which every change of the stream is in its target."""
    position = SourceState({stream.name: stream_checkpoint(checkpoint)}).positions[stream.name]
    if position is None:
        raise StreamError(
            f"stream {stream.qualified_name}: it holds no log position (it never ran, was reset, or its table's "
            "copy has not begun): its next run copies the table, parked rows included, so there is nothing to "
            "replay before it; run the stream, then `ingest dlq list` shows what still waits"
        )
    return position
