"""Runs whose processes died (SIGKILL, out of memory, a reboot) keep their Dagster pool slots and stay
"started" for ever; with every slot of a source's pool held that way, each later run of the source waits
for good. On the single-machine embedded stack such runs are found by their process ids, marked failed
and their slots freed, before a new run claims any."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterError

from ingestion_assets.processes import start_time
from ingestion_assets.settings import Settings

log = logging.getLogger(__name__)

_PROCESS_EVENTS = {dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_WORKER_STARTED}
_LIVE = {dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.CANCELING}
_ORPHAN_WAIT_S = 5.0  # a killed group's step process may take a moment to die (its last write to disk)
_SIGKILL_BIT = 1 << (9 - 1)


def release_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail the runs none of whose processes is alive, then free the slots of every run that ended. Every live
    run is looked at, not only those holding a slot: a run killed after its last step freed its slot (between
    STEP_SUCCESS and RUN_SUCCESS) or one of assets without a pool stayed "started" for ever, and `ingest status`
    showed its streams running."""
    live = instance.get_runs(filters=dg.RunsFilter(statuses=list(_LIVE)))
    for run in sorted(live, key=lambda run: run.run_id):
        processes = _processes(instance, run.run_id)
        if processes and _all_gone(processes):  # else not started yet, or still running
            pids = ", ".join(str(pid) for pid, _ in processes)
            instance.report_run_failed(
                run, message=f"the run's processes ({pids}) are gone (killed or crashed); its pool slots are freed"
            )
    return free_slots_of_ended_runs(instance)


def run_ended(instance: dg.DagsterInstance, run_id: str) -> bool:
    """The run ended, or (on this machine) none of its processes is alive though it is not marked failed yet: a
    run killed with kill -9 stays `started` until the next command that loads the definitions, or status, fails
    it. A run whose processes are unknown here (another host, not started) counts as still going."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.status not in _LIVE:
        return True
    processes = _processes(instance, run_id)
    return bool(processes) and _all_gone(processes)


def free_slots_of_ended_runs(instance: dg.DagsterInstance) -> list[str]:
    """Free the pool slots of runs that ended (succeeded, failed, canceled) or are gone, which no step of theirs
    will free: a run terminated while a killed worker held its step. Dagster's run monitoring does the same
    `free_slots_after_run_end_seconds` after a run ends, only where its daemon runs (not for CI's CLI runs).
    Process ids are not looked at: the run's processes may live on other hosts."""
    storage = instance.event_log_storage
    ended = []
    for run_id in sorted(storage.get_concurrency_run_ids()):
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in _LIVE:
            storage.free_concurrency_slots_for_run(run_id)
            ended.append(run_id)
    return ended


def release_dead_runs_on_this_machine(settings: Settings) -> list[str]:
    """Only where the instance is this machine's embedded one (INGEST_HOME's, which the `ingest` commands use with
    DAGSTER_HOME unset or naming it): elsewhere a process id means nothing here."""
    home = os.environ.get("DAGSTER_HOME")
    if home and Path(home).resolve() != settings.dagster_home.resolve():
        return []
    try:
        with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
            released = release_dead_runs(instance)
    except (DagsterError, OSError) as exc:
        log.warning("could not check for runs whose process died: %s", exc)
        return []
    if released:
        log.warning("released the pool slots of %d run(s) whose processes died: %s", len(released), released)
    return released


def _processes(instance: dg.DagsterInstance, run_id: str) -> list[tuple[int, float]]:
    """(pid, when it started the run or step) of every process the run recorded."""
    entries = instance.all_logs(run_id, of_type=_PROCESS_EVENTS)
    events = [(entry.dagster_event, entry.timestamp) for entry in entries if entry.dagster_event is not None]
    return [(event.pid, when) for event, when in events if event.pid]


def _all_gone(processes: list[tuple[int, float]]) -> bool:
    """Whether none of the run's processes is alive. When the run's own process (the first) is gone but a
    step process lingers, it was killed with its group and is still dying, or it is an orphan finishing
    its step that nobody will record: wait a little for it rather than leave the slot held until the
    next run of the source comes along (a run that finds the slot held waits for it, not us)."""
    if _alive(*processes[0]):
        return False
    deadline = time.monotonic() + _ORPHAN_WAIT_S
    while any(_alive(pid, since) for pid, since in processes[1:]):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _alive(pid: int, since: float) -> bool:
    """Alive and able to run code: a zombie, or a process with SIGKILL pending, only waits to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    if _dying(pid):
        return False
    started = start_time(pid)
    return started is None or started <= since + 2.0  # started later: the id was reused by another process


def _dying(pid: int) -> bool:
    """A zombie or dead process, or one that SIGKILL was sent to (it runs no more code) (Linux /proc)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    state = fields.get("State", "").strip()[:1]
    pending = int(fields.get("ShdPnd", "0").strip() or "0", 16) | int(fields.get("SigPnd", "0").strip() or "0", 16)
    return state in {"Z", "X"} or bool(pending & _SIGKILL_BIT)
