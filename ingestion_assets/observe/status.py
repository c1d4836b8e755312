"""Per stream: is it healthy, what does its table hold, when did it last sync and how far; for CDC sources
how far the slot lags. What `ingest status` prints; Dagster's instance and the source are asked, nothing
is changed."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

import dagster as dg
import psycopg2
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from ingestion_assets.catalog import Catalog, PostgresSource
from ingestion_assets.defs.cdc import SLOT_HEALTH
from ingestion_assets.defs.checks import DEAD_LETTERS, RECONCILIATION, SCHEMA, WHAT_TO_DO
from ingestion_assets.defs.freshness import FRESHNESS, stored_evaluation
from ingestion_assets.defs.run_tags import REFUSED
from ingestion_assets.defs.target_shrank import rows_expected
from ingestion_assets.observe.failed_steps import step_error
from ingestion_assets.observe.freshness import HISTOGRAM, merged, percentiles
from ingestion_assets.observe.partition_status import PartitionSummary, named, partition_summary, stream_partitions
from ingestion_assets.observe.target_counts import TargetCounts, count_target_rows
from ingestion_assets.partitions import LIVE
from ingestion_assets.references import postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import latest_checkpoint, live_checkpoint
from ingestion_assets.state.model import Checkpoint
from ingestion_assets.state.summary import partitions_with_state
from ingestion_assets.streams.outside_windows import OUTSIDE, never_read, outside_text
from ingestion_assets.streams.reconcile.repair import OWED

OK, FAILED, NEVER, LAGGING, RUNNING, CHECK = "ok", "failed", "never synced", "lagging", "running", "check failed"
STALE = "stale"  # older than the stream's `freshness.max_lag`
TARGET_SHORT = "target short"  # the table holds fewer rows than the last run left in it, or is gone
PAUSED = "paused"  # a CDC stream its source's last run left out (a key it cannot stream by, its key lost)
NOT_LOADED = "not loaded"  # no run has put a row in its target yet, though it has a position (planned, unselected)
PARTLY_LOADED = "partly loaded"  # partitions never run hold rows no other run reads (no error: not yet loaded)
NO_WINDOW = "rows unread"  # time windows: the source holds rows no window reads (before the first, NULL)
ATTENTION: tuple[str, ...] = (FAILED, NEVER, LAGGING, CHECK, STALE, TARGET_SHORT, PAUSED)
ATTENTION = (*ATTENTION, NO_WINDOW)
CHECK_NAMES = (SCHEMA, DEAD_LETTERS, RECONCILIATION, SLOT_HEALTH, FRESHNESS)
FRESHNESS_RUNS = 20  # materializations whose freshness histograms `ingest status` merges


@dataclass(frozen=True)
class PartitionLine:
    partition: str
    complete: bool  # its last checkpoint ended a read (False: a run stopped inside it, or is reading it)
    age_seconds: float
    position: dict[str, Any] | None


@dataclass(frozen=True)
class StreamStatus:
    stream: str
    status: str
    # live rows counted in the target now, soft-deleted ones left out (None: no table, or not counted: `target_problem`)
    rows_in_target: int | None
    last_run: str | None  # when the newest materialization was written (ISO, UTC)
    age_seconds: float | None
    position: dict[str, Any] | None
    lag: str  # CDC: the slot's lag and retained WAL; otherwise the checkpoint's age
    freshness: dict[str, float]  # commit-to-target p50/p95/p99 in ms over the last runs that measured it
    dead_letters: int | None  # rows parked now (counted in the target; lakes: what the last run parked)
    failed_checks: list[str]  # checks whose latest evaluation failed
    partitions: list[PartitionLine]  # partitioned streams: every partition that has a checkpoint
    detail: str = ""  # why it needs attention
    partition_summary: PartitionSummary | None = None  # partitioned streams: materialized, failed, running, never run
    # what the last run's metadata says the table held after it, less what ingest removed since (reconcile's deletes)
    rows_after_last_run: int | None = None
    target_problem: str | None = None  # why the target's rows were not counted (unreachable, busy)
    # no materialization yet, but a run was: its outcome and when it started (a first run killed or failed)
    last_attempt: str | None = None  # e.g. "failed"
    attempt_age_seconds: float | None = None
    # its newest run refused to start and did nothing (another live run holds the source, a partition range it
    # cannot take): "run <id> refused: <why>"; the status is that of the run before it
    refused_run: str | None = None
    # a refresh under way or stopped: its generation and how far it read (`position` stays the live table's)
    refresh: str | None = None
    soft_deleted_in_target: int = 0  # rows kept with `_ingest_deleted_at` set (deletes: soft), not in rows_in_target
    # time windows: what the newest count of the source's rows in no window found (streams/outside_windows.py)
    outside_windows: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SlotFigures:
    lag_bytes: int
    retained_wal_bytes: int
    limit_bytes: int
    error: str | None = None

    @property
    def lagging(self) -> bool:
        return self.error is None and self.retained_wal_bytes > self.limit_bytes


def stream_statuses(settings: Settings, catalog: Catalog, instance: dg.DagsterInstance) -> list[StreamStatus]:
    now = dt.datetime.now(dt.UTC)
    slots = {
        name: _slot(settings, name, s)
        for name, s in catalog.sources.items()
        if isinstance(s, PostgresSource) and s.mode == "cdc"
    }
    tables = [(source_name, stream_name) for source_name, _, stream_name, _ in catalog.streams()]
    counts = count_target_rows(settings, catalog.destination, tables)
    found = []
    for source_name, source, stream_name, spec in catalog.streams():
        key = dg.AssetKey([source_name, stream_name])
        planned = stream_partitions(source_name, source, stream_name, spec)
        partitioned = getattr(spec, "partitions", None) is not None or planned is not None
        status = _status(instance, key, f"{source_name}.{stream_name}", now, slots.get(source_name), partitioned)
        status = _with_target_rows(status, counts, (source_name, stream_name))
        status = _not_loaded(status, planned is not None)
        if partitioned:
            checkpoints = _partition_checkpoints(instance, key)
            if getattr(spec, "partitions", None) is not None:
                status = replace(status, partitions=_partition_lines(checkpoints, now))
            status = _with_owed_partitions(status, checkpoints)
            status = _with_rows_outside_windows(status, checkpoints)
        if planned is not None:
            status = _with_partitions(status, partition_summary(instance, key, planned))
            status = _with_unrun_partitions(status, planned, getattr(spec, "partitions", None) is not None)
        if spec.freshness is not None and status.status in (OK, CHECK):
            fresh = stored_evaluation(instance, key, spec.freshness)
            if not fresh.passed and fresh.severity == dg.AssetCheckSeverity.ERROR:
                status = replace(status, status=STALE, detail=f"{fresh.metadata['reason'].value}, over its max_lag")
        found.append(status)
    return found


def _with_target_rows(status: StreamStatus, counts: TargetCounts, table: tuple[str, str]) -> StreamStatus:
    """The table's rows now; fewer than the last run left (or no table) is a problem: rows were removed outside
    us, or the catalog points at another destination, and an operator must not be told they are there."""
    if not counts.counted(table):
        return replace(status, target_problem=counts.problem or "not counted")
    rows, after_run = counts.rows[table], status.rows_after_last_run  # every row: as the run's count
    status = replace(
        status,
        rows_in_target=counts.live(table),
        soft_deleted_in_target=counts.soft_deleted.get(table, 0),
        dead_letters=counts.parked.get(table, status.dead_letters),
    )
    if after_run is None or status.status == RUNNING or (rows is not None and rows >= after_run):
        return status
    dataset, name = table
    held = f"holds {rows:,} rows" if rows is not None else "does not exist"
    short = (
        f"the target table {dataset}.{name} {held}, but the last run left {after_run:,} in it (rows removed "
        f"outside ingest, or the destination changed): `ingest refresh {dataset}.{name}` re-reads the stream"
    )
    state = TARGET_SHORT if status.status in (OK, CHECK, STALE) else status.status
    return replace(status, status=state, detail="; ".join(d for d in (status.detail, short) if d))


def _not_loaded(status: StreamStatus, partitioned: bool) -> StreamStatus:
    """A stream no run has materialized whose target holds nothing: `ok` said it was loaded (found by a README-only
    attack: key ranges planned and none run, a CDC stream its source's runs left unselected before any row came,
    history ranges never run). Not an error: nothing is lost, nothing has been loaded yet."""
    if status.status != OK or status.last_run is not None or status.target_problem is not None:
        return status
    if (status.rows_in_target or 0) + status.soft_deleted_in_target > 0 or (status.rows_after_last_run or 0) > 0:
        return status
    how = (
        "its partitions are planned and none has run: materialize them (`dagster asset materialize --partition ...`, "
        "a backfill in the UI)"
        if partitioned
        else "it has a position (its source's runs checkpointed it) but no run has written a row to its target yet"
    )
    return replace(status, status=NOT_LOADED, detail=f"nothing loaded yet: {how}")


def _with_partitions(status: StreamStatus, summary: PartitionSummary) -> StreamStatus:
    """A failed partition needs attention even when a later run of another partition succeeded."""
    if not summary.failed:
        return replace(status, partition_summary=summary)
    detail = "; ".join(d for d in (status.detail, summary.failed_text()) if d)
    return replace(status, status=FAILED, detail=detail, partition_summary=summary)


def _with_unrun_partitions(status: StreamStatus, planned: dg.PartitionsDefinition, own: bool) -> StreamStatus:
    """Partitions of a table or files stream that never ran, other than what the schedule runs (`live`, the newest
    time window): rows only they hold (a key range's rows whose cursor is older than `live`'s position, an old
    window's) are in no target, and `ok` said it was all loaded (found by a README-only attack). Like `not loaded`
    no error (nothing is lost, it is not loaded yet), but not plain ok either."""
    summary = status.partition_summary
    if not own or summary is None or status.status != OK:
        return status
    newest = planned.get_last_partition_key() if isinstance(planned, dg.TimeWindowPartitionsDefinition) else None
    unrun = [p for p in summary.never_run if p not in (LIVE, newest)]
    if not unrun:
        return status
    first, last = unrun[0], unrun[-1]
    how = f"--partition {first}`" if first == last else f"--partition {first}`, and so on"
    if newest is not None and first != last:  # time windows follow one another (key ranges may straddle `live`)
        how = f"--partition-range {first}...{last}`"
    detail = (
        f"{len(unrun)} partition(s) never run ({named(unrun)}): rows only they hold are not in the target (a key "
        "range planned later holds the rows whose cursor is older than `live`'s position, which `live` skips): "
        f"run them (`dagster asset materialize ... {how}, a backfill in the UI)"
    )
    return replace(status, status=PARTLY_LOADED, detail=detail)


def _status(
    instance: dg.DagsterInstance,
    key: dg.AssetKey,
    name: str,
    now: dt.datetime,
    slot: SlotFigures | None,
    partitioned: bool = False,
) -> StreamStatus:
    """The stream's status from its last run, checks and newest checkpoint (a partitioned stream's owed gaps are
    read per partition: `_with_owed_partitions`)."""
    record = next(iter(instance.get_asset_records([key])), None)
    entry = record.asset_entry if record is not None else None
    event = entry.last_materialization if entry is not None else None
    materialization = event.asset_materialization if event is not None else None
    metadata = {k: v.value for k, v in (materialization.metadata if materialization else {}).items()}
    last = dt.datetime.fromtimestamp(event.timestamp, tz=dt.UTC) if event is not None else None
    checkpoint = latest_checkpoint(instance, key)
    run, refused = _last_run(instance, key, entry)
    status, detail = _health(instance, key, entry, run, last, slot)
    if status == NEVER and checkpoint is not None:  # a CDC source's run that selected its other streams
        paused = checkpoint.details.get("paused")
        status, detail = (PAUSED, str(paused)) if isinstance(paused, str) else (OK, _UNSELECTED)
    failed, advice = _failed_checks(instance, key)
    if status == OK and failed:
        status, detail = CHECK, "; ".join([f"latest evaluation failed: {', '.join(failed)}", *advice])
    owed = checkpoint.details.get(OWED) if checkpoint is not None and not partitioned else None
    if status in (OK, CHECK) and isinstance(owed, dict):  # a gap a comparison found and could not repair
        status, detail = (
            CHECK,
            (
                f"reconciliation owed since {owed.get('since')}: {owed.get('why')}; every run compares the whole table "
                "until a full comparison finds it closed"
            ),
        )
    if status == OK and isinstance(metadata.get("paused"), str):  # the run went on without it: say why
        status, detail = PAUSED, str(metadata["paused"])
    if status == FAILED and SCHEMA in failed:  # the run stopped on this stream's schema change: say what to do
        accept = f"`ingest schema show {name}`, then `ingest schema accept {name}`"
        detail = f"{detail}: paused by a schema change ({accept})"
    dead = metadata.get("dead letters")
    attempt, attempt_age = _unmaterialized_attempt(instance, run, now) if last is None else (None, None)
    position, refresh = _live_position(instance, key, checkpoint, status == RUNNING, partitioned)
    return StreamStatus(
        stream=name,
        status=status,
        rows_in_target=None,
        last_run=last.isoformat(timespec="seconds") if last else None,
        age_seconds=round((now - last).total_seconds(), 1) if last else None,
        position=position,
        lag=_lag(slot, checkpoint.data_committed_at if checkpoint else None, now),
        freshness=_freshness(instance, key),
        dead_letters=int(dead) if isinstance(dead, int) else None,
        failed_checks=failed,
        partitions=[],
        detail=detail,
        rows_after_last_run=rows_expected(instance, key),
        last_attempt=attempt,
        attempt_age_seconds=attempt_age,
        refused_run=f"run {refused.run_id[:8]} refused: {refused.tags[REFUSED]}" if refused is not None else None,
        refresh=refresh,
    )


def _live_position(
    instance: dg.DagsterInstance, key: dg.AssetKey, checkpoint: Checkpoint | None, running: bool, partitioned: bool
) -> tuple[dict[str, Any] | None, str | None]:
    """The live table's position, and what a refresh under way (or stopped) has read: its checkpoints describe its
    new generation (a shadow table until the swap), not the table readers query (found by a README-only attack)."""
    refresh = checkpoint.details.get("refresh") if checkpoint is not None and not partitioned else None
    if checkpoint is None or not isinstance(refresh, dict):
        return (checkpoint.position if checkpoint else None), None
    live = live_checkpoint(instance, key)
    how = "under way" if running else "stopped (the next run goes on with it)"
    read = json.dumps(checkpoint.position, default=str) if checkpoint.position else "(start)"
    said = f"refresh to generation {refresh.get('generation')} ({refresh.get('mode')}) {how}, read up to {read}"
    return (live.position if live else None), said


def _last_run(
    instance: dg.DagsterInstance, key: dg.AssetKey, entry: Any, looked: int = 50
) -> tuple[dg.DagsterRun | None, dg.DagsterRun | None]:
    """The stream's newest run that did not refuse to start, and the newest refused one when that is newer. A
    refused run read and stored nothing: its failure says nothing of the stream (found by a README-only attack:
    a second live CDC run, refused at once, left the stream `failed` while the first went on)."""
    run = instance.get_run_by_id(entry.last_run_id) if entry is not None and entry.last_run_id else None
    if run is None or REFUSED not in run.tags:
        return run, None
    seen = {run.run_id}
    for record in instance.fetch_planned_materializations(key, limit=looked).records:  # newest first
        if record.run_id in seen:
            continue
        seen.add(record.run_id)
        earlier = instance.get_run_by_id(record.run_id)
        if earlier is not None and REFUSED not in earlier.tags:
            return earlier, run
    return None, run


_UNSELECTED = (
    "checkpointed by its source's runs, not materialized in Dagster yet (the runs selected other streams of the "
    "CDC source; each applies every stream's changes)"
)


def _unmaterialized_attempt(
    instance: dg.DagsterInstance, run: dg.DagsterRun | None, now: dt.datetime
) -> tuple[str | None, float | None]:
    """The newest run of a stream that has no materialization (a first run that was killed or failed): its
    outcome and how long ago it started; `ingest status` showed such a stream's last run as `never`."""
    record = instance.get_run_record_by_id(run.run_id) if run is not None else None
    if record is None:
        return None, None
    started = record.start_time or record.create_timestamp.timestamp()
    outcome = _OUTCOMES.get(record.dagster_run.status, record.dagster_run.status.value.lower())
    return outcome, round(now.timestamp() - started, 1)


