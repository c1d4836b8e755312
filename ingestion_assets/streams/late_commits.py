"""The late-commit guard of a polled table stream: which position a run may checkpoint up to.

Each run takes a probe (the table's newest position, by the server's clock), waits briefly for the
transactions open at that moment to end, and then reads. The newest probe taken before every transaction
still open began is settled (see sources/postgres/horizon.py); slices checkpoint no further than it, and
the next run re-reads what lies beyond (the merge absorbs the overlap). Probes ride in the checkpoint, so
a transaction open across many runs holds the checkpoint at the last probe before it began.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ingestion_assets.catalog import PostgresStream
from ingestion_assets.sources.postgres.horizon import Horizon, Probe, take_probe, wait_for_settling
from ingestion_assets.sources.postgres.query import Position, ReadPlan, Settled
from ingestion_assets.sources.postgres.reader import connect

PROBES = "probes"  # checkpoint detail: [{"at": ISO time, "position": {...} | None}, ...], oldest first
KEEP = 32  # probes kept: the newest settled one and those after it, at most this many


@dataclass(frozen=True)
class Guard:
    settled: Settled
    probes: list[dict[str, Any]]  # what the checkpoint keeps for the next run
    note: str | None  # what held the checkpoint back or could not be seen (log and metadata)


def guard_read(
    url: str, plan: ReadPlan, spec: PostgresStream, stored: dict[str, Any], floor: Position | None, name: str
) -> Guard:
    """`floor`: the stored checkpoint, where the run's checkpoints stay if nothing newer is settled."""
    conn = connect(url, "ingest-guard")
    try:
        probe = take_probe(conn, plan)
        horizon = wait_for_settling(conn, probe, spec.late_commits.wait_seconds, spec.late_commits.max_reader_seconds)
    finally:
        conn.close()
    probes = [*_stored_probes(stored, plan), probe]
    settled = [p for p in probes if horizon.settles(p)]
    best = settled[-1] if settled else None
    kept = probes[probes.index(best) :] if best is not None else probes
    return Guard(
        settled=Settled(best.position if best is not None else None, floor),
        probes=[_stored(p) for p in ([kept[0], *kept[1:][-(KEEP - 1) :]] if kept else [])],
        note=_note(horizon, probe, name),
    )


def settled_now(url: str, plan: ReadPlan, spec: PostgresStream) -> tuple[Position | None, list[dict[str, Any]]]:
    """Where a live tail may start now: the table's newest position once no transaction open at this moment
    can still commit behind it (None: start from the beginning, one was still open), and the probe taken."""
    guard = guard_read(url, plan, spec, {}, None, f"{plan.shape.schema}.{plan.shape.table}")
    return guard.settled.position, guard.probes


def _note(horizon: Horizon, probe: Probe, name: str) -> str | None:
    parts = []
    if not horizon.settles(probe):
        held = ", ".join(b.describe(horizon.now) for b in horizon.blockers[:3])
        parts.append(
            f"{name}: the checkpoint stays behind transactions open since before this run ({held}); rows past it "
            "are loaded now and read again next run"
        )
    if horizon.ignored:
        taken = ", ".join(b.describe(horizon.now) for b in horizon.ignored[:3])
        parts.append(f"taken for readers (no write for over `late_commits.max_reader_seconds`): {taken}")
    if horizon.hidden_sessions:
        parts.append(
            f"{horizon.hidden_sessions} session(s) of other users are hidden from the connecting role, so their "
            "open transactions cannot hold the checkpoint back: grant it pg_read_all_stats (or pg_monitor)"
        )
    return "; ".join(parts) or None


def _stored_probes(stored: dict[str, Any], plan: ReadPlan) -> list[Probe]:
    names = {c.name for c in plan.ordering}
    probes = []
    for entry in stored.get(PROBES) or []:
        position = entry.get("position")
        if position is not None and set(position) != names:
            continue  # taken under other ordering columns (the catalog changed): of no use now
        probes.append(Probe(dt.datetime.fromisoformat(entry["at"]), position))
    return probes


def _stored(probe: Probe) -> dict[str, Any]:
    return {"at": probe.at.isoformat(), "position": probe.position}
