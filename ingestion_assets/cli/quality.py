"""`ingest check`, `schema`, `dlq`, `reconcile`: fail fast, schema decisions, parked rows, source against target."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ingestion_assets.catalog import load_catalog
from ingestion_assets.cli.common import bring_up, checkpoint_partition, stream_key
from ingestion_assets.settings import Settings


def check(settings: Settings, _args: argparse.Namespace) -> int:
    from ingestion_assets.checks import check_catalog

    catalog = load_catalog(settings.catalog_path)
    notes: list[str] = []
    problems = check_catalog(settings, catalog, notes)
    for line in notes:
        print(f"NOTE {line}")
    for line in problems:
        print(f"FAIL {line}")
    if not problems:
        print(
            f"ok: {len(catalog.streams())} stream(s) in {settings.catalog_path} are readable; the destination answers"
        )
    return 1 if problems else 0


def schema_show(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.schema.changes import ColumnType, diff, parse_stored
    from ingestion_assets.schema.policy import decide
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.rest_api import RestApiStream

    stream, store = stream_and_store(settings, args.stream)
    latest = store.latest(checkpoint_partition(stream.source))
    stored = parse_stored(latest.details.get("schema") if latest else None)
    if isinstance(stream, RestApiStream | FileSourceStream):  # learnt as they load: nothing to discover first
        return _api_schema_show(stream, stored, latest)
    plan = stream.plan()
    discovered = {c.name: ColumnType(c.type_name, c.sql_type, c.base_type) for c in plan.shape.columns}
    print(f"{stream.qualified_name} (policy {stream.spec.schema_policy})")
    for name, column in (stored or discovered).items():
        print(f"  {name:<30}{column.sql_type}")
    if stored is None:
        print("no schema stored yet: the first run stores the one above")
        return 0
    changes = diff(stored, discovered, stream.key_columns)
    decision = decide(stream.spec.schema_policy, changes, accepted=False)
    for label, found in (("applies", decision.apply), ("pauses on", decision.pause), ("skips", decision.skip)):
        for change in found:
            print(f"next run {label}: {change.describe()}")
    if not changes:
        print("no change in the source since the last run")
    return 0


def _api_schema_show(stream: Any, stored: dict[str, Any] | None, latest: Any) -> int:
    """An API has nothing to discover up front: its fields are learnt from the records as slices load."""
    print(f"{stream.qualified_name} (policy {stream.spec.schema_policy}; fields learnt from the API's records)")
    for name, column in (stored or {}).items():
        print(f"  {name:<30}{column.sql_type}")
    if stored is None:
        print("no schema stored yet: the first run learns it from the records it reads")
    error = str(latest.details.get("last_error") or "") if latest else ""
    if "SchemaPaused" in error:
        print(f"paused: {error.removeprefix('SchemaPaused: ')}")
    else:
        print("changes are checked slice by slice as records arrive; none is pending")
    return 0


def schema_accept(settings: Settings, args: argparse.Namespace) -> int:
    stream, store = stream_and_store(settings, args.stream)
    partition = checkpoint_partition(stream.source, args.partition)
    latest = store.latest(partition)
    if latest is None:
        raise SystemExit(f"error: {stream.qualified_name} has never run: there is nothing to accept")
    store.commit(partition, latest.position, **{**latest.details, "schema_accepted": True})
    print(f"{stream.qualified_name}: the next run applies the schema changes that paused it")
    return 0


def dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    from ingestion_assets.cli.dlq import dead_letter_loader
    from ingestion_assets.loading.parked import parked_rows

    stream, _ = stream_and_store(settings, args.stream)
    rows = parked_rows(dead_letter_loader(stream))
    print(f"{len(rows)} parked row(s) of {stream.qualified_name}")
    for row in rows:
        when = row["dead_lettered_at"]
        print(f"  key {row['record_key']:<20} {when}  run {str(row['run_id'])[:8]}  {row['error']}")
    return 0


def dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    """Every way it can fail ends in one line naming the stream (exit 1), never a traceback."""
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.postgres_table import PostgresTableStream

    stream, store = stream_and_store(settings, args.stream)
    name = stream.qualified_name
    if not isinstance(stream, FileSourceStream | PostgresTableStream):
        raise SystemExit(
            f"error: {name}: `ingest dlq replay` reads parked rows again from a table or files source by their key "
            "or file; an API stream cannot fetch single records again: fix the cause, then run the stream again "
            f"(`ingest state reset {name}` re-reads it all); `ingest dlq list {name}` shows what is parked"
        )
    try:
        replay = _replay(stream, store)
    except replay_failures() as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise SystemExit(f"error: {name}: dlq replay failed: {text.removeprefix(f'stream {name}: ')}") from exc
    if replay.parked == 0:
        print(f"{name}: no parked rows: nothing to replay")
        return 0
    gone = (
        f" (they stay parked: {', '.join(replay.gone[:5])}{', ...' * (len(replay.gone) > 5)}; "
        f"`ingest dlq discard {name} --key KEY --yes` closes one)"
    ) * bool(replay.gone)
    print(
        f"{name}: {replay.parked} dead letter(s) read again: {replay.released} released, "
        f"{replay.still_bad} still bad (parked again with today's error), {len(replay.gone)} gone from the source"
        f"{gone}; {replay.loaded} row(s) loaded"
    )
    return 0 if replay.still_bad == 0 and not replay.gone else 1


def _replay(stream: Any, store: Any) -> Any:
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.files_replay import replay_file_dead_letters
    from ingestion_assets.streams.replay import replay_dead_letters

    if not isinstance(stream, FileSourceStream) and stream.source.mode == "cdc":
        return _replay_cdc(stream, store)
    latest = store.latest(None)
    generation = max(int(latest.details.get("generation", 1)) if latest else 1, 1)
    if isinstance(stream, FileSourceStream):
        return replay_file_dead_letters(stream, generation, dict(latest.details) if latest else {})
    return replay_dead_letters(stream, generation)


def _replay_cdc(stream: Any, store: Any) -> Any:
    """Under the source's slot lock, at the stream's log position (its checkpoint on `live` with history)."""
    from ingestion_assets.defs.sources import slot_name
    from ingestion_assets.partitions import LIVE
    from ingestion_assets.streams.cdc.replay import replay_cdc_dead_letters

    partition = LIVE if stream.source.cdc.history_chunk is not None else None
    slot = slot_name(stream.source_name, stream.source)
    return replay_cdc_dead_letters(stream, slot, lambda: store.latest(partition), lambda m: print(m, file=sys.stderr))


def replay_failures() -> tuple[type[BaseException], ...]:
    """What a replay meets that a user acts on: the source or its storage (missing, unreachable), a schema change
    the policy pauses on, a column whose name the target cannot tell apart from another's, a CDC source's slot
    (held by a run) or table, the destination (unreachable, locked, not able to compare versions)."""
    import duckdb
    import psycopg2
    from dlt.common.exceptions import DltException

    from ingestion_assets.loading.naming import NameCollision
    from ingestion_assets.sources.postgres.cdc.errors import CdcError as SlotError
    from ingestion_assets.streams.cdc.outcome import CdcError
    from ingestion_assets.streams.postgres_table import StreamError
    from ingestion_assets.streams.schema_step import SchemaPaused

    return (
        OSError,
        SchemaPaused,
        StreamError,
        CdcError,
        SlotError,
        NameCollision,
        NotImplementedError,
        DltException,
        duckdb.Error,
        psycopg2.Error,
    )


def reconcile(settings: Settings, args: argparse.Namespace) -> int:
    """A full comparison now, with the stream's last checkpoint; the missing and older rows it finds are read again
    by key (as a run's comparison does; not with --no-repair); deletions only with --apply-deletes."""
    from ingestion_assets.defs.target_shrank import REMOVED_BY_INGEST
    from ingestion_assets.partitions import window_for
    from ingestion_assets.streams.postgres_table import PostgresTableStream
    from ingestion_assets.streams.reconcile import Request, Scope, owed_reason
    from ingestion_assets.streams.reconcile.cadence import compared, repairs

    stream, store = stream_and_store(settings, args.stream)
    if not isinstance(stream, PostgresTableStream) or stream.source.mode == "cdc":
        raise SystemExit(f"error: {args.stream} is not a polled table stream: {_no_reconcile(stream)}")
    if stream.spec.partitions is not None and args.partition is None:
        raise SystemExit(f"error: {args.stream} is partitioned: name the partition to compare with --partition")
    latest = store.latest(args.partition)
    if args.source_wins and args.no_repair:
        raise SystemExit("error: --source-wins loads rows: it cannot go with --no-repair")
    loader, plan, how, no_repair = _repair_setup(stream, latest, args.partition, not args.no_repair)
    if how is not None and args.source_wins:
        how = dataclasses.replace(how, source_wins=True)
    mode = stream.spec.reconcile.deletes if stream.spec.reconcile.applies_deletes else "hard"
    scope = Scope("full", window_for(stream.spec, args.partition))
    position = latest.position if latest is not None else None
    deletes = mode if args.apply_deletes else "report"
    request = Request(stream.source_url(), plan, loader, scope, position, deletes, every_key=args.every_key)
    found = compared(request, how if repairs(stream) else None)
    if found.deletions_applied and found.deletes == "hard":  # our own deletions: `ingest status` counts them out
        store.observe({REMOVED_BY_INGEST: found.deletions_applied})
    if found.error is not None:
        raise SystemExit(f"error: {stream.qualified_name}: {found.error}")
    _record_check(store, found, args.partition)
    print(
        f"{stream.qualified_name}{'' if args.partition is None else ' partition ' + args.partition} (full, deletes: "
        f"{found.deletes}): {found.source_rows} source rows, {found.target_rows} target rows; "
        f"{found.buckets_differing} of {found.buckets} buckets differ, {found.keys_diffed} rows diffed key by key"
    )
    print(
        f"  {found.missing} missing, {found.stale} older, {found.newer_in_target} newer in the target, "
        f"{found.deleted_at_source} in the target only (deleted at the source), {found.deletions_applied} deleted, "
        f"{found.not_yet_synced} not yet synced, {found.parked} parked, {found.repaired} read again by key (repaired)"
    )
    if found.replaced_newer:
        print(
            f"  of the rows read again, {found.replaced_newer} row(s) newer in the target than in the source were "
            "replaced by the source's version (--source-wins)"
        )
    if found.null_keys or found.null_keys_in_target:
        print(
            f"  {found.null_keys} source row(s) with a NULL key not compared (a key column is NULL: the load parks "
            f"them as dead letters, see `ingest dlq list {stream.qualified_name}`)"
            + (f"; {found.null_keys_in_target} such row(s) in the target" if found.null_keys_in_target else "")
        )
    if found.repeated_at_source:
        repeated = found.repeated_at_source
        print(f"  {repeated} older row(s) of keys the source holds more than once (the target keeps the newest)")
    for kind, keys in found.samples.items():
        print(f"  {kind}: {', '.join(keys)}")
    if no_repair is not None and (found.missing or found.stale or (args.source_wins and found.newer_in_target)):
        print(f"  not repaired: {no_repair}")
    left = owed_reason(found, stream.qualified_name)
    if left is not None:
        print(f"  left: {left}")
    return 0 if found.passed and found.deletes_pending == 0 else 1


def _record_check(store: Any, found: Any, partition: str | None) -> None:
    """The comparison as the stream's reconciliation check, as a run's would be: the status and the UI showed the
    last run's failed check (rows gone, missing) after this comparison had repaired or applied them."""
    import dagster as dg

    from ingestion_assets.defs.checks import compared_result

    result = compared_result([found], [partition] if found.newer_in_target else [])
    by = "ingest reconcile" + ("" if partition is None else f" --partition {partition}")
    metadata = {**result.metadata, "by": dg.MetadataValue.text(by)}
    store.report_check(result.check_name, result.passed, result.severity, metadata)


def _repair_setup(stream: Any, latest: Any, partition: str | None, wanted: bool) -> tuple[Any, Any, Any, str | None]:
    """The loader and read plan of the stream's last run (its generation, its settled schema fitted to the target),
    the repair they allow, and why there is none: a schema change the last run has not applied would load rows
    the target is not ready for (the next run applies it, then repairs)."""
    from ingestion_assets.streams.postgres_table import Target
    from ingestion_assets.streams.reconcile import Repair
    from ingestion_assets.streams.schema_step import SchemaPaused, settle_schema
    from ingestion_assets.streams.target_types import fit_plan

    details = dict(latest.details) if latest is not None else {}
    generation = max(int(details.get("generation", 1)), 1)
    why: str | None = None if wanted else "--no-repair"
    try:
        step = settle_schema(stream, details)
        plan = step.plan if step.plan is not None else stream.plan()
        if step.applied and why is None:
            why = f"the source's columns changed since the last run ({step.describe()[0]}, ...): run the stream first"
    except SchemaPaused as exc:
        plan, why = stream.plan(), f"{exc}"
    loader = stream.loader(Target(stream.name, generation), partition, plan)
    plan = fit_plan(plan, loader)
    how = Repair(stream, plan, generation, partition, "ingest-reconcile") if why is None else None
    return loader, plan, how, why


def _no_reconcile(stream: Any) -> str:
    """What a stream that `ingest reconcile` does not compare does about deletions instead."""
    from ingestion_assets.streams.files import FileSourceStream
    from ingestion_assets.streams.rest_api import RestApiStream

    if isinstance(stream, FileSourceStream):
        return (
            "a files stream compares its listing with the files it loaded on every run: set the stream's "
            f"`deletes: keep|hard|soft` (now {stream.spec.deletes}) for the rows of files gone from the source"
        )
    if isinstance(stream, RestApiStream):
        return "an API stream learns of deletions from the API itself (its `deletes` setting), not by comparing"
    return "cdc streams get deletes from the log"


def stream_and_store(settings: Settings, name: str) -> tuple[Any, Any]:
    import dagster as dg

    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.state.checkpoints import InstanceStateStore

    catalog = load_catalog(settings.catalog_path)
    source, stream_name = stream_key(catalog, name)
    bring_up(settings)
    stream = next(s for s in catalog_streams(settings, catalog) if (s.source_name, s.name) == (source, stream_name))
    instance = dg.DagsterInstance.from_config(str(settings.dagster_home))
    return stream, InstanceStateStore(instance, dg.AssetKey([source, stream_name]))
