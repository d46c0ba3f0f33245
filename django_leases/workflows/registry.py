"""``@workflow`` and ``@step_function``: code-side registries, filled at import time.

Each installed app's ``workflows.py`` is imported when Django starts (see ``apps.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from django.utils.module_loading import import_string

from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_LENGTH, leases_settings, parse_queues
from django_leases.exceptions import UnknownWorkflowError
from django_leases.frozen import frozen
from django_leases.validation import check_name, check_priority
from django_leases.workflows.aio import is_async
from django_leases.workflows.schedules import (
    ScheduleDeclaration,
    declaration,
    from_settings,
    prune_from_settings,
)

__all__ = [
    "StepDeclaration",
    "UnknownWorkflowError",
    "declared_schedules",
    "get_step_function",
    "get_workflow",
    "one_step_output",
    "one_step_workflow",
    "prune_problems",
    "schedule_problems",
    "step_declaration",
    "step_function",
    "step_functions",
    "unregister_schedule",
    "workflow",
]

F = TypeVar("F", bound=Callable[..., Any])

_workflows: dict[str, Callable[..., Any]] = {}
_step_functions: dict[str, Callable[..., Any]] = {}
#: Schedules declared with ``@workflow(..., schedule=...)``, by workflow name.
_schedules: dict[str, ScheduleDeclaration] = {}


@frozen
class StepDeclaration:
    """What ``@step_function`` declared besides the callable: its ``queue`` (``str``),
    default ``priority`` (``int``; higher is claimed first) and whether it is
    ``transactional`` (``bool``: it runs in one transaction with its result's write)."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    transactional: bool = False


_step_options: dict[str, StepDeclaration] = {}


def _register(
    table: dict[str, Callable[..., Any]], kind: str, name: str, *, allow_async: bool = False
) -> Callable[[F], F]:
    check_name(name, f"A {kind} name")

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(
                f"@{kind.replace(' ', '_')}({name!r}) decorates a function, not "
                f"{type(func).__name__}"
            )
        if inspect.isasyncgenfunction(func):
            raise TypeError(
                f"@{kind.replace(' ', '_')}({name!r}) cannot register the async generator "
                f"function {getattr(func, '__qualname__', func)!r}: a {kind} returns its "
                "result (JSON); it does not yield"
            )
        if not allow_async and is_async(func):
            # A workflow function only orchestrates (run.step, run.sleep, …), replayed in passes
            # on a worker thread: it stays synchronous; its steps may be async.
            raise TypeError(
                f"@{kind.replace(' ', '_')}({name!r}) cannot register the coroutine function "
                f"{getattr(func, '__qualname__', func)!r}: {kind} functions only orchestrate "
                f"and are plain (synchronous) functions; make the work it awaits an "
                f"async def @step_function and call it with run.step()"
            )
        existing = table.get(name)
        if existing is not None and existing is not func:
            qualified = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"{kind} {name!r} is already registered by {qualified}")
        table[name] = func
        return func

    return decorate


#: Built-in workflows of one step whose output follows from that step's result, by name:
#: (step name, output function). See :func:`one_step_workflow`.
_one_step: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {}


def one_step_workflow(name: str, step_name: str, output: Callable[[Any, Any], Any]) -> None:
    """Declare that registered workflow ``name`` calls one step, ``step_name``, and returns
    ``output(run_id, result)`` once that step succeeds with ``result`` — what its function
    does, with no other effect — so a worker that ran the step from the queue may complete
    the run with its result in one write, without replaying it (the Django Tasks backend's
    workflow). ``output`` may raise only as the workflow would; it is called on the worker
    thread. Raises ``UnknownWorkflowError`` when ``name`` is not registered."""
    if name not in _workflows:
        raise UnknownWorkflowError(name)
    _one_step[name] = (step_name, output)


def one_step_output(name: str | None, step_name: str) -> Callable[[Any, Any], Any] | None:
    """The output function :func:`one_step_workflow` declared for a run of workflow
    ``name`` whose step ``step_name`` succeeded, or ``None`` (replay it)."""
    found = _one_step.get(name) if name is not None else None
    return found[1] if found is not None and found[0] == step_name else None


