"""Dagster wiring of a CDC source: one multi-asset materializes all its streams from one slot, a sensor
watches the slot (retained WAL, lag) and asks for a run when changes wait."""

# No `from __future__ import annotations` here: Dagster inspects the asset's `context` annotation at runtime.

from collections.abc import Callable, Iterator, Mapping, Set
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster import AssetExecutionContext
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from ingestion_assets.catalog import Catalog, PostgresSource
from ingestion_assets.defs.cdc_counts import (
    count_after_failure,
    missing_metadata,
    rows_missing,
    say_missing,
    still_missing,
)
from ingestion_assets.defs.failures import permanent_failure
from ingestion_assets.defs.jobs import cdc_job, job_name
from ingestion_assets.defs.metadata import POSITION, ROWS_READ, SUMMARY, definition_metadata, target_metadata
from ingestion_assets.defs.partitions import range_partitions
from ingestion_assets.defs.run_tags import MODE, SOURCE, mark_refused
from ingestion_assets.defs.sources import slot_key
from ingestion_assets.defs.streams import StreamRef
from ingestion_assets.defs.target_shrank import observe_target_rows
from ingestion_assets.drain import Drain
from ingestion_assets.observe.freshness import histogram_metadata
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings
from ingestion_assets.state.checkpoints import InstanceStateStore, checkpoint_metadata, latest_checkpoint

if TYPE_CHECKING:  # the slot's reader and the CDC sync load in a step or a sensor tick, not with the definitions
    from ingestion_assets.sources.postgres.cdc import SlotHealth
    from ingestion_assets.streams.cdc import CdcOutcome, CdcSync
    from ingestion_assets.streams.postgres_table import PostgresTableStream

SLOT_HEALTH = "slot_health"


class DagsterCdcStore:
    """Each stream's own log position, stored on its asset; with history partitions, on its `live`
    partition, whichever run moved it."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        keys: dict[str, dg.AssetKey],
        log_event: Any = None,
        partition: str | None = None,
    ) -> None:
        self._instance, self._keys, self._partition = instance, keys, partition
        self._stores = {name: InstanceStateStore(instance, key, log_event) for name, key in keys.items()}

    def latest(self) -> dict[str, dict[str, Any] | None]:
        from ingestion_assets.streams.cdc.state import stream_checkpoint

        return {
            name: stream_checkpoint(latest_checkpoint(self._instance, key, self._partition))
            for name, key in self._keys.items()
        }

    def commit(self, lsn: int, details: Mapping[str, Mapping[str, Any]]) -> None:
        from ingestion_assets.sources.postgres.cdc import format_lsn

        for name, extra in details.items():
            self._stores[name].commit(self._partition, {"lsn": format_lsn(lsn)}, **extra)


def history_partitions(source_name: str, source: PostgresSource) -> dg.DynamicPartitionsDefinition | None:
    """`live` plus the history key ranges, when the source copies its history as partitions."""
    if source.cdc.history_chunk is None:
        return None
    return dg.DynamicPartitionsDefinition(name=f"{source_name}__cdc")


def cdc_sync(
    settings: Settings,
    catalog: Catalog,
    source_name: str,
    source: PostgresSource,
    streams: "list[PostgresTableStream]",
    instance: dg.DagsterInstance,
    log_event: Any = None,
) -> "CdcSync":
    """The source's sync on a Dagster instance: its checkpoint store, and where history partitions go."""
    from ingestion_assets.streams.cdc import CdcSync

    partitions = history_partitions(source_name, source)
    keys = dict(zip([s.name for s in streams], _keys(source_name, streams), strict=True))
    store = DagsterCdcStore(instance, keys, log_event, LIVE if partitions else None)
    sync = CdcSync(settings, catalog.destination, source_name, source, streams, store)
    if partitions is not None:
        name = partitions.name or ""
        sync.add_partitions = lambda keys: _add_missing(instance, name, keys)
    return sync


def _add_missing(instance: dg.DagsterInstance, name: str, keys: list[str]) -> None:
    existing = set(instance.get_dynamic_partitions(name))
    missing = [k for k in keys if k not in existing]
    if missing:
        instance.add_dynamic_partitions(name, missing)