_OUTCOMES = {
    dg.DagsterRunStatus.FAILURE: "failed",
    dg.DagsterRunStatus.CANCELED: "stopped",
    dg.DagsterRunStatus.STARTED: "running",
    dg.DagsterRunStatus.STARTING: "running",
}


def _health(
    instance: dg.DagsterInstance,
    key: dg.AssetKey,
    entry: Any,
    run: dg.DagsterRun | None,
    last: dt.datetime | None,
    slot: SlotFigures | None,
) -> tuple[str, str]:
    if run is not None and run.status == dg.DagsterRunStatus.FAILURE and not _materialized_in(entry, run.run_id):
        return FAILED, f"run {run.run_id[:8]} failed{_why_failed(instance, run.run_id, key)}"
    if slot is not None and slot.lagging:
        return LAGGING, (
            f"the slot retains {slot.retained_wal_bytes:,} bytes of WAL, over its limit of {slot.limit_bytes:,}: "
            "run the source (or start its slot sensor)"
        )
    if run is not None and run.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING):
        return RUNNING, f"run {run.run_id[:8]} is running"
    if last is None:
        return NEVER, "no materialization yet"
    return OK, ""


def _why_failed(instance: dg.DagsterInstance, run_id: str, key: dg.AssetKey) -> str:
    """`: <the first line of the stream's failed step's error>`, else `: <the run's failure message>` (a killed
    run's: its processes are gone), or nothing when it has none. The run's own message only lists the failed steps
    (`Steps failed: [...]`): the reason is the step's."""
    message = step_error(instance, run_id, key)
    if message is None:
        failures = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        message = failures[-1].dagster_event.message if failures and failures[-1].dagster_event else None
    return f": {message}" if message else ""


