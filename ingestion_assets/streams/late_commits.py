"""The late-commit guard of a polled table stream: which position a run may checkpoint up to.

Each run takes a probe (the table's newest position, by the server's clock), waits briefly for the
transactions open at that moment to end, and then reads. The newest probe taken before every transaction
still open began is settled (see sources/postgres/horizon.py); slices checkpoint no further than it, and
the next run re-reads what lies beyond (the merge absorbs the overlap). Probes ride in the checkpoint, so
a transaction open across many runs holds the checkpoint at the last probe before it began.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ingestion_assets.catalog import PostgresStream
from ingestion_assets.sources.postgres.horizon import Horizon, OpenTransaction, Probe, take_probe, wait_for_settling
from ingestion_assets.sources.postgres.query import Position, ReadPlan, Settled
from ingestion_assets.sources.postgres.reader import connect

PROBES = "probes"  # checkpoint detail: [{"at": ISO time, "position": {...} | None}, ...], oldest first
KEEP = 32  # probes kept: the newest settled one and those after it, at most this many
# Checkpoint detail: the transactions taken for readers (open long, nothing written), [{"pid", "started"}]. One may
# still write, with a cursor as old as its start, behind a checkpoint that went on without it: once it has ended,
# the run compares the whole table (and reads again by key what that finds missing or older)
READERS = "readers_passed"


@dataclass(frozen=True)
class Guard:
    settled: Settled
    probes: list[dict[str, Any]]  # what the checkpoint keeps for the next run
    note: str | None  # what held the checkpoint back or could not be seen (log and metadata)
    readers: list[dict[str, Any]] = field(default_factory=list)  # taken for readers and not known to have ended
    compare_whole: str | None = None  # why the run compares the whole table: such a transaction ended since


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
    readers, ended = _readers(stored.get(READERS), horizon)
    return Guard(
        settled=Settled(best.position if best is not None else None, floor),
        probes=[_stored(p) for p in ([kept[0], *kept[1:][-(KEEP - 1) :]] if kept else [])],
        note=_note(horizon, probe, name),
        readers=readers,
        compare_whole=(
            f"{name}: transaction(s) taken for readers have ended ({', '.join(ended[:3])}): a row one of them wrote "
            "carries a cursor as old as its start, behind the checkpoint: the whole table is compared"
            if ended
            else None
        ),
    )


def _readers(stored: Any, horizon: Horizon) -> tuple[list[dict[str, Any]], list[str]]:
    """Those taken for readers now or before, still open (reading, or written since: then they hold the checkpoint
    as writers do, and are kept here until they end), and a description of each stored one that has ended."""

    def ident(t: OpenTransaction) -> dict[str, Any]:
        return {"pid": t.pid, "started": t.started.isoformat() if t.started is not None else None}

    open_now = [ident(t) for t in (*horizon.ignored, *horizon.blockers)]
    before = [r for r in stored if isinstance(r, dict)] if isinstance(stored, list) else []
    still = [r for r in before if r in open_now]
    ended = [f"pid {r.get('pid')} open since {r.get('started')}" for r in before if r not in open_now]
    passed = still + [ident(t) for t in horizon.ignored if ident(t) not in still]
    return passed, ended


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