def build_cdc_assets(
    settings: Settings, catalog: Catalog
) -> tuple[list[dg.AssetsDefinition], list[dg.SensorDefinition]]:
    assets, sensors = [], []
    for source_name, source in catalog.sources.items():
        if isinstance(source, PostgresSource) and source.mode == "cdc":
            streams = [
                StreamRef(settings, catalog.destination, source_name, source, n, s) for n, s in source.streams.items()
            ]
            assets.append(_cdc_asset(settings, catalog, source_name, source, streams))
            sensors.append(_slot_sensor(settings, catalog, source_name, source, streams))
    return assets, sensors


def cdc_streams(
    settings: Settings, catalog: Catalog, source_name: str, source: PostgresSource
) -> "list[PostgresTableStream]":
    from ingestion_assets.streams.postgres_table import PostgresTableStream

    return [
        PostgresTableStream(settings, catalog.destination, source_name, source, name, spec)
        for name, spec in source.streams.items()
    ]


def _keys(source_name: str, streams: "list[StreamRef] | list[PostgresTableStream]") -> list[dg.AssetKey]:
    return [dg.AssetKey([source_name, s.name]) for s in streams]


def _cdc_asset(
    settings: Settings, catalog: Catalog, source_name: str, source: PostgresSource, streams: list[StreamRef]
) -> dg.AssetsDefinition:
    keys = _keys(source_name, streams)
    specs = [
        dg.AssetSpec(
            key,
            group_name=source_name,
            kinds={"postgres", "cdc", catalog.destination.type},
            description=f"changes of {source.streams[s.name].table} from the slot of source {source_name}",
            deps=[slot_key(source_name, source)],
            metadata={**definition_metadata(s), "slot": slot_key(source_name, source).path[-1]},
            tags={SOURCE: source_name},
        )
        for key, s in zip(keys, streams, strict=True)
    ]

    @dg.multi_asset(
        name=f"{source_name}__cdc",
        specs=specs,
        check_specs=[dg.AssetCheckSpec(SLOT_HEALTH, asset=keys[0], description="the slot does not hoard WAL")],
        pool=f"ingest_{source_name}",
        # `--select` of some streams runs the whole source (one slot, one log): unselected streams keep their
        # changes and checkpoints, their materializations are left out of the run.
        can_subset=True,
        partitions_def=history_partitions(source_name, source),
        backfill_policy=dg.BackfillPolicy.single_run() if source.cdc.history_chunk is not None else None,
        retry_policy=dg.RetryPolicy(
            max_retries=source.cdc.retries.max_attempts - 1,
            delay=source.cdc.retries.delay_seconds,
            backoff=dg.Backoff.EXPONENTIAL,
            jitter=dg.Jitter.FULL,
        ),
    )
    def _asset(context: AssetExecutionContext) -> Iterator[Any]:
        # A CLI backfill (`--partition-range`) of history ranges is one run: each range in turn, in order.
        partitions: list[str | None] = [None]
        if context.has_partition_key_range:
            partitions = list(range_partitions(context))
        if context.has_partition_key and not context.has_partition_key_range:
            partitions = [context.partition_key]
        _tag_run(context, source_name, partitions)
        live = LIVE if history_partitions(source_name, source) is not None else None
        missing: dict[str, int] = {}
        counted: list[bool] = []

        def count_before() -> None:  # holding the slot's lock: no other run changes the targets meanwhile
            if not counted:
                missing.update(rows_missing(context, keys, streams, context.log.warning))
                counted.append(True)

        try:
            outcomes = [_run_partition(context, partition, count_before) for partition in partitions]
        except Exception:
            count_after_failure(context, keys, streams, missing, live)
            raise
        outcome = outcomes[-1]
        for earlier in outcomes[:-1]:
            for name, count in earlier.rows.items():
                outcome.rows[name] = outcome.rows.get(name, 0) + count
            outcome.dead_letters += earlier.dead_letters
        say_missing(outcome, streams, missing, context.log.warning)
        selected = context.selected_asset_keys
        left = [k.to_user_string() for k in keys if k not in selected]
        if left:
            context.log.info(
                f"source {source_name} reads one replication slot for all its streams: this run applied the changes "
                f"of {', '.join(left)} too and checkpointed them (not selected, so not materialized in this run)"
            )
            for key, stream in zip(keys, streams, strict=True):  # written, not materialized: status compares with it
                if key not in selected:
                    owed = still_missing(outcome, stream.name, missing)
                    observe_target_rows(context.log_event, key, stream, live, owed)
        yield from _results(source, keys, streams, outcome, selected, context.selected_asset_check_keys, missing)

    def _run_partition(
        context: AssetExecutionContext, partition: str | None, before_apply: Callable[[], None]
    ) -> "CdcOutcome":
        from ingestion_assets.sources.postgres.cdc import CdcError as SlotError
        from ingestion_assets.sources.postgres.cdc.slot_lock import SlotHeldByLiveRun
        from ingestion_assets.streams.cdc import CdcError

        running = cdc_streams(settings, catalog, source_name, source)
        sync = cdc_sync(settings, catalog, source_name, source, running, context.instance, context.log_event)
        with Drain(source.cdc.drain_seconds, context.log) as drain:
            sync.stop, sync.log, sync.run_id = drain, context.log, context.run_id
            sync.before_apply = before_apply
            try:
                return sync.run(partition)
            except (CdcError, SlotError) as exc:  # each says whether a retry may help (another run holds the slot)
                if isinstance(exc, SlotHeldByLiveRun):  # nothing was read: no stream's state
                    mark_refused(context, str(exc))
                raise dg.Failure(description=str(exc), allow_retries=exc.transient) from exc
            except Exception as exc:
                where = f"source {source_name} (cdc)" + (f" partition {partition}" if partition else "")
                if sync.loading:  # a load failed: a value its target's column cannot hold names the column only
                    where += f", loading stream(s) {', '.join(sync.loading)}"
                failure = permanent_failure(where, exc)
                if failure is None:
                    raise
                raise failure from exc

    return _asset


