"""``django_leases.tasks.TaskBackend``: a Django Tasks backend over the workflow engine.

::

    TASKS = {
        "default": {
            "BACKEND": "django_leases.tasks.TaskBackend",
            "QUEUES": ["default", "mail"],      # optional: the queue names tasks may name
            "OPTIONS": {"retries": 2, "retry_delay": 5.0},
        }
    }

Django 6 ships the Tasks API as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
(``pip install django-leases[tasks]``) provides it as ``django_tasks``. This module uses
whichever is installed (Django's own first).

Each enqueued task is a **one-step workflow run** (workflow ``django_leases.task``, one step
of step function ``django_leases.task``), run by ``manage.py run_workflow_worker`` as any step:
claimed under a lease and an attempt fence, retried when its worker dies or it raises (up to
``OPTIONS["retries"]`` more attempts, ``OPTIONS["retry_delay"]`` seconds apart). The
``TaskResult`` id is the run id. The task's ``queue_name`` is the step's queue (see
``DJANGO_LEASES["QUEUES"]``: concurrency and rate limits apply) and its ``priority`` the
step's priority (higher first).

What is supported (the ``supports_*`` flags say the same): ``enqueue`` / ``aenqueue``,
``get_result`` / ``aget_result`` (from any process), ``priority``, ``queue_name``,
``takes_context`` (the context's ``attempt`` is the step's fencing attempt). ``run_after``
and ``async def`` tasks are not (``supports_defer`` and ``supports_async_task`` are false:
Django refuses such a task with ``InvalidTaskError``).

A task's ``TaskResult``: ``status`` (``READY`` until a worker claims it, ``RUNNING``,
``SUCCESSFUL`` or ``FAILED`` once the run ended), ``return_value``, ``errors`` (one per failed
attempt: exception class path and traceback), ``worker_ids`` (one per attempt: the
``host:pid`` that ran it, where the attempt recorded it, else ``"attempt N"``),
``enqueued_at`` / ``started_at`` / ``last_attempted_at`` / ``finished_at`` (database clock).
``task_enqueued`` is sent by ``enqueue``; ``task_started`` and ``task_finished`` by the worker
(``task_finished`` once: on success, or when the last attempt failed), just before the
attempt's outcome is recorded.

Enqueued inside ``transaction.atomic()``, a task is seen by workers only once the transaction
commits (it is a row like any run): no ``on_commit`` is needed, and a rolled-back enqueue
leaves nothing.
"""

from __future__ import annotations

import importlib
import os
import socket
import traceback
import uuid
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from django.utils.module_loading import import_string

from django_leases.exceptions import DjangoLeasesError
from django_leases.validation import check_json


def _api(module: str) -> ModuleType:
    """``django.tasks<module>`` (Django 6), else the backport's ``django_tasks<module>``."""
    try:
        return importlib.import_module(f"django.tasks{module}")
    except ImportError:
        return importlib.import_module(f"django_tasks{module}")


_tasks, _base, _exceptions, _signals = (
    _api(""),
    _api(".base"),
    _api(".exceptions"),
    _api(".signals"),
)
BaseTaskBackend: Any = _api(".backends.base").BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
task_backends: Any = _tasks.task_backends
#: Django 6 spells it ``InvalidTask``, the backport ``InvalidTaskError``.
InvalidTaskError: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished

__all__ = ["TASK_STEP_FUNCTION", "TASK_WORKFLOW", "TaskBackend", "TaskRaised"]

#: The workflow each task runs as, and its one step's step function.
TASK_WORKFLOW = "django_leases.task"
TASK_STEP_FUNCTION = "django_leases.task"
#: The name of the task run's one step.
TASK_STEP = "task"


