"""`ingest status`: one line per stream (status, rows in target, last run, lag, freshness, dead letters,
position; partitioned streams: partitions materialized, failed, running, never run); `--json` for scripts;
exit 1 when a stream needs attention (a failed run, partition or check, never synced,
a CDC slot over its WAL limit, a stream older than its `freshness.max_lag`, a target table holding fewer rows than
the last run that wrote it left in it, or gone, source rows no time window reads: before the first, or NULL;
`not loaded`, a stream with a position but nothing loaded yet, and `partly loaded`, partitions never run beside
others that ran, are no errors). The rows in target are counted in the destination now, not taken from a run."""

from __future__ import annotations

import argparse
import json
import sys

from ingestion_assets.catalog import load_catalog
from ingestion_assets.cli.common import bring_up
from ingestion_assets.observe.partition_status import named
from ingestion_assets.observe.status import (
    ATTENTION,
    NO_WINDOW,
    NOT_LOADED,
    OK,
    PARTLY_LOADED,
    StreamStatus,
    age_text,
    stream_statuses,
)
from ingestion_assets.partitions import LIVE
from ingestion_assets.settings import Settings
from ingestion_assets.state.runs import release_dead_runs_on_this_machine
from ingestion_assets.state.summary import open_instance

_COLOURS = {OK: "32", "running": "36", NOT_LOADED: "33", PARTLY_LOADED: "33"}  # green, cyan, yellow; else red
_POSITION_CHARS = 48
_LAG_CHARS = 32  # the lag column's width; a longer lag (a slot's problem) is cut there and given whole beneath


def status(settings: Settings, args: argparse.Namespace) -> int:
    catalog = load_catalog(settings.catalog_path)
    bring_up(settings)  # the instance's storage (started if it is not running, as every state command does)
    if not catalog.execution.distributed:  # a run whose processes died here (ingest dev stopped) is not `running`
        release_dead_runs_on_this_machine(settings)
    with open_instance(settings) as instance:
        found = stream_statuses(settings, catalog, instance)
    if args.json:
        print(json.dumps([s.as_json() for s in found], indent=2, default=str))
    else:
        _print_table(found, colour=sys.stdout.isatty())
        for problem in dict.fromkeys(s.target_problem for s in found if s.target_problem):
            print(problem, file=sys.stderr)  # once per destination: the rows in target show as `?`
    needing = [s for s in found if s.status in ATTENTION]
    if needing and not args.json:
        print(f"\n{len(needing)} stream(s) need attention:", file=sys.stderr)
        for each in needing:
            detail = each.detail.removeprefix(f"{each.status}: ")  # a detail may begin with the status itself
            print(f"  {each.stream}: {each.status}: {detail}", file=sys.stderr)
    refused = [s for s in found if s.refused_run]
    if refused and not args.json:  # no stream's state: said apart from it
        print(f"\n{len(refused)} stream(s) whose newest run refused to start (it read nothing):", file=sys.stderr)
        for each in refused:
            print(f"  {each.stream}: {each.refused_run}", file=sys.stderr)
    return 1 if needing else 0


def _print_table(found: list[StreamStatus], colour: bool) -> None:
    width = max([len(s.stream) for s in found] + [6]) + 2
    head = f"{'stream':<{width}}{'status':<14}{'rows in target':>15}  {'last run':<16}{'lag':<{_LAG_CHARS}}"
    print(f"{head}{'p50/p99':<14}{'dead':>5}  position")
    for each in found:
        state = f"{each.status:<14}"
        if colour:
            state = f"\033[{_COLOURS.get(each.status, '31')}m{state}\033[0m"
        rows = _rows(each)
        age = _last_run(each)
        position = json.dumps(each.position, default=str) if each.position else "(start)"
        if len(position) > _POSITION_CHARS:
            position = position[: _POSITION_CHARS - 1] + "…"
        dead = str(each.dead_letters) if each.dead_letters is not None else "-"
        fresh = f"{_ms(each.freshness['p50'])}/{_ms(each.freshness['p99'])}" if each.freshness else "-"
        lag = each.lag if len(each.lag) < _LAG_CHARS else each.lag[: _LAG_CHARS - 2] + "…"
        print(f"{each.stream:<{width}}{state}{rows:>15}  {age:<16}{lag:<{_LAG_CHARS}}{fresh:<14}{dead:>5}  {position}")
        if lag != each.lag:  # a slot's problem is a sentence: whole beneath, the columns kept in line
            print(f"  {each.lag}")
        if each.refresh is not None:  # the position is the live table's; the refresh's own progress beneath
            print(f"  {each.refresh}")
        if each.soft_deleted_in_target:
            deleted = each.soft_deleted_in_target
            print(f"  and {deleted:,} soft-deleted row(s) kept in the target (`_ingest_deleted_at` set), not counted")
        if each.status == PARTLY_LOADED:  # no error, but what is not loaded and how to load it
            print(f"  {each.detail}")
        if each.outside_windows and each.status != NO_WINDOW:  # future-dated rows: said, not an error
            print(f"  {each.outside_windows}")
        _print_partitions(each)


def _last_run(each: StreamStatus) -> str:
    """The last materialization's age; without one, the last run's outcome and age (`failed 5m ago`), or never."""
    if each.age_seconds is not None:
        return f"{age_text(each.age_seconds)} ago"
    if each.last_attempt is not None and each.attempt_age_seconds is not None:
        return f"{each.last_attempt} {age_text(each.attempt_age_seconds)} ago"
    return "never"


def _rows(each: StreamStatus) -> str:
    """The target's live rows; `?` when they could not be counted; the last run's figure (every row, soft-deleted
    ones too) beside them when the table's rows differ from it."""
    if each.target_problem is not None:
        return "?"
    rows = f"{each.rows_in_target:,}" if each.rows_in_target is not None else "no table"
    after = each.rows_after_last_run
    every = each.rows_in_target + each.soft_deleted_in_target if each.rows_in_target is not None else None
    return rows if after is None or after == every else f"{rows} (run: {after:,})"


def _print_partitions(each: StreamStatus) -> None:
    """How many partitions are materialized, failed, running and never run (the failed ones named); then
    `live` and every partition a run stopped inside, one line each; the complete ones counted."""
    if (summary := each.partition_summary) is not None:
        print(
            f"  {summary.total} partitions: {summary.materialized} materialized, {len(summary.failed)} failed, "
            f"{len(summary.running)} running, {summary.missing} never run"
        )
        for state, names in (("failed", summary.failed), ("running", summary.running)):
            if names:
                print(f"  {state}: {named(names)}")
    if not each.partitions:
        return
    complete = sum(1 for p in each.partitions if p.complete)
    print(f"  {len(each.partitions)} partitions with a checkpoint, {complete} complete")
    for line in each.partitions:
        if line.partition == LIVE or not line.complete:
            state = "complete" if line.complete else "incomplete"
            position = json.dumps(line.position, default=str) if line.position else "(start)"
            print(f"  - {line.partition}: {state}, checkpoint {age_text(line.age_seconds)} old, {position[:60]}")


def _ms(value: float) -> str:
    return f"{value / 1000:.1f}s" if value >= 1000 else f"{value:.0f}ms"