def _materialized_in(entry: Any, run_id: str) -> bool:
    """The stream's own step succeeded in a run another stream's step failed: the run failed, the stream did not."""
    event = entry.last_materialization
    return event is not None and event.run_id == run_id


def _partition_checkpoints(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, Checkpoint]:
    """Each partition's latest checkpoint (a partition without one left out)."""
    found = {}
    for partition in partitions_with_state(instance, key):
        checkpoint = latest_checkpoint(instance, key, partition) if partition is not None else None
        if partition is not None and checkpoint is not None:
            found[partition] = checkpoint
    return found


def _partition_lines(checkpoints: dict[str, Checkpoint], now: dt.datetime) -> list[PartitionLine]:
    return [
        PartitionLine(
            partition,
            bool(checkpoint.details.get("complete", False)),
            round((now - checkpoint.data_committed_at).total_seconds(), 1),
            checkpoint.position,
        )
        for partition, checkpoint in checkpoints.items()
    ]


def _with_owed_partitions(status: StreamStatus, checkpoints: dict[str, Checkpoint]) -> StreamStatus:
    """A partition whose comparison left a gap owed keeps the stream `check failed` whichever partition ran last
    (the stream's latest check may be another partition's, passed; found by a README-only attack)."""
    owed = {p: c.details[OWED] for p, c in checkpoints.items() if isinstance(c.details.get(OWED), dict)}
    if not owed or status.status not in (OK, CHECK):
        return status
    said = "; ".join(f"partition {p}: since {o.get('since')}: {o.get('why')}" for p, o in sorted(owed.items())[:3])
    more = f" (and {len(owed) - 3} more)" if len(owed) > 3 else ""
    first = sorted(owed)[0]
    detail = (
        f"reconciliation owed by {len(owed)} partition(s): {said}{more}; each compares its window in full, and "
        f"repairs, when it runs again (`dagster asset materialize ... --partition {first}`)"
    )
    return replace(status, status=CHECK, detail=detail)