def _summary(stream: str, outcome: "CdcOutcome") -> str:
    """One sentence, as table streams give: what this run did for the stream."""
    from ingestion_assets.sources.postgres.cdc import format_lsn

    rows = outcome.rows.get(stream, 0)
    what = "rows copied" if outcome.mode in ("snapshot", "chunk") else "changes applied"
    said = f"{rows:,} {what} ({outcome.mode}), log at {format_lsn(outcome.lsn)}"
    if stream in outcome.copied:
        said += "; the table's copy beside the log is complete"
    if outcome.dead_letters:
        said += f"; {outcome.dead_letters:,} dead letter(s) in the source's run"
    return said


def _results(
    source: PostgresSource,
    keys: list[dg.AssetKey],
    streams: list[StreamRef],
    outcome: "CdcOutcome",
    selected: Set[dg.AssetKey],
    checks: Set[dg.AssetCheckKey],
    missing: dict[str, int],
) -> Iterator[Any]:
    from ingestion_assets.sources.postgres.cdc import format_lsn

    health = outcome.health
    retained = health.retained_wal_bytes if health is not None else 0
    limit = source.cdc.max_retained_wal_mb * 1024 * 1024
    # A history chunk's own partition records the copy; the log position lives on `live`.
    shared = {
        POSITION: dg.MetadataValue.json({"lsn": format_lsn(outcome.lsn)}),
        "mode": outcome.mode,
        "retained WAL bytes": retained,
        "latency ms": dg.MetadataValue.json(outcome.latency()),
        **histogram_metadata(outcome.histogram),
        "dead letters": outcome.dead_letters,
    }
    for key, stream in zip(keys, streams, strict=True):
        if key not in selected:
            continue
        metadata: dict[str, Any] = {**shared, ROWS_READ: outcome.rows.get(stream.name, 0), **target_metadata(stream)}
        if stream.name in outcome.checkpoints:  # each stream's own log position (a history chunk has none)
            lsn, details = outcome.checkpoints[stream.name]
            metadata |= checkpoint_metadata({"lsn": format_lsn(lsn)}, **details)
            metadata[POSITION] = dg.MetadataValue.json({"lsn": format_lsn(lsn)})
        if stream.name in outcome.copied:
            metadata["copied"] = True
        if stream.name in outcome.reasons:
            metadata["copy reason"] = outcome.reasons[stream.name]
        if stream.name in outcome.paused:
            metadata["paused"] = outcome.paused[stream.name]
        metadata[SUMMARY] = _summary(stream.name, outcome)
        owed = still_missing(outcome, stream.name, missing)
        if owed:
            metadata |= missing_metadata(owed)
            metadata[SUMMARY] += (
                f"; {owed:,} row(s) deleted from the target outside ingest are still missing: `ingest refresh "
                f"{stream.qualified_name}` copies the table again"
            )
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)
    if dg.AssetCheckKey(keys[0], SLOT_HEALTH) not in checks:
        return
    yield dg.AssetCheckResult(
        asset_key=keys[0],
        check_name=SLOT_HEALTH,
        passed=retained <= limit,
        metadata={
            "retained WAL bytes": retained,
            "limit bytes": limit,
            "lag bytes": health.lag_bytes if health is not None else 0,
        },
    )


