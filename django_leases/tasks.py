"""``TaskBackend``: Django's Tasks framework over the fenced workflow engine (DESIGN §5b).

::

    TASKS = {
        "default": {
            "BACKEND": "django_leases.tasks.TaskBackend",
            "QUEUES": ["default", "mail"],
            "OPTIONS": {"retries": 3, "retry_delay": 5, "retry_backoff": 2},
        }
    }

Each enqueued ``@task`` is a run of the built-in workflow ``django_leases.task`` with one
step, ``task``, of the built-in step function ``django_leases.task``; ``run_workflow_worker``
claims it like any step: on the task's ``queue_name`` (the step's queue, under the limits of
``DJANGO_LEASES["QUEUES"]``), at the task's ``priority`` (the step's priority, unchanged:
Django's -100..100, higher first), due at ``run_after`` (the step's ``available_at``,
compared with the database clock). The result id is the run's id. Every attempt is fenced:
``TaskContext.attempt`` is the step's attempt number, and the return value of an attempt
that was superseded (its worker paused past its lease while another took the step over)
never lands.

The names of Django's API come from :mod:`django_leases.tasks_api` (``django.tasks`` on
Django 6, the ``django-tasks`` backport on Django 5.2).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core import checks
from django.core.signals import setting_changed
from django.db import connections, router
from django.dispatch import receiver
from django.utils import timezone
from django.utils.module_loading import import_string

from django_leases import db, signals
from django_leases.conf import queue_limits
from django_leases.exceptions import (
    QueueConfigError,
    TaskArgumentsError,
    TaskAttemptError,
    WorkflowStepFailedError,
)
from django_leases.models.timing import check_run_after
from django_leases.models.workflow import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from django_leases.tasks_api import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_leases.validation import (
    MAX_JSON_DEPTH,
    as_stored,
    check_json,
    check_queue_key,
    json_depth,
    seconds,
    traceback_text,
)
from django_leases.workflows.registry import one_step_workflow, step_function, workflow
from django_leases.workflows.values import (
    TASK_FUNCTION,
    TASK_STEP,
    TASK_WORKFLOW,
    AttemptStatus,
    RunStatus,
    StepOptions,
    StepStatus,
)

#: ``OPTIONS`` keys and their defaults: ``retries`` (int ≥ 0: attempts after the first),
#: ``retry_delay`` (seconds before the first retry), ``retry_backoff`` (the factor each
#: later delay is multiplied by; 1.0: constant), ``retry_delay_max`` (seconds no delay
#: exceeds; ``None``: one day), ``timeout`` (seconds an attempt may run, ``None``: no limit),
#: ``queue_key_kwarg`` (the name of the keyword argument whose value is a task's queue key;
#: ``None``: tasks have no queue key).
DEFAULT_OPTIONS: dict[str, Any] = {
    "retries": 0,
    "retry_delay": 0.0,
    "retry_backoff": 1.0,
    "retry_delay_max": None,
    "timeout": None,
    "queue_key_kwarg": None,
}

#: The exception class path of an error the engine itself recorded (a lost worker, a timeout,
#: a cancelled run) rather than one the task function raised.
ENGINE_ERROR_PATH = "django_leases.exceptions.WorkflowStepFailedError"


class TaskBackend(BaseTaskBackend):
    """A Django Tasks backend whose tasks run on ``run_workflow_worker`` as fenced one-step
    runs.

    ``params`` is the ``TASKS`` entry: ``QUEUES`` (the queue names tasks may use; Django
    refuses others with ``InvalidTask``) and ``OPTIONS`` — ``retries`` (``int`` ≥ 0,
    default 0: a task that raises is ``FAILED`` at once, as with Django's own backends),
    ``retry_delay`` (seconds before the first retry, default 0, at most 86 400),
    ``retry_backoff`` (a number ≥ 1, default 1.0: after attempt *n* fails the next is due
    ``retry_delay * retry_backoff ** (n - 1)`` seconds later), ``retry_delay_max`` (seconds,
    0 to 86 400, that no delay exceeds; default ``None``: one day) and ``timeout`` (seconds
    an attempt may run before it is failed and, attempts remaining, retried; default
    ``None``). The delays are counted on the database clock, without jitter.
    ``queue_key_kwarg`` (a keyword argument's name, default ``None``) gives tasks a queue key
    for a queue's per-key limits (``key_concurrency``, ``key_rate``, round-robin): a task
    enqueued with that keyword argument counts under its value (a ``str`` of 1–255
    characters, or an ``int``, as text); one without it has no key.

    Raises ``InvalidTaskBackend`` (an ``ImproperlyConfigured``) for unknown or bad options.
    """

    supports_defer = True
    supports_async_task = True  # the worker runs a coroutine function with async_to_sync
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if not isinstance(self.options or {}, Mapping):
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] must be a dict, not {self.options!r}"
            )
        options = dict(self.options or {})
        unknown = sorted(str(key) for key in options if key not in DEFAULT_OPTIONS)
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(DEFAULT_OPTIONS)}"
            )
        merged = {**DEFAULT_OPTIONS, **options}
        try:
            # The step's own checks (its options), so that a backend that builds can
            # enqueue. Each duration may be a timedelta here: the step's retry delays may not
            # (they are seconds), so those two are converted first.
            delay_max = merged["retry_delay_max"]
            step_options = StepOptions(
                retries=merged["retries"],
                retry_delay=seconds(merged["retry_delay"], "retry_delay"),
                retry_backoff=merged["retry_backoff"],
                retry_delay_max=seconds(delay_max, "retry_delay_max")
                if isinstance(delay_max, timedelta)
                else delay_max,
                timeout=merged["timeout"],  # seconds or a timedelta
            )
        except ValueError as exc:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from None
        key_kwarg = merged["queue_key_kwarg"]
        if key_kwarg is not None and (not isinstance(key_kwarg, str) or not key_kwarg):
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['queue_key_kwarg'] must be a keyword argument's "
                f"name (a non-empty str) or None, not {key_kwarg!r}"
            )
        #: The keyword argument whose value is a task's queue key (``None``: none).
        self.queue_key_kwarg: str | None = key_kwarg
        #: The options every task's step is created with (its queue and priority its own).
        self.step_options = step_options
        self.retries: int = step_options.retries
        self.retry_delay: float = step_options.retry_delay
        self.retry_backoff: float = step_options.retry_backoff
        self.retry_delay_max: float | None = step_options.retry_delay_max
        self.timeout: float | None = step_options.timeout

    # -- enqueueing ---------------------------------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks of ``task`` for this backend, then that its priority is an ``int``
        (Django takes ``True`` or ``1.0``) and its ``run_after`` falls within the years 1 to
        9999 in UTC. Django calls this when a task is built or ``using()`` changes it, and
        ``enqueue`` again.

        Raises:
            InvalidTask: the task is not valid here (nothing stored).
        """
        super().validate_task(task)
        priority = task.priority
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidTask(f"priority must be an int, not {priority!r}")
        try:
            check_run_after(task.run_after)
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None

    def _check_open_queue(self, task: Task[Any, Any]) -> None:
        """With ``QUEUES`` empty, Django lets a task name any queue: at enqueue, the engine
        takes only a queue ``DJANGO_LEASES["QUEUES"]`` configures (``"default"`` always is),
        so a typo never lands on a queue whose limits no worker knows. (With ``QUEUES`` set,
        Django checks the name against them, and system check E030 checks them.)

        Raises:
            InvalidTask: the queue is not configured (nothing stored).
            QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
        """
        if self.queues:
            return
        known = queue_limits()
        name = task.queue_name
        if not isinstance(name, str) or name not in known:
            raise InvalidTask(
                f"Queue {name!r} is not configured in DJANGO_LEASES['QUEUES'] "
                f"(known: {', '.join(sorted(known))}): no worker would know its limits"
            )

    def _queue_key(self, kwargs: Any) -> str | None:
        """The queue key of a task enqueued with ``kwargs`` (``OPTIONS["queue_key_kwarg"]``).

        Raises:
            InvalidTask: the argument is there but not a ``str`` of 1–255 characters or an
                ``int`` (nothing stored).
        """
        name = self.queue_key_kwarg
        if name is None or not isinstance(kwargs, Mapping) or name not in kwargs:
            return None
        value = kwargs[name]
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        try:
            return check_queue_key(value, f"Keyword argument {name!r} (the task's queue key)")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Store ``task`` with ``args`` (a sequence) and ``kwargs`` (a mapping) as a run due
        at its ``run_after`` (``None``: now) and return its ``READY`` result, whose ``id``
        is the run's id, on the database the router picks for the app's tables. Inside
        ``transaction.atomic()`` on that database the task is written in that transaction:
        workers see it (and ``task_enqueued`` is sent) once it commits; a rollback leaves
        nothing. A transaction on another database (the app's tables routed elsewhere) does
        not hold it: it is written at once, whatever becomes of that transaction.

        Raises:
            InvalidTask: the task is not valid for this backend (Django's checks: queue,
                priority, ``run_after``, a module-level function...; with ``QUEUES`` empty,
                a queue ``DJANGO_LEASES["QUEUES"]`` does not configure; a bad queue key
                argument, see ``OPTIONS["queue_key_kwarg"]``).
            TaskArgumentsError: the arguments are not JSON that reads back as written
                (nothing is stored).
        """
        result, _ = self._enqueue(task, args, kwargs, router.db_for_write(WorkflowRun), None)
        return result

    def enqueue_for_tick(
        self, task: Task[Any, Any], args: Any, kwargs: Any, *, key: str, using: str
    ) -> tuple[TaskResult[Any, Any], bool]:
        """Enqueue ``task`` for a schedule's tick: as :meth:`enqueue`, on database ``using``
        (the schedule's), with ``key`` (the tick key, ``str``) as the run's idempotency key,
        so a tick enqueues the task once however many callers fire it. Returns the result
        and whether this call stored it (``False``: the key's run existed, nothing written).

        Raises as :meth:`enqueue` does, and ``ValueError`` for a bad key.
        """
        return self._enqueue(task, args, kwargs, using, key)

    def check_enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> None:
        """What :meth:`enqueue` checks before it writes, asking no database: Django's checks
        of ``task``, its queue, the queue key argument, and that ``args`` (a sequence) and
        ``kwargs`` (a mapping) are JSON that reads back as written from every supported
        database (as PostgreSQL's ``jsonb`` does: ``1e20`` would come back an integer). A
        task schedule's arguments are checked so when it is declared (check ``E026``),
        before its row stores them and any tick enqueues them.

        Raises:
            InvalidTask: as :meth:`enqueue` raises it.
            TaskArgumentsError: the arguments are not JSON that reads back as written.
            QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
        """
        self._checked(task, args, kwargs, None)

    def _checked(
        self, task: Task[Any, Any], args: Any, kwargs: Any, alias: str | None
    ) -> tuple[list[Any], dict[str, Any], str | None]:
        """:meth:`check_enqueue` for database ``alias`` (``None``: any); returns the
        arguments as JSON and the queue key (``None``: none)."""
        self.validate_task(task)
        self._check_open_queue(task)
        args_json, kwargs_json = _json_arguments(task, args, kwargs, alias)
        return args_json, kwargs_json, self._queue_key(kwargs)

    def _enqueue(
        self, task: Task[Any, Any], args: Any, kwargs: Any, alias: str, key: str | None
    ) -> tuple[TaskResult[Any, Any], bool]:
        args_json, kwargs_json, queue_key = self._checked(task, args, kwargs, alias)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            # USE_TZ = False (Django refuses a naive one otherwise): in TIME_ZONE, whatever
            # zone a request activated.
            run_after = timezone.make_aware(run_after, timezone.get_default_timezone())

        data = {
            "task": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": None if run_after is None else run_after.isoformat(),
            "args": args_json,
            "kwargs": kwargs_json,
        }
        options = self.step_options.placed(task.queue_name, task.priority)
        if queue_key is not None:
            options = dataclasses.replace(options, queue_key=queue_key)
        run = WorkflowRun.objects.db_manager(alias).start_one_step(
            TASK_WORKFLOW,
            data,
            step_name=TASK_STEP,
            function_name=TASK_FUNCTION,
            options=options,
            available_at=run_after,
            key=key,
        )
        if not run.started:
            return self.get_result(str(run.id)), False
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(run.id),
            status=TaskResultStatus.READY,
            enqueued_at=run.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args_json,
            kwargs=kwargs_json,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        sender = type(self)
        db.after_commit(lambda: task_enqueued.send(sender=sender, task_result=result), alias)
        return result, True

    # -- results ------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result as stored now, by id (``str``): status, return value, errors
        (one per failed attempt: exception class path and traceback), ``worker_ids`` (one
        per attempt, ``""`` for one that never reported back — still running, or its worker
        lost) and the database-clock timestamps.

        Raises:
            TaskResultDoesNotExist: no task of that id (or not a valid id).
        """
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(f"No task result with id {result_id!r}") from None
        alias = router.db_for_write(WorkflowRun)
        run = WorkflowRun.objects.db_manager(alias).filter(pk=pk, workflow=TASK_WORKFLOW).first()
        if run is None:
            raise TaskResultDoesNotExist(f"No task result with id {result_id!r}")
        return _result_of(run)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """System check ``django_leases.E030``: each of the backend's ``QUEUES`` must be a
        queue of ``DJANGO_LEASES["QUEUES"]`` (``"default"`` always is), so every task lands
        on a queue workers know. Returns the messages (``[]``: fine)."""
        try:
            known = queue_limits()
        except QueueConfigError:
            return []  # E016 reports the setting itself
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] names queue {name!r}, which DJANGO_LEASES['QUEUES'] "
                "does not configure",
                hint=f'Add "{name}": {{}} (or its limits) to DJANGO_LEASES["QUEUES"].',
                id="django_leases.E030",
            )
            for name in sorted(self.queues)
            if name not in known
        ]


def start_scheduled_task(
    alias: str, path: str, args: list[Any], kwargs: dict[str, Any], key: str
) -> tuple[uuid.UUID, bool]:
    """Enqueue the ``@task`` at dotted ``path`` with ``args`` and ``kwargs`` for a schedule's
    tick, by its tick ``key``, on database ``alias`` (the schedules'
    ``TaskStarter``): ``(the task run's id, whether this call enqueued it)``.

    Raises ``ImportError`` / ``TypeError`` when ``path`` names no ``@task``, ``TypeError``
    when its backend is not a :class:`TaskBackend`, and what :meth:`TaskBackend.enqueue`
    raises."""
    task = import_string(path)
    if not isinstance(task, Task):
        raise TypeError(f"{path!r} is not a Django @task")
    backend = task.get_backend()
    if not isinstance(backend, TaskBackend):
        raise TypeError(
            f"task {path!r} goes to backend {backend.alias!r}, not a "
            "django_leases.tasks.TaskBackend"
        )
    result, started = backend.enqueue_for_tick(task, args, kwargs, key=key, using=alias)
    return uuid.UUID(result.id), started


# -- what runs on the worker ---------------------------------------------------------------------


@workflow(TASK_WORKFLOW)
def task_workflow(run: Any, input: Any) -> Any:
    """The built-in workflow of a task: its one step's return value (the step is created
    with the run by :meth:`TaskBackend.enqueue`)."""
    try:
        outcome = run.step(TASK_STEP, TASK_FUNCTION, input, retries=0)
    except WorkflowStepFailedError:
        _ending_here(run.id)
        raise
    return _task_output(run.id, outcome)


def _task_output(run_id: uuid.UUID, outcome: Any) -> Any:
    """The task workflow's output once its step returned ``outcome``: the task's return
    value (the run's end is then noted as this thread's, for ``task_finished``)."""
    _ending_here(run_id)
    return outcome.get("return_value") if isinstance(outcome, Mapping) else outcome


# A worker completes a task's run with its step's result, in the write of that result.
one_step_workflow(TASK_WORKFLOW, TASK_STEP, _task_output)


#: Per thread: the task runs whose workflow returned or raised on this thread (the pass that
#: ends the run), so that a run's completion or failure read as a task's costs a query only
#: for task runs — every other workflow run's end is told apart without one.
_ending = threading.local()
_ENDING_KEPT = 1_000


def _ending_here(run_id: uuid.UUID) -> None:
    ending: set[uuid.UUID] = getattr(_ending, "runs", None) or set()
    if len(ending) >= _ENDING_KEPT:  # passes whose end never committed (fenced): forget them
        ending.clear()
    ending.add(run_id)
    _ending.runs = ending


def _was_ending_here(run_id: uuid.UUID) -> bool:
    ending: set[uuid.UUID] | None = getattr(_ending, "runs", None)
    if not ending or run_id not in ending:
        return False
    ending.discard(run_id)
    return True


def _started_here(run_id: uuid.UUID, live: TaskResult[Any, Any] | None) -> None:
    """Keep (or, with ``None``, forget) the live result of the first attempt of task run
    ``run_id`` that this thread is running, built from its claim: when that attempt's result
    completes the run here, ``task_finished`` is sent from it without re-reading the run."""
    started: dict[uuid.UUID, TaskResult[Any, Any]] = getattr(_ending, "started", None) or {}
    started.pop(run_id, None)
    if live is not None:
        if len(started) >= _ENDING_KEPT:  # attempts whose run ended elsewhere: forget them
            started.clear()
        started[run_id] = live
    _ending.started = started


def _was_started_here(run_id: uuid.UUID) -> TaskResult[Any, Any] | None:
    started: dict[uuid.UUID, TaskResult[Any, Any]] | None = getattr(_ending, "started", None)
    return None if not started else started.pop(run_id, None)


@step_function(TASK_FUNCTION)
def run_task(data: Any, ctx: Any) -> dict[str, Any]:
    """The built-in step function of a task: import the ``@task`` by its module path, send
    ``task_started``, call it (a coroutine function through ``async_to_sync``; with a
    ``TaskContext`` first when it ``takes_context``, whose ``attempt`` is ``ctx.attempt``)
    and return ``{"return_value": ..., "worker_id": ...}``.

    Raises :class:`TaskAttemptError` (carrying the exception's class path, traceback and
    the worker id) when the task raises or returns a value that is not JSON, or cannot be
    imported (its path names no task now, or its backend left ``TASKS``).
    """
    worker_id = worker_identity()
    try:
        backend = task_backends[data["backend"]]
        task = _task_of(data)
    except Exception as exc:  # the task is gone from the code, or its backend from TASKS
        raise TaskAttemptError(exc, traceback_text(exc), worker_id) from exc

    if ctx.attempt == 1 and ctx.started_at is not None and ctx.run_created_at is not None:
        live = _first_attempt_result(task, ctx, data, worker_id)
        _started_here(ctx.run_id, live)
    else:  # earlier attempts' errors and workers are read back
        _started_here(ctx.run_id, None)
        run = WorkflowRun.objects.db_manager(ctx.using).get(pk=ctx.run_id)
        live = _result_of(run, task=task, running=(ctx.attempt, worker_id))
    task_started.send(sender=type(backend), task_result=live)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=live), *data["args"], **data["kwargs"])
        else:
            value = task.call(*data["args"], **data["kwargs"])
        value = _json_value(value, f"The return value of task {task.module_path}", ctx.using)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # this attempt's failure: recorded with what Django shows
        raise TaskAttemptError(exc, traceback_text(exc), worker_id) from exc
    return {"return_value": value, "worker_id": worker_id}


def _first_attempt_result(
    task: Task[Any, Any], ctx: Any, data: Mapping[str, Any], worker_id: str
) -> TaskResult[Any, Any]:
    """The live ``RUNNING`` result of a task's first attempt, from what its claim read back
    (``ctx.run_created_at``, ``ctx.started_at``): what :func:`_result_of` reads from the
    tables for it, without reading them."""
    return TaskResult(
        task=task,
        id=str(ctx.run_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=ctx.run_created_at,
        started_at=ctx.started_at,
        finished_at=None,
        last_attempted_at=ctx.started_at,
        args=data["args"],
        kwargs=data["kwargs"],
        backend=data["backend"],
        errors=[],
        worker_ids=[worker_id],
    )


def _first_attempt_finished(
    live: TaskResult[Any, Any], finished_at: datetime | None, value: Any
) -> TaskResult[Any, Any]:
    """The ``SUCCESSFUL`` result of a task whose first attempt (``live``, its ``RUNNING``
    result) returned ``value`` and completed the run at ``finished_at``: what
    :func:`_result_of` reads from the tables then."""
    result = dataclasses.replace(
        live,
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=finished_at,
        worker_ids=list(live.worker_ids),
    )
    object.__setattr__(result, "_return_value", value)
    return result


def worker_identity() -> str:
    """This worker thread's id in ``TaskResult.worker_ids``: ``"<host>:<pid>:<thread>"``
    (a ``str`` of at most 64 characters)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{threading.get_native_id()}"[:64]


def _task_finished(
    sender: Any, run_id: uuid.UUID, using: str, signal: Any = None, **kwargs: Any
) -> None:
    """Send Django's ``task_finished`` once a task's run ends (after its commit).

    A run completes or fails in the thread whose pass ran its workflow: one the task
    workflow did not mark there is no task's, and costs no query. A cancel (an operator's,
    anywhere) is looked up. A run completed after a first attempt that ran on this thread
    (and was its last) is told from that attempt's live result and its end: read back by
    the write that completed it (``finished_at``), else in one query."""
    if signal is not signals.run_cancelled and not _was_ending_here(run_id):
        return
    live = _was_started_here(run_id)
    finished_at = kwargs.get("finished_at")
    if live is not None and signal is signals.run_completed and finished_at is not None:
        # The first attempt's result completed the run here, in one write that read back
        # the run's end (the attempt's too: the same database instant).
        backend = task_backends[live.backend]
        done = _first_attempt_finished(live, finished_at, kwargs["output"])
        task_finished.send(sender=type(backend), task_result=done)
        return
    if live is not None and signal is signals.run_completed and "output" in kwargs:
        # The first attempt was the last: its end, or the run's (as _result_of reads them).
        found = (
            WorkflowStepAttempt.objects.db_manager(using)
            .filter(
                step__run_id=run_id,
                step__step_name=TASK_STEP,
                step__attempt=1,
                step__run__status=RunStatus.COMPLETED,
                attempt=1,
            )
            .values_list("finished_at", "step__run__finished_at")
            .first()
        )
        if found is not None:
            backend = task_backends[live.backend]
            done = _first_attempt_finished(live, found[0] or found[1], kwargs["output"])
            task_finished.send(sender=type(backend), task_result=done)
            return
    run = WorkflowRun.objects.db_manager(using).filter(pk=run_id, workflow=TASK_WORKFLOW).first()
    if run is None:
        return
    backend = task_backends[run.input["backend"]]
    task_finished.send(sender=type(backend), task_result=_result_of(run))


for _signal in (signals.run_completed, signals.run_failed, signals.run_cancelled):
    _signal.connect(_task_finished, dispatch_uid=f"django_leases.tasks.{id(_signal)}")


# -- reading --------------------------------------------------------------------------------------


#: The tasks :func:`_task_of` built, by what a run stores of them, each beside the task its
#: path named then: a ``Task`` is immutable, and building one validates it again (Django
#: inspects the function's signature), which would cost every task run as much as the rest
#: of its Python. The path is still imported each time (a dictionary lookup once imported),
#: so a replaced task (a reload, a test's patch) is built anew. Emptied when full and when
#: ``TASKS`` changes (the validation depends on the backend's queues).
_tasks: dict[tuple[Any, ...], tuple[Task[Any, Any], Task[Any, Any]]] = {}
_TASKS_KEPT = 1_000


def _task_of(data: Mapping[str, Any]) -> Task[Any, Any]:
    """The ``@task`` a run stores, with the queue, priority and ``run_after`` it was enqueued
    with. Raises ``ImportError`` / ``TypeError`` if the path names no task any more (or
    Django's ``InvalidTask`` if it is no longer valid for its backend)."""
    imported = import_string(data["task"])
    if not isinstance(imported, Task):
        raise TypeError(f"{data['task']} is not a task (a @task function)")
    run_after = data.get("run_after")
    key = (data["task"], data["priority"], data["queue_name"], run_after, data["backend"])
    kept = _tasks.get(key)
    if kept is not None and kept[0] is imported:
        return kept[1]
    found = imported.using(
        priority=data["priority"],
        queue_name=data["queue_name"],
        run_after=None if run_after is None else datetime.fromisoformat(run_after),
        backend=data["backend"],
    )
    if len(_tasks) >= _TASKS_KEPT:
        _tasks.clear()
    _tasks[key] = (imported, found)
    return found


@receiver(setting_changed)
def _forget_tasks(setting: str, **kwargs: Any) -> None:
    """Build tasks anew once ``TASKS`` changes (tests' ``override_settings``)."""
    if setting == "TASKS":
        _tasks.clear()


def _result_of(
    run: Any, *, task: Task[Any, Any] | None = None, running: tuple[int, str] | None = None
) -> TaskResult[Any, Any]:
    """The ``TaskResult`` of task run ``run`` as stored; ``running=(attempt, worker_id)``:
    as the worker running that attempt sees it (``RUNNING``, ``attempt`` worker ids)."""
    data = run.input
    step = run.steps.filter(step_name=TASK_STEP).first()
    rows = (
        []
        if step is None
        else list(WorkflowStepAttempt.objects.db_manager(run._state.db).filter(step=step))
    )
    by_attempt = {row.attempt: row for row in rows}
    count = max(by_attempt, default=0)
    if running is not None:
        count = running[0]
    worker_ids = [_worker_of(by_attempt.get(n)) for n in range(1, count + 1)]
    if running is not None:
        worker_ids[-1] = running[1]
    errors = [
        _task_error(row.error)
        for n, row in sorted(by_attempt.items())
        if row.status == AttemptStatus.FAILED and isinstance(row.error, Mapping) and n <= count
    ]
    exhausted = step is not None and step.attempt >= step.max_attempts
    if running is not None:
        status = TaskResultStatus.RUNNING
    elif run.status == RunStatus.COMPLETED:
        status = TaskResultStatus.SUCCESSFUL
    elif run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        status = TaskResultStatus.FAILED
    elif (
        run.status == RunStatus.SUSPENDED  # waits for an operator's resume: not finished
        or step is None
        or step.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
    ):
        status = TaskResultStatus.READY
    elif step.status == StepStatus.SUCCEEDED:
        status = TaskResultStatus.SUCCESSFUL
    elif step.status == StepStatus.RUNNING:
        status = TaskResultStatus.RUNNING
    else:
        status = TaskResultStatus.FAILED if exhausted else TaskResultStatus.READY
    if status == TaskResultStatus.FAILED and not errors:
        recorded = (step.error if step is not None else None) or run.error or {}
        errors.append(_task_error(recorded if isinstance(recorded, Mapping) else {}))
    ordered = [by_attempt[n] for n in sorted(by_attempt)]
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    finished_at = None
    if finished:
        finished_at = (ordered[-1].finished_at if ordered else None) or run.finished_at
    result: TaskResult[Any, Any] = TaskResult(
        task=task if task is not None else _task_of(data),
        id=str(run.id),
        status=status,
        enqueued_at=run.created_at,
        started_at=ordered[0].started_at if ordered else None,
        finished_at=finished_at,
        last_attempted_at=ordered[-1].started_at if ordered else None,
        args=data["args"],
        kwargs=data["kwargs"],
        backend=data["backend"],
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        outcome = step.result if step is not None else None
        value = outcome.get("return_value") if isinstance(outcome, Mapping) else run.output
        object.__setattr__(result, "_return_value", value)
    return result


def _worker_of(row: Any) -> str:
    """The worker id an attempt row reported with its outcome, or ``""``."""
    if row is None:
        return ""
    for recorded in (row.result, row.error):
        if isinstance(recorded, Mapping) and isinstance(recorded.get("worker_id"), str):
            return str(recorded["worker_id"])
    return ""


def _task_error(error: Mapping[str, Any]) -> TaskError:
    """A ``TaskError`` from an attempt's (or the run's) error record."""
    path = error.get("exception_class_path")
    trace = error.get("traceback")
    if isinstance(path, str) and isinstance(trace, str):
        return TaskError(exception_class_path=path, traceback=trace)
    code = error.get("code")
    described = f"{error.get('type') or 'Error'}: {error.get('message', '')}"
    if code:
        described += f" (code {code})"
    return TaskError(exception_class_path=ENGINE_ERROR_PATH, traceback=described)


# -- JSON ------------------------------------------------------------------------------------------


def _json_value(value: Any, what: str, alias: str | None) -> Any:
    """``value`` as Django normalises task JSON (tuples to lists, bytes to text), checked
    to read back exactly as written from database ``alias`` once stored (PostgreSQL's
    ``jsonb`` gives ``1e+20`` back as an integer and ``-0.0`` as ``0.0``), and to nest at
    most one level less than the database stores (:func:`~django_leases.validation.json_depth`: 100
    levels, 31 on MariaDB), as it is stored one level down: under ``"args"`` / ``"kwargs"``
    of the step's data, ``"return_value"`` of its result. ``alias`` ``None``: with no
    database at hand, as PostgreSQL reads it back (the strictest), within the package's
    nesting limit. Raises :class:`TaskArgumentsError`."""
    try:
        normal = normalize_json(value)
        if alias is None:
            check_json(normal, what, max_depth=MAX_JSON_DEPTH - 1)
        else:
            check_json(normal, what, max_depth=json_depth(connections[alias]) - 1, using=alias)
        written = _json_text(normal)
        # Not so for an int key, say (it reads back "1"); then what the database gives back.
        same = json.loads(written) == normal
        if not same:
            stored = None
        elif alias is None:
            stored = as_stored(normal)
        else:
            stored = WorkflowStep.objects.db_manager(alias).stored_json(normal)
    except RecursionError:
        raise TaskArgumentsError(f"{what} must be JSON: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        said = str(exc)  # check_json's own message names ``what`` already
        if not said.startswith(what):
            said = f"{what} must be JSON (read back as written): {said}"
        raise TaskArgumentsError(said) from None
    if not same:
        raise TaskArgumentsError(f"{what} does not read back from JSON as written")
    read_back = _json_text(stored)
    if read_back != written:
        raise TaskArgumentsError(
            f"{what} does not read back as written once stored (the database gives "
            f"{read_back[:200]} for {written[:200]}): pass such numbers as strings"
        )
    return normal


def _json_text(value: Any) -> str:
    """JSON ``value`` as text that tells apart what reads back differently (an ``int`` from a
    ``float``, ``-0.0`` from ``0.0``), object keys in one order."""
    return json.dumps(value, allow_nan=False, sort_keys=True)


def _json_arguments(
    task: Task[Any, Any], args: Iterable[Any], kwargs: Mapping[str, Any], alias: str | None
) -> tuple[list[Any], dict[str, Any]]:
    """The task's arguments as JSON for database ``alias`` (``None``: any, as
    :func:`_json_value` says); raises :class:`TaskArgumentsError` (nothing stored)."""
    what = f"The arguments of task {task.module_path}"
    return _json_value(list(args), what, alias), _json_value(dict(kwargs), what, alias)


__all__ = [
    "DEFAULT_OPTIONS",
    "TASK_FUNCTION",
    "TASK_STEP",
    "TASK_WORKFLOW",
    "TaskBackend",
    "run_task",
    "start_scheduled_task",
    "task_workflow",
    "worker_identity",
]