def _with_rows_outside_windows(status: StreamStatus, checkpoints: dict[str, Checkpoint]) -> StreamStatus:
    """The newest count of rows no time window reads: rows before the first window or NULL never load (attention
    until they are gone); future-dated ones load when their window comes (said, not an error)."""
    counts = [c.details[OUTSIDE] for c in checkpoints.values() if isinstance(c.details.get(OUTSIDE), dict)]
    if not counts:
        return status
    newest = max(counts, key=lambda found: str(found.get("counted_at")))
    said = outside_text(status.stream, newest)
    if said is None:
        return status
    status = replace(status, outside_windows=f"{said} (counted {newest.get('counted_at')})")
    if not never_read(newest) or status.status not in (OK, CHECK, NOT_LOADED):
        return status
    return replace(status, status=NO_WINDOW, detail="; ".join(d for d in (status.detail, said) if d))


def _failed_checks(instance: dg.DagsterInstance, key: dg.AssetKey) -> tuple[list[str], list[str]]:
    """The checks whose latest evaluation failed, and what their metadata says to do about it (rows only in the
    target under `deletes: report` named no command in status before)."""
    keys = [dg.AssetCheckKey(key, name) for name in CHECK_NAMES]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    failed = {k.name: r for k, r in latest.items() if r.status == AssetCheckExecutionRecordStatus.FAILED}
    advice = []
    for name in sorted(failed):
        event = failed[name].event
        evaluation = event.dagster_event.event_specific_data if event and event.dagster_event else None
        todo = getattr(evaluation, "metadata", {}).get(WHAT_TO_DO)
        if todo is not None:
            advice.append(f"{name}: {todo.value}")
    return sorted(failed), advice