class TaskRaised(DjangoLeasesError):
    """A task function raised: the step's recorded error carries the exception's class path
    and traceback (``details``), which ``TaskResult.errors`` shows."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.details = {
            "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "traceback": "".join(traceback.format_exception(exc)),
            "worker": _worker_id(),
        }


def _worker_id() -> str:
    return f"{socket.gethostname()[:200]}:{os.getpid()}"


def _option(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidTaskError(
            f'TaskBackend OPTIONS["{name}"] must be a number >= 0, not {value!r}'
        )
    return value


class TaskBackend(BaseTaskBackend):  # type: ignore[misc]  # Any: Django's or the backport's
    """The Django Tasks backend: tasks as fenced one-step workflow runs (module docstring).

    ``OPTIONS``: ``retries`` (``int`` ≥ 0, default 0: further attempts after a failure),
    ``retry_delay`` (seconds ≥ 0 between attempts, default 0), ``database`` (the alias runs
    are written to; default: the router's choice)."""

    supports_defer = False
    supports_async_task = False
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        _register()
        self.retries = int(_option(self.options, "retries", 0))
        self.retry_delay = float(_option(self.options, "retry_delay", 0.0))
        self.database: str | None = self.options.get("database")

    def validate_task(self, task: Any) -> None:
        """Django's rules, and the task's queue must be one ``DJANGO_LEASES["QUEUES"]``
        knows (``"default"`` always is). Raises ``InvalidTaskError``."""
        from django_leases.conf import queue_limits

        super().validate_task(task)
        if task.queue_name not in queue_limits():
            raise InvalidTaskError(
                f"Queue {task.queue_name!r} is not configured in DJANGO_LEASES['QUEUES']"
            )

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Start the task's run (visible to workers when the caller's transaction commits)
        and send ``task_enqueued``; returns its ``TaskResult`` (status ``READY``).

        Raises ``InvalidTaskError`` for a task this backend cannot run, ``ValueError`` for
        arguments that are not JSON (nothing is stored)."""
        from django_leases.workflows.engine import start_workflow

        self.validate_task(task)
        payload = {
            "path": task.module_path,
            "backend": self.alias,
            "args": list(args),
            "kwargs": dict(kwargs),
            "takes_context": task.takes_context,
            "priority": task.priority,
            "queue": task.queue_name,
            "retries": self.retries,
            "retry_delay": self.retry_delay,
        }
        check_json(payload, "Task arguments")
        run_id = start_workflow(TASK_WORKFLOW, payload, using=self.database)
        result = self.get_result(str(run_id))
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of the task run ``result_id`` as the database has it now.

        Raises ``TaskResultDoesNotExist`` for an id that is no task run of this backend."""
        from django.db import router

        from django_leases.models import WorkflowRun, WorkflowStep

        alias = self.database or router.db_for_write(WorkflowRun)
        try:
            pk = uuid.UUID(str(result_id))
            run = WorkflowRun.objects.using(alias).get(pk=pk, workflow=TASK_WORKFLOW)
        except (ValueError, WorkflowRun.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        step = (
            WorkflowStep.objects.using(alias)
            .filter(run_id=run.pk, step_name=TASK_STEP)
            .prefetch_related("attempts")
            .first()
        )
        return _result(self, run, step)

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """No further checks (``DJANGO_LEASES`` has its own)."""
        return []


def _result(backend: TaskBackend, run: Any, step: Any) -> Any:
    """The ``TaskResult`` of ``run`` (and its step, or ``None`` before its first pass)."""
    from django_leases.workflows.values import RunStatus, StepStatus

    data = run.input
    task = _task(data).using(
        priority=data["priority"], queue_name=data["queue"], backend=backend.alias
    )
    attempts = sorted(step.attempts.all(), key=lambda a: a.attempt) if step is not None else []
    if run.status == RunStatus.COMPLETED:
        status = TaskResultStatus.SUCCESSFUL
    elif run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        status = TaskResultStatus.FAILED
    elif step is not None and step.status == StepStatus.RUNNING:
        status = TaskResultStatus.RUNNING
    else:
        status = TaskResultStatus.READY
    errors = []
    worker_ids = []
    for attempt in attempts:
        details = (attempt.error or {}).get("details") or {}
        returned = attempt.result if isinstance(attempt.result, dict) else {}
        worker_ids.append(
            str(details.get("worker") or returned.get("worker") or f"attempt {attempt.attempt}")
        )
        if attempt.status == "failed":
            errors.append(
                TaskError(
                    exception_class_path=str(
                        details.get("exception_class_path") or _engine_error(attempt.error)
                    ),
                    traceback=str(
                        details.get("traceback") or (attempt.error or {}).get("message", "")
                    ),
                )
            )
    result = TaskResult(
        task=task,
        id=str(run.pk),
        status=status,
        enqueued_at=run.created_at,
        started_at=attempts[0].started_at if attempts else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        finished_at=run.finished_at if status in _FINISHED else None,
        args=data["args"],
        kwargs=data["kwargs"],
        backend=backend.alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL and isinstance(run.output, dict):
        object.__setattr__(result, "_return_value", run.output.get("value"))
    return result


_FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def _engine_error(error: Any) -> str:
    """The exception class path of an attempt the engine failed, not the task (its worker
    was lost, or it ran past a timeout): ``LeaseLostError`` for a lapsed lease, else
    ``WorkflowError``."""
    from django_leases.workflows.values import STEP_LEASE_LAPSED

    if isinstance(error, dict) and error.get("code") == STEP_LEASE_LAPSED:
        return "django_leases.exceptions.LeaseLostError"
    return "django_leases.exceptions.WorkflowError"


def _task(data: Mapping[str, Any]) -> Any:
    """The ``Task`` at the module path ``data["path"]``."""
    found = import_string(data["path"])
    if not isinstance(found, Task):
        raise InvalidTaskError(f"{data['path']!r} is not a task (decorate it with @task)")
    return found


# -- the workflow each task runs as -------------------------------------------------------------


def _register() -> None:
    """Declare the task workflow and its step function (once; the app does it when ``TASKS``
    names this backend)."""
    from django_leases.workflows import registry

    if registry.get_step_function(TASK_STEP_FUNCTION) is None:
        registry.step_function(TASK_STEP_FUNCTION)(_task_step)
    try:
        registry.get_workflow(TASK_WORKFLOW)
    except registry.UnknownWorkflowError:
        registry.workflow(TASK_WORKFLOW)(_task_run)


def _task_run(run: Any, input: dict[str, Any]) -> Any:
    """A task's run: its one step, in the task's queue at its priority; the output is the
    step's result (``{"value": …, "worker": …}``)."""
    return run.step(
        TASK_STEP,
        TASK_STEP_FUNCTION,
        input,
        retries=int(input.get("retries", 0)),
        retry_delay=float(input.get("retry_delay", 0.0)),
        priority=int(input.get("priority", 0)),
        queue=str(input.get("queue", "default")),
    )


def _task_step(data: dict[str, Any], ctx: Any) -> Any:
    """Call the task function for attempt ``ctx.attempt``, with the signals Django sends."""
    from django_leases.models import WorkflowRun, WorkflowStep

    backend = task_backends[data["backend"]]
    run = WorkflowRun.objects.get(pk=ctx.run_id)
    step = WorkflowStep.objects.filter(run_id=ctx.run_id, step_name=TASK_STEP).first()
    result = _result(backend, run, step)
    # The attempt that runs now is the live result's latest: its context's attempt is the
    # fencing attempt.
    worker_ids = list(result.worker_ids[: ctx.attempt - 1])
    worker_ids += [f"attempt {n}" for n in range(len(worker_ids) + 1, ctx.attempt)]
    worker_ids.append(_worker_id())
    object.__setattr__(result, "worker_ids", worker_ids)
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    task_started.send(type(backend), task_result=result)
    task = result.task
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *data["args"], **data["kwargs"])
        else:
            value = task.call(*data["args"], **data["kwargs"])
        check_json(value, "Task return value")
    except Exception as exc:
        raised = TaskRaised(exc)
        if ctx.attempt >= int(data.get("retries", 0)) + 1:
            result.errors.append(
                TaskError(
                    exception_class_path=raised.details["exception_class_path"],
                    traceback=raised.details["traceback"],
                )
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            task_finished.send(type(backend), task_result=result)
        raise raised from exc
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(backend), task_result=result)
    return {"value": value, "worker": _worker_id()}
