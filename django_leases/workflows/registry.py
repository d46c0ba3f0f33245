"""``@workflow`` and ``@step_function``: code-side registries, filled at import time.

Each installed app's ``workflows.py`` is imported when Django starts (see ``apps.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_LENGTH
from django_leases.exceptions import UnknownWorkflowError
from django_leases.validation import check_name

__all__ = [
    "StepOptions",
    "UnknownWorkflowError",
    "check_priority",
    "get_step_function",
    "get_workflow",
    "step_function",
    "step_functions",
    "step_options",
    "workflow",
]

F = TypeVar("F", bound=Callable[..., Any])

_workflows: dict[str, Callable[..., Any]] = {}
_step_functions: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class StepOptions:
    """What ``@step_function`` declared besides the callable: its ``queue`` (``str``) and
    default ``priority`` (``int``; higher is claimed first)."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0


_step_options: dict[str, StepOptions] = {}


def _register(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[[F], F]:
    check_name(name, f"A {kind} name")

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(
                f"@{kind.replace(' ', '_')}({name!r}) decorates a function, not "
                f"{type(func).__name__}"
            )
        if inspect.iscoroutinefunction(func):
            # The engine calls it synchronously: every run would get a coroutine, never awaited.
            raise TypeError(
                f"@{kind.replace(' ', '_')}({name!r}) cannot register the coroutine function "
                f"{func.__qualname__}: {kind}s are plain functions, run synchronously"
            )
        existing = table.get(name)
        if existing is not None and existing is not func:
            qualified = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"{kind} {name!r} is already registered by {qualified}")
        table[name] = func
        return func

    return decorate


def workflow(name: str) -> Callable[[F], F]:
    """Register a workflow function ``(run, input) -> JSON`` under ``name`` (a ``str`` of
    1–200 characters); the decorator returns the function unchanged.

    Raises ``ValueError`` for a bad name or a name another function has, and ``TypeError``
    (when decorating) for a non-callable or an ``async def`` function: workflows run
    synchronously.
    """
    return _register(_workflows, "workflow", name)


def check_priority(priority: object, what: str = "priority") -> int:
    """A step priority: an ``int`` (not ``bool``) between -2**31 and 2**31-1; returns it.
    Raises ``ValueError`` otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"{what} must be an integer, not {priority!r}")
    if not -(2**31) <= priority < 2**31:
        raise ValueError(f"{what} must be between -2**31 and 2**31-1, not {priority}")
    return priority


def step_function(name: str, *, queue: str = DEFAULT_QUEUE, priority: int = 0) -> Callable[[F], F]:
    """Register a step function ``(data, ctx) -> JSON`` under ``name`` (a ``str`` of 1–200
    characters); the decorator returns the function unchanged.

    ``queue`` (``str``, default ``"default"``) is the queue its steps are claimed from: its
    limits come from ``DJANGO_LEASES["QUEUES"]`` (a queue not configured there is reported
    by system check ``django_leases.E023``), and ``run_workflow_worker --queue`` picks
    which workers take it. ``priority`` (``int``, default 0) is its steps' default priority:
    among due steps, higher is claimed first, first scheduled first within a priority
    (``run.step(..., priority=)`` overrides it per step).

    Raises ``ValueError`` for a bad name, queue or priority, or a name another function
    has, and ``TypeError`` (when decorating) for a non-callable or an ``async def``
    function: step functions run synchronously (on worker threads).
    """
    check_name(queue, "A queue name", max_length=MAX_QUEUE_LENGTH)
    options = StepOptions(queue, check_priority(priority))
    register = _register(_step_functions, "step function", name)

    def decorate(func: F) -> F:
        registered = register(func)
        _step_options[name] = options
        return registered

    return decorate


def step_options(name: str) -> StepOptions:
    """The :class:`StepOptions` step function ``name`` was declared with; the defaults
    (queue ``"default"``, priority 0) for a name no code registers."""
    return _step_options.get(name, StepOptions())


def step_functions() -> dict[str, StepOptions]:
    """Every registered step function's name and :class:`StepOptions` (a copy)."""
    return {name: step_options(name) for name in _step_functions}


def get_workflow(name: str) -> Callable[..., Any]:
    """The workflow registered as ``name``; raises :class:`UnknownWorkflowError`."""
    try:
        return _workflows[name]
    except KeyError:
        raise UnknownWorkflowError(name) from None


def get_step_function(name: str) -> Callable[..., Any] | None:
    """The step function registered as ``name``, or ``None`` (the run will be suspended)."""
    return _step_functions.get(name)
