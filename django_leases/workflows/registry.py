"""``@workflow`` and ``@step_function``: code-side registries, filled at import time.

Each installed app's ``workflows.py`` is imported when Django starts (see ``apps.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from django_leases.exceptions import UnknownWorkflowError
from django_leases.validation import check_name

__all__ = [
    "UnknownWorkflowError",
    "get_step_function",
    "get_workflow",
    "step_function",
    "workflow",
]

F = TypeVar("F", bound=Callable[..., Any])

_workflows: dict[str, Callable[..., Any]] = {}
_step_functions: dict[str, Callable[..., Any]] = {}


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


def step_function(name: str) -> Callable[[F], F]:
    """Register a step function ``(data, ctx) -> JSON`` under ``name`` (a ``str`` of 1–200
    characters); the decorator returns the function unchanged.

    Raises ``ValueError`` for a bad name or a name another function has, and ``TypeError``
    (when decorating) for a non-callable or an ``async def`` function: step functions run
    synchronously (on worker threads).
    """
    return _register(_step_functions, "step function", name)


def get_workflow(name: str) -> Callable[..., Any]:
    """The workflow registered as ``name``; raises :class:`UnknownWorkflowError`."""
    try:
        return _workflows[name]
    except KeyError:
        raise UnknownWorkflowError(name) from None


def get_step_function(name: str) -> Callable[..., Any] | None:
    """The step function registered as ``name``, or ``None`` (the run will be suspended)."""
    return _step_functions.get(name)
