"""Before a read: does the target hold what the checkpoint says it does? If not, the run starts over.

A checkpoint belongs to one target (DESIGN.md). Pointing a stream at a new destination or file, dropping
or emptying its table, or restoring the target from an older backup must never make a run load only the
tail after a checkpoint the target does not hold: such a run re-reads from the start (the merge keeps
it exact) and says why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ingestion_assets.loading.bindings import Marker
from ingestion_assets.loading.pipeline import Loader, TargetState

TARGET = "target"  # the checkpoint detail: {"binding", "seq", "where"}


@dataclass(frozen=True)
class Settled:
    position: dict[str, Any] | None  # where the read starts
    reason: str | None  # why it starts over although the checkpoint had a position (None: it continues)


def settle_target(
    loader: Loader, partition: str | None, details: dict[str, Any], position: dict[str, Any] | None, generation: int
) -> Settled:
    """Bind the loader to the target and decide where the read starts."""
    stored = details.get(TARGET)
    state = loader.inspect(partition)
    if not state.exists:
        loader.forget_stored_schema()  # dropped behind dlt's back (or never made): dlt must create it again
    if position is None:
        loader.bind(Marker(_new_binding(), 0, generation), partition, record_now=state.exists)
        return Settled(None, None)
    reason = _mismatch(loader, state, stored)
    if reason is None:
        assert isinstance(stored, dict)
        loader.bind(Marker(str(stored["binding"]), int(stored["seq"]), generation), partition)
        return Settled(position, None)
    if stored is None and state.has_rows:
        # A checkpoint from before target binding, and a target that holds the stream's rows: adopt it.
        loader.bind(Marker(_new_binding(), 0, generation), partition, record_now=True)
        return Settled(position, None)
    loader.bind(Marker(_new_binding(), 0, generation), partition, record_now=state.exists)
    return Settled(None, reason)


def binding_details(loader: Loader) -> dict[str, Any]:
    """The checkpoint's side of the binding, as of the loader's last committed load."""
    marker = loader.bound
    if marker is None:
        return {}
    recorded: dict[str, Any] = {"binding": marker.binding, "seq": marker.seq, "where": loader.where()}
    lineage = loader.lineage()
    if lineage is not None:
        recorded["lineage"] = lineage
    return {TARGET: recorded}


def _mismatch(loader: Loader, state: TargetState, stored: Any) -> str | None:
    where = loader.where()
    table = f"{loader.target.dataset}.{loader.stream_name}"
    if not isinstance(stored, dict) or "binding" not in stored:
        return f"the checkpoint predates target binding and {where} holds no rows in {table}"
    marker = state.marker
    if marker is None:
        return (
            f"{where} holds no record of this stream (the checkpoint was taken against {stored.get('where')}): "
            "a new destination or file, or its schema was dropped"
        )
    if marker.binding != str(stored["binding"]):
        return f"{where} holds another copy of this stream than the one the checkpoint describes"
    if marker.seq < int(stored["seq"]):
        return (
            f"{where} holds {marker.seq} of the {stored['seq']} slices the checkpoint counts: the target was "
            "restored from an older copy, or lost writes"
        )
    if not state.has_rows:
        return (
            f"{table} in {where} is missing or empty although the checkpoint counts {stored['seq']} committed "
            "slice(s): rows were lost there, unless those slices parked every row they read (a file parked whole)"
        )
    lineage = stored.get("lineage")
    went_back = loader.went_back(str(lineage)) if lineage else None
    if went_back is not None:  # one table taken back (a lake's time travel): its bindings table was not
        return f"{table} in {where} no longer holds what the checkpoint describes: {went_back}"
    return None


def _new_binding() -> str:
    return uuid.uuid4().hex