def slot_health_evaluation(source: PostgresSource, key: dg.AssetKey, health: "SlotHealth") -> dg.AssetCheckEvaluation:
    """The slot_health check as the sensor sees it, without a run: a slot nobody reads fails it too."""
    limit = source.cdc.max_retained_wal_mb * 1024 * 1024
    lost = bool(health.invalidation_reason) or health.wal_status == "lost"
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=SLOT_HEALTH,
        passed=health.retained_wal_bytes <= limit and not lost,
        metadata={
            "retained WAL bytes": health.retained_wal_bytes,
            "limit bytes": limit,
            "lag bytes": health.lag_bytes,
            "WAL status": health.wal_status or "",
        },
    )


def _slot_sensor(
    settings: Settings, catalog: Catalog, source_name: str, source: PostgresSource, streams: list[StreamRef]
) -> dg.SensorDefinition:
    keys = _keys(source_name, streams)

    @dg.sensor(
        name=f"{source_name}__cdc_slot",
        minimum_interval_seconds=10,
        default_status=dg.DefaultSensorStatus.STOPPED,
        target=cdc_job(source_name, keys),
        description="records the slot's retained WAL and lag; asks for a run when changes are waiting",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> Any:
        from ingestion_assets.sources.postgres.cdc import CdcError as SlotError
        from ingestion_assets.sources.postgres.cdc import slot_health

        running = cdc_streams(settings, catalog, source_name, source)
        sync = cdc_sync(settings, catalog, source_name, source, running, context.instance)
        live = LIVE if sync.history else None
        started = any(c is not None for c in sync.store.latest().values())
        if live is not None and sync.add_partitions is not None and not started:
            sync.add_partitions([LIVE])  # its first run creates the slot and plans the history partitions
            return dg.RunRequest(run_key="start", partition_key=LIVE)
        import psycopg2

        from ingestion_assets.streams.cdc.paused import unpublish_for_source

        try:
            for message in unpublish_for_source(sync.url(), source_name, source)[0]:  # the application's writes fail
                context.log.warning(message)
        except psycopg2.Error as exc:  # the source is unreachable: slot_health below says so
            context.log.warning(f"source {source_name}: replica identities not checked: {exc}")
        try:
            health = slot_health(sync.url(), sync.slot)
        except SlotError as exc:
            if source.cdc.live_seconds is not None and not started:  # its first live run creates the slot
                return _keep_live(context, job_name(source_name), live)
            return dg.SkipReason(f"slot not readable yet: {exc}")
        context.instance.report_runless_asset_event(
            dg.AssetObservation(
                asset_key=keys[0],
                partition=live,
                metadata={"retained WAL bytes": health.retained_wal_bytes, "lag bytes": health.lag_bytes},
            )
        )
        context.instance.report_runless_asset_event(slot_health_evaluation(source, keys[0], health))
        if source.cdc.live_seconds is not None:  # keep one live run up: the next starts as the last one ends
            return _keep_live(context, job_name(source_name), live)
        waiting = started and health.lag_bytes > 0
        if not waiting:
            return dg.SkipReason("no changes waiting in the slot")
        return dg.RunRequest(run_key=f"{health.confirmed_flush_lsn}-{health.lag_bytes}", partition_key=live)

    return _sensor


def _keep_live(context: dg.SensorEvaluationContext, job: str, partition: str | None) -> Any:
    """A run of the source's job unless one is queued or going (each live run ends after cdc.live_seconds)."""
    going = context.instance.get_run_records(
        dg.RunsFilter(job_name=job, statuses=[*IN_PROGRESS_RUN_STATUSES, dg.DagsterRunStatus.QUEUED]), limit=1
    )
    if going:
        return dg.SkipReason(f"live run {going[0].dagster_run.run_id} is up")
    return dg.RunRequest(partition_key=partition)


def _tag_run(context: AssetExecutionContext, source_name: str, partitions: list[str | None]) -> None:
    """`dagster asset materialize --select` runs carry no job tags: the asset says what it is (history ranges
    are a backfill). Tags are for people: a storage error is logged, never the reason a run fails."""
    mode = "backfill" if any(p not in (None, LIVE) for p in partitions) else "cdc"
    try:
        context.instance.add_run_tags(context.run_id, {SOURCE: source_name, MODE: mode})
    except dg.DagsterError as exc:
        context.log.warning(f"could not tag run {context.run_id}: {exc}")