def workflow(
    name: str,
    *,
    schedule: str | None = None,
    timezone: str = "UTC",
    input: Any = None,
    catch_up: str = "latest",
    overlap: str = "skip",
) -> Callable[[F], F]:
    """Register a workflow function ``(run, input) -> JSON`` under ``name`` (a ``str`` of
    1–200 characters); the decorator returns the function unchanged.

    ``schedule``, a cron expression (``"*/5 * * * *"``, or six fields with the seconds first),
    also declares a schedule named ``name``: the workflow worker starts one run per tick,
    exactly once across every worker (:mod:`django_leases.workflows.schedules`). Its
    ``timezone`` (an IANA name, default ``"UTC"``), the runs' JSON ``input`` (default ``{}``)
    ``catch_up`` (``"latest"``: one run for ticks missed while no worker ran; ``"none"``)
    and ``overlap`` (what a tick does while the schedule's previous run is still live:
    ``"skip"``, the default, ``"buffer_one"``, ``"cancel_other"`` or ``"allow"``) go with
    it, and mean nothing without ``schedule``.

    Raises ``ValueError`` for a bad name or a name another function has, a bad cron
    expression, time zone, input, catch-up or overlap policy (before anything is
    registered), and
    ``TypeError`` (when decorating) for a non-callable or an ``async def`` function:
    workflow functions only orchestrate (their steps do the work) and run synchronously;
    make the awaiting an ``async def`` ``@step_function`` instead.
    """
    declared = None
    if schedule is not None:
        declared = declaration(
            name,
            name,
            schedule,
            timezone=timezone,
            input=input,
            catch_up=catch_up,
            origin="@workflow",
            overlap=overlap,
        )
    register = _register(_workflows, "workflow", name)
    if declared is None:
        return register

    def decorate(func: F) -> F:
        registered = register(func)
        _schedules[name] = declared
        return registered

    return decorate


def unregister_schedule(name: str) -> None:
    """Withdraw the ``@workflow`` schedule of workflow ``name`` (tests; no error if none)."""
    _schedules.pop(name, None)


def declared_schedules() -> list[ScheduleDeclaration]:
    """Every usable schedule declaration, sorted by name: the ``@workflow(schedule=...)``
    ones, those of ``DJANGO_LEASES["SCHEDULES"]`` whose name no decorator took and whose
    workflow is registered, and the built-in prune schedule of ``DJANGO_LEASES["PRUNE"]``
    when that is set and usable. The unusable ones are what system checks
    ``django_leases.E026`` (:func:`schedule_problems`) and ``django_leases.E031``
    (:func:`prune_problems`) report; they are left out here, never half-kept."""
    found, _, _ = _collect()
    return found


def schedule_problems() -> list[str]:
    """What is wrong with the declared schedules, one message each (check ``E026``): a bad
    ``SCHEDULES`` entry (cron, time zone, input, catch-up, overlap, keys), one whose workflow
    no code registers, one whose ``task`` path names no Django ``@task`` of a django-leases
    ``TaskBackend``, or whose name a ``@workflow`` schedule has already."""
    _, problems, _ = _collect()
    return problems


def prune_problems() -> list[str]:
    """What is wrong with ``DJANGO_LEASES["PRUNE"]``, one message each (check ``E031``):
    a missing or unknown key, a bad cron expression, ``older_than``, ``batch_size``, time
    zone or queue (one ``QUEUES`` does not configure), or a schedule of the code or of
    ``SCHEDULES`` named like the built-in one. ``[]`` when it is unset or fine."""
    _, _, problems = _collect()
    return problems


def _collect() -> tuple[list[ScheduleDeclaration], list[str], list[str]]:
    found = dict(_schedules)
    configured, problems = from_settings(leases_settings.SCHEDULES)
    for entry in configured:
        if entry.name in found:
            problems.append(
                f"Schedule {entry.name!r} (settings): the name is taken by the schedule of "
                f"@workflow({entry.name!r}); give the settings entry another name"
            )
        elif entry.task:
            problem = _task_problem(entry.task, entry.input)
            if problem:
                problems.append(f"Schedule {entry.name!r} (settings): {problem}")
            else:
                found[entry.name] = entry
        elif entry.workflow not in _workflows:
            problems.append(
                f"Schedule {entry.name!r} (settings): no loaded code registers workflow "
                f"{entry.workflow!r}, so it would never start a run"
            )
        else:
            found[entry.name] = entry
    try:
        queues: set[str] | None = set(parse_queues(leases_settings.QUEUES))
    except ValueError:
        queues = None  # E016 reports the setting; the prune's queue is not checked then
    prune, prune_problems = prune_from_settings(leases_settings.PRUNE, queues)
    if prune is not None and prune.name in found:
        taken = found[prune.name]
        where = (
            f"@workflow({taken.name!r})" if taken.origin == "@workflow" else "the SCHEDULES entry"
        )
        prune_problems.append(
            f'DJANGO_LEASES["PRUNE"]: the name of its schedule, {prune.name!r}, is taken by '
            f"{where}; rename that schedule"
        )
    elif prune is not None:
        found[prune.name] = prune
    return [found[name] for name in sorted(found)], problems, prune_problems


