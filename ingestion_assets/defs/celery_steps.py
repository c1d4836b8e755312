"""dagster-celery's executor, with these changes: it refuses at run start what the catalog could not refuse before
its references resolved, it frees the pool slots of runs that ended before it claims any, it sends its catalog's
fingerprint with every step (a worker with another catalog refuses the step: defs/worker_checks.py), a
terminated run withdraws the steps no worker started (StepResult), and it registers the step task once per app.

dagster-celery's own submit function calls `create_task(app)` for every step: each call defines a new
function under the same task name on the same app, and Celery warns (DuplicateTaskNameWarning) at the
second step of every run. The warning is harmless there (the first registration serves), but it buries
real warnings; registering the task once removes its cause."""

from __future__ import annotations

from typing import Any

import dagster as dg
from celery import Celery, states
from celery.exceptions import TaskRevokedError
from dagster._core.execution.plan.objects import StepFailureData
from dagster._core.execution.retries import RetryMode
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import pack_value, serialize_value
from dagster._utils.error import SerializableErrorInfo
from dagster_celery.executor import CELERY_CONFIG, CeleryExecutor
from dagster_celery.tasks import create_task

from ingestion_assets.catalog import Catalog
from ingestion_assets.defs.broker_check import broker_problem
from ingestion_assets.defs.executors import ExecutionSettingError, run_time_host_bound
from ingestion_assets.defs.identity import catalog_identity
from ingestion_assets.defs.worker_checks import CATALOG_KWARG, CheckedStepTask, WorkerRefusal
from ingestion_assets.settings import Settings
from ingestion_assets.state.runs import free_slots_of_ended_runs

_TASK = "_ingest_execute_plan_task"  # the app's one step task, kept on the app itself
WORKER_PING_SECONDS = 2.0  # a terminated run's wait for the worker running its step to answer


def ingest_celery_executor(settings: Settings, catalog: Catalog) -> dg.ExecutorDefinition:
    @dg.executor(name="celery", config_schema=CELERY_CONFIG, requirements=dg.multiple_process_executor_requirements())
    def celery_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
        problems = run_time_host_bound(settings, catalog)  # at run start: the references resolve here
        if catalog.execution.celery is not None and (broker := broker_problem(settings, catalog.execution.celery)):
            problems.append(broker.message)
        if problems:
            raise ExecutionSettingError("; ".join(problems))
        config = init_context.executor_config
        return IngestCeleryExecutor(
            catalog=catalog_identity(settings, catalog),
            broker=config.get("broker"),
            backend=config.get("backend"),
            config_source=config.get("config_source"),
            include=config.get("include"),
            retries=RetryMode.from_config(config["retries"]),  # type: ignore[arg-type]
        )

    return celery_executor


class IngestCeleryExecutor(CeleryExecutor):
    def __init__(self, catalog: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog = catalog  # the submitter's catalog identity, sent with every step

    def execute(self, plan_context: Any, execution_plan: Any) -> Any:
        from dagster_celery.core_execution_loop import core_celery_execution_loop

        if ended := free_slots_of_ended_runs(plan_context.instance):  # before this run claims any
            plan_context.log.warning(f"freed the pool slots of {len(ended)} run(s) that had ended: {ended}")
        return core_celery_execution_loop(plan_context, execution_plan, step_execution_fn=submit_step)


def step_task(app: Celery) -> Any:
    """dagster-celery's step task on `app`, registered at the first call only."""
    task = getattr(app, _TASK, None)
    if task is None:
        task = create_task(app, base=CheckedStepTask, typing=False)  # its extra argument: the catalog
        setattr(app, _TASK, task)
    return task


def submit_step(app: Celery, plan_context: Any, step: Any, queue: str, priority: int, known_state: Any) -> Any:
    """As dagster-celery's `_submit_task`, with the task registered once (see the module's docstring)."""
    execute_step_args = ExecuteStepArgs(
        job_origin=plan_context.reconstructable_job.get_python_origin(),
        run_id=plan_context.dagster_run.run_id,
        step_keys_to_execute=[step.key],
        instance_ref=plan_context.instance.get_ref(),
        retry_mode=plan_context.executor.retries.for_inner_plan(),
        known_state=known_state,
        print_serialized_events=True,
    )
    signature = step_task(app).si(
        execute_step_args_packed=pack_value(execute_step_args),
        executable_dict=plan_context.reconstructable_job.to_dict(),
        **{CATALOG_KWARG: {**plan_context.executor.catalog, "step": step.key}},
    )
    result = signature.apply_async(priority=priority, queue=queue, routing_key=f"{queue}.execute_plan")
    return StepResult(result, plan_context, step)


class StepResult:
    """A step's Celery result, as the execution loop reads it; a worker's refusal of the step (another catalog, no
    storage) becomes the step's failure with the worker's one-line reason, not a run failure with a traceback.

    A terminated run withdraws its steps that no worker has started: Celery's revoke reaches only the workers up
    at that moment (a worker started later would run the step), and a revoked step still waiting in the broker
    never becomes ready, so the run would wait for it for ever. The run is marked canceling first, then each
    step's state read: one a worker had not started (PENDING; workers record STARTED before the step's checks) is
    given up and its pool slot freed, and the worker that takes it later reads the run's status and refuses it
    (worker_checks.py). One a worker had started is waited for, as before, unless that worker no longer answers
    (killed): the broker would hand the step out again only after its visibility timeout, to be refused."""

    def __init__(self, result: Any, plan_context: Any, step: Any) -> None:
        self.result, self.plan_context, self.step = result, plan_context, step
        self.withdrawn = False

    def ready(self) -> bool:
        return self.withdrawn or bool(self.result.ready())

    def revoke(self) -> None:
        mark_canceling(self.plan_context)
        self.result.revoke()
        state = self.result.state
        if state == states.PENDING or (state == states.STARTED and not _worker_answers(self.result)):
            self.withdrawn = True
            run_id = self.plan_context.dagster_run.run_id
            self.plan_context.instance.event_log_storage.free_concurrency_slot_for_step(run_id, self.step.key)

    def get(self) -> list[str]:
        if self.withdrawn:
            raise TaskRevokedError(f"step {self.step.key} withdrawn before a worker started it")
        try:
            return list(self.result.get())
        except WorkerRefusal as refused:
            error = SerializableErrorInfo(str(refused), [], type(refused).__name__)
            failure = dg.DagsterEvent.step_failure_event(
                self.plan_context.for_step(self.step), StepFailureData(error=error, user_failure_data=None)
            )
            return [serialize_value(failure)]


def _worker_answers(result: Any) -> bool:
    """Whether the worker that started the step is still there: a SIGKILLed worker's step would come back to the
    broker only after the visibility timeout (an hour by default), and the run would wait for it that long."""
    started = result.info if isinstance(result.info, dict) else {}
    hostname = started.get("hostname")
    if not hostname:
        return True  # unknown: wait for the step, as before
    return bool(result.app.control.ping(destination=[hostname], timeout=WORKER_PING_SECONDS))


def mark_canceling(plan_context: Any) -> None:
    """The run's status says it is ending before its waiting steps are given up: a worker reads it before it runs
    a step. A run already canceling (`dagster run terminate`) or ended keeps its status."""
    instance, run_id = plan_context.instance, plan_context.dagster_run.run_id
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status == dg.DagsterRunStatus.STARTED:
        instance.report_run_canceling(run, message="the run was interrupted: steps no worker started are withdrawn")