def _freshness(instance: dg.DagsterInstance, key: dg.AssetKey, runs: int = FRESHNESS_RUNS) -> dict[str, float]:
    """The last runs' histograms merged (exact, unlike averaging their percentiles)."""
    encoded = []
    for found in instance.fetch_materializations(key, limit=runs).records:
        event = found.asset_materialization
        entry = event.metadata.get(HISTOGRAM) if event is not None else None
        if entry is not None and isinstance(entry.value, str):
            encoded.append(entry.value)
    return percentiles(merged(encoded)) if encoded else {}


def _lag(slot: SlotFigures | None, committed: dt.datetime | None, now: dt.datetime) -> str:
    if slot is not None:
        if slot.error is not None:
            return f"slot: {slot.error}"
        return f"slot lag {_bytes(slot.lag_bytes)}, WAL {_bytes(slot.retained_wal_bytes)}"
    return f"checkpoint {age_text((now - committed).total_seconds())} old" if committed else "-"


def _slot(settings: Settings, name: str, source: PostgresSource) -> SlotFigures:
    from ingestion_assets.sources.postgres.cdc import CdcError, SlotMissingError, slot_health

    limit = source.cdc.max_retained_wal_mb * 1024 * 1024
    slot = source.cdc.slot or f"ingest_{name}"
    try:
        url = postgres_url(source.connection, source.tls, settings, f"sources.{name}.connection")
        health = slot_health(url, slot)
    except SlotMissingError:  # what the next run does about it depends on the checkpoints: `ingest cdc status` says
        return SlotFigures(0, 0, limit, error=f"no slot {slot} (`ingest cdc status {name}` says what a run does)")
    except (CdcError, psycopg2.Error, OSError, ValueError, LookupError) as exc:
        return SlotFigures(0, 0, limit, error=str(exc).splitlines()[0][:80])
    return SlotFigures(health.lag_bytes, health.retained_wal_bytes, limit)


def age_text(seconds: float) -> str:
    """`3m`, `2h` ...; a moment a little ahead of this machine's clock (another machine's, the checkpoint's source
    server's) is `0s`, not `-1s` (attack27)."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.0f}s"


def _bytes(count: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
