"""Runs whose processes died (SIGKILL, out of memory, a reboot) keep their Dagster pool slots and stay
"started" for ever; with every slot of a source's pool held that way, each later run of the source waits
for good. On the single-machine embedded stack such runs are found by their process ids, marked failed
and their slots freed, before a new run claims any."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterError

from ingestion_assets.settings import Settings

log = logging.getLogger(__name__)

_PROCESS_EVENTS = {dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_WORKER_STARTED}
_LIVE = {dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.CANCELING}


def release_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Free the slots of finished runs, and fail then free runs none of whose processes is alive."""
    storage = instance.event_log_storage
    released = []
    for run_id in sorted(storage.get_concurrency_run_ids()):
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in _LIVE:
            processes = _processes(instance, run_id)
            if not processes or any(_alive(pid, since) for pid, since in processes):
                continue  # not started yet, or still running
            pids = ", ".join(str(pid) for pid, _ in processes)
            instance.report_run_failed(
                run, message=f"the run's processes ({pids}) are gone (killed or crashed); its pool slots are freed"
            )
        storage.free_concurrency_slots_for_run(run_id)
        released.append(run_id)
    return released


def release_dead_runs_on_this_machine(settings: Settings) -> list[str]:
    """Only where the instance is this machine's embedded one: elsewhere a process id means nothing here."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or Path(home).resolve() != settings.dagster_home.resolve():
        return []
    try:
        with dg.DagsterInstance.get() as instance:
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


def _alive(pid: int, since: float) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    started = _start_time(pid)
    return started is None or started <= since + 2.0  # started later: the id was reused by another process


def _start_time(pid: int) -> float | None:
    """When the process started (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, IndexError, StopIteration):
        return None
    return int(boot.split()[1]) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
