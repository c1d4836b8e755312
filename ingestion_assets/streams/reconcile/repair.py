"""The repair after a comparison: rows found missing from the target, or older there, are read again from the
source by primary key in the run that found them and merged like any slice; a gap it cannot close is owed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa

from ingestion_assets.loading.dead_letters import record_keys
from ingestion_assets.sources.postgres import table_slices
from ingestion_assets.sources.postgres.query import ReadPlan, exact_text
from ingestion_assets.sources.postgres.values import plain
from ingestion_assets.streams.postgres_table import PostgresTableStream, Target
from ingestion_assets.streams.reconcile.compare import Request, recheck
from ingestion_assets.streams.reconcile.diff import MISSING, NEWER, STALE
from ingestion_assets.streams.reconcile.figures import SAMPLE, Reconciliation
from ingestion_assets.streams.reconcile.relation import key_alias

# Above this many keys a gap is a table's worth (a partition detached, a restore, a cursor reset), not stray late
# rows: reading it back 1,000 keys per IN list costs more than one re-read of the table (`ingest refresh STREAM
# --retain`), and the key list would sit in memory beside the diff. Such a gap is owed instead of repaired.
REPAIR_CAP = 100_000
KEYS_PER_READ = 1000  # keys per read (one IN list): a repair holds at most this many rows at a time
OWED = "reconcile_owed"  # checkpoint detail: a gap found and not repaired ({"since", "why"}): compare in full


@dataclasses.dataclass(frozen=True)
class Repair:
    """What a repair loads with: the run's read plan (fitted to the target) and the generation its rows carry.
    `source_wins` (asked for by a person, `ingest reconcile --source-wins`): the rows newer in the target than in
    the source (its cursor went backwards: a restore, a hand edit) are read again too and loaded over the target's
    without the version guard."""

    stream: PostgresTableStream
    plan: ReadPlan
    generation: int
    partition: str | None = None
    run_id: str = ""
    source_wins: bool = False


def repair(request: Request, found: Reconciliation, how: Repair) -> Reconciliation:
    """Read the missing and older rows again by key, merge them under the version guard (a newer version another
    writer loaded meanwhile stays), then compare those keys again. A key gone from the source by now loads
    nothing: it is not missing any more, and a later comparison sees it as deleted at the source."""
    keys = _within_cap(found.found_keys)
    newer = _within_cap(found.newer_keys) if how.source_wins else None
    if keys is None and newer is None:
        return found
    if keys is not None:
        _load_keys(request, keys, how, guard=True)
    if newer is not None:  # after the repair: the source's version, whatever the target holds
        _load_keys(request, newer, how, guard=False)
    every = pa.concat_tables([t for t in (keys, newer) if t is not None])
    after = recheck(request, every)
    left = _left(after)
    samples = {kind: k for kind, k in found.samples.items() if kind not in (MISSING, STALE, NEWER)}
    samples.update({kind: k for kind, k in after.samples.items() if kind in (MISSING, STALE, NEWER)})
    if newer is None:
        samples.update({kind: k for kind, k in found.samples.items() if kind == NEWER})
    replaced = 0
    if newer is not None:  # compared again on their own: how many of them now hold the source's version
        replaced = newer.num_rows - _left(recheck(request, newer))
    texts = record_keys(every, [key_alias(i) for i in range(every.num_columns)]).to_pylist()
    samples["repaired"] = sorted(texts)[:SAMPLE]
    return dataclasses.replace(
        found,
        missing=after.missing,
        stale=after.stale,
        newer_in_target=after.newer_in_target + (found.newer_in_target if newer is None else 0),
        deleted_at_source=found.deleted_at_source + after.deleted_at_source,
        parked=found.parked + after.parked,
        repaired=every.num_rows - left,
        replaced_newer=replaced,
        samples=samples,
    )


def _left(after: Reconciliation) -> int:
    """Keys compared again after a repair that are still not in the target at the source's version."""
    return after.missing + after.stale + after.newer_in_target + after.parked + after.deleted_at_source


def _within_cap(keys: pa.Table | None) -> pa.Table | None:
    """`keys` if there are any to read again and no more than REPAIR_CAP (above it the gap is owed instead)."""
    return keys if keys is not None and 0 < keys.num_rows <= REPAIR_CAP else None


def _load_keys(request: Request, keys: pa.Table, how: Repair, guard: bool) -> None:
    """The source's current rows of `keys`, wherever their cursor or time window now is, merged into the target;
    `guard`: a newer version the target holds stays (without it the source's version replaces it)."""
    stream, plan = how.stream, how.plan
    target = Target(stream.name, how.generation)
    loader = stream.loader(target, how.partition, plan, guard=guard, source_wins=not guard)
    loader.run_id = how.run_id
    for chunk in _key_texts(keys):
        pieces = table_slices(request.url, plan, None, stream.spec.slice_rows, stream.qualified_name, keys=chunk)
        for piece in pieces:
            stream.load_piece(piece, loader, plan, how.generation, how.partition, how.run_id)


def owed_reason(figures: Reconciliation, stream: str) -> str | None:
    """What the comparison found and did not repair (None: nothing), said so a person can act on it."""
    if figures.error is not None:
        return f"the comparison did not finish ({figures.error})"
    said = []
    if figures.missing or figures.stale:
        over = figures.found_keys is not None and figures.found_keys.num_rows > REPAIR_CAP and not figures.repaired
        why = (
            f"more than the {REPAIR_CAP:,} a run reads again by key: `ingest refresh {stream} --retain` re-reads "
            "the table"
            if over
            else "not repaired"
        )
        said.append(f"{figures.missing} row(s) missing and {figures.stale} older in the target ({why})")
    if figures.newer_in_target:
        said.append(
            f"{figures.newer_in_target} row(s) newer in the target than in the source (the source's cursor went "
            f"backwards: a restore, a hand edit; the version guard keeps the target's: `ingest reconcile {stream} "
            "--source-wins` (with `--partition` for a partitioned stream) loads the source's version over them)"
        )
    return "; ".join(said) or None


def _key_texts(keys: pa.Table) -> Iterator[list[list[str]]]:
    """The keys as the read's IN list takes them: each value's exact text, KEYS_PER_READ at a time."""
    for start in range(0, keys.num_rows, KEYS_PER_READ):
        chunk = keys.slice(start, KEYS_PER_READ)
        columns = [chunk.column(i) for i in range(chunk.num_columns)]
        yield [[str(exact_text(plain(column[row]))) for column in columns] for row in range(chunk.num_rows)]