def _task_problem(path: str, arguments: Any = None) -> str:
    """What keeps ``path`` from being the task of a schedule whose runs' input is
    ``arguments`` (``{"args": [...], "kwargs": {...}}``) (``""``: nothing): it must import to
    a Django ``@task`` whose backend enqueues once per tick key (a django-leases
    ``TaskBackend``), and that backend must take it with those arguments
    (``TaskBackend.check_enqueue``: a queue it knows, a usable queue key argument, arguments
    that read back as written) — else every tick of it would fail to enqueue."""
    try:
        task = import_string(path)
    except ImportError as exc:
        return f"the task {path!r} cannot be imported: {exc}"
    if not (hasattr(task, "get_backend") and hasattr(task, "module_path")):
        return f"{path!r} is not a Django @task (a function decorated with @task)"
    try:
        backend = task.get_backend()
    except Exception as exc:  # an unknown backend alias: Django's own error
        return f"the backend of task {path!r} is not usable: {exc}"
    if not hasattr(backend, "enqueue_for_tick"):
        return (
            f"task {path!r} goes to backend {getattr(backend, 'alias', '?')!r}, not a "
            "django_leases.tasks.TaskBackend: only that backend enqueues a tick exactly once"
        )
    given = arguments if isinstance(arguments, dict) else {}
    try:
        backend.check_enqueue(task, given.get("args", []), given.get("kwargs", {}))
    except Exception as exc:  # InvalidTask, TaskArgumentsError, QueueConfigError: said
        return f"task {path!r} cannot be enqueued as declared: {exc}"
    return ""


def step_function(
    name: str, *, queue: str = DEFAULT_QUEUE, priority: int = 0, transactional: bool = False
) -> Callable[[F], F]:
    """Register a step function ``(data, ctx) -> JSON`` under ``name`` (a ``str`` of 1–200
    characters); the decorator returns the function unchanged.

    ``queue`` (``str``, default ``"default"``) is the queue its steps are claimed from: its
    limits come from ``DJANGO_LEASES["QUEUES"]`` (a queue not configured there is reported
    by system check ``django_leases.E023``), and ``run_workflow_worker --queue`` picks
    which workers take it. ``priority`` (``int``, default 0) is its steps' default priority:
    among due steps, higher is claimed first, first scheduled first within a priority
    (``run.step(..., priority=)`` overrides it per step).

    The function may be ``async def``: it is then awaited on the event loop of the worker
    thread that claimed its step (one loop per worker thread, reused across its steps;
    :mod:`django_leases.workflows.aio`), fenced to its attempt like a sync one. Its
    ``sync_to_async`` calls (Django's async ORM methods among them) run on that worker
    thread, on its connection.

    ``transactional=True`` runs each attempt inside one transaction on the run's database,
    and records its result **in that same transaction**, fenced to the attempt: the
    function's writes to that database land exactly when its result does. An attempt that
    raises, runs past its ``timeout`` or was superseded meanwhile commits nothing
    (:mod:`django_leases.workflows.transactional`). On SQLite the transaction holds the
    database's write lock while the function runs (check ``django_leases.W036``). A
    transactional step function is a plain ``def``.

    Raises ``ValueError`` for a bad name, queue, priority or ``transactional`` (not a
    ``bool``), or a name another function has, and ``TypeError`` (when decorating) for a
    non-callable, or an ``async def`` function declared ``transactional``.
    """
    check_name(queue, "A queue name", max_length=MAX_QUEUE_LENGTH)
    if not isinstance(transactional, bool):
        raise ValueError(f"transactional must be True or False, not {transactional!r}")
    options = StepDeclaration(queue, check_priority(priority), transactional)
    register = _register(_step_functions, "step function", name, allow_async=True)

    def decorate(func: F) -> F:
        if transactional and is_async(func):
            raise TypeError(
                f"@step_function({name!r}, transactional=True) cannot register the coroutine "
                f"function {getattr(func, '__qualname__', func)!r}: a transactional step runs "
                "in a transaction of its worker thread; make it a plain (synchronous) function"
            )
        registered = register(func)
        _step_options[name] = options
        return registered

    return decorate


def step_declaration(name: str) -> StepDeclaration:
    """The :class:`StepDeclaration` step function ``name`` was declared with; the defaults
    (queue ``"default"``, priority 0) for a name no code registers."""
    return _step_options.get(name, StepDeclaration())


def step_functions() -> dict[str, StepDeclaration]:
    """Every registered step function's name and :class:`StepDeclaration` (a copy)."""
    return {name: step_declaration(name) for name in _step_functions}


def get_workflow(name: str) -> Callable[..., Any]:
    """The workflow registered as ``name`` (a ``str``).

    Raises:
        UnknownWorkflowError: no workflow of that name is registered.
        ValueError: ``name`` is not a ``str`` (as for every name: :func:`check_name`).
    """
    if not isinstance(name, str):
        raise ValueError(f"A workflow name must be a str, not {type(name).__name__}")
    try:
        return _workflows[name]
    except KeyError:
        raise UnknownWorkflowError(name) from None


def get_step_function(name: str) -> Callable[..., Any] | None:
    """The step function registered as ``name``, or ``None`` (the run will be suspended)."""
    return _step_functions.get(name)
