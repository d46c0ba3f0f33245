"""``@task`` functions of the Django Tasks backend's tests (module level, so worker processes
import them by path). Django 6's ``django.tasks`` or the backport, whichever is installed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django_leases.tasks_api import TaskContext, task


@task
def add(a: int, b: int) -> int:
    """``a + b``."""
    return a + b


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The arguments it got, as JSON."""
    return {"args": list(args), "kwargs": kwargs}


@task
def explode(message: str) -> None:
    """Raise ``ValueError(message)``."""
    raise ValueError(message)


@task
def unjsonable() -> object:
    """Return a value that is not JSON."""
    return {1, 2}


@task
def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` levels deep (``[]`` is one level)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@task
def huge_float() -> float:
    """Return ``1e20``, a float PostgreSQL's ``jsonb`` would give back as an integer."""
    return 1e20


@task(takes_context=True, backend="retrying")
def flaky(context: TaskContext, fail_until: int) -> dict[str, Any]:
    """Fail on attempts before ``fail_until``; then return the attempt, the result's id and
    its worker ids as the context saw them."""
    if context.attempt < fail_until:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "worker_ids": list(context.task_result.worker_ids),
        "status": str(context.task_result.status),
    }


@task
async def async_double(n: int) -> int:
    """``2 * n``, from a coroutine function."""
    return 2 * n


@task(takes_context=True, backend="retrying")
def hold_first_attempt(context: TaskContext, marks: str) -> dict[str, int]:
    """On attempt 1: write ``<marks>/started`` and wait until ``<marks>/go`` exists (the test
    stops this worker meanwhile and has attempt 2 run elsewhere). Returns the attempt."""
    if context.attempt == 1:
        # Written whole, then renamed into place: the test reads it as soon as it exists.
        Path(marks, "started.tmp").write_text(str(os.getpid()))
        os.replace(Path(marks, "started.tmp"), Path(marks, "started"))
        while not Path(marks, "go").exists():
            time.sleep(0.02)
    return {"attempt": context.attempt}
