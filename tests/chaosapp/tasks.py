"""The task chaos test's ``@task`` (``tests/test_tasks_chaos.py``) and its ``task_finished``
count.

:func:`recorded` records each execution in the chaos execution table (the result's id as the
run, ``"task"`` as the step, the context's attempt, this worker's pid; see
:func:`~tests.chaosapp.workflows.record_execution`) and returns ``{"token", "attempt",
"pid"}``: a stored return value names the execution that produced it.

:func:`count_finished` — connected at start-up by the app's ``ready()`` in every worker
process — appends one line per ``task_finished`` (``<result id> <status> <pid>``) to the
file ``CHAOS_FINISHED_LOG`` names (nothing without it).
"""

from __future__ import annotations

import os
from typing import Any

from django_leases.tasks_api import TaskContext, task
from tests.chaosapp.config import TASK_BACKEND
from tests.chaosapp.workflows import record_execution


@task(takes_context=True, backend=TASK_BACKEND)
def recorded(context: TaskContext, n: int) -> dict[str, Any]:
    """Record this execution (attempt, pid), work a little; return what names it."""
    return record_execution(context.task_result.id, "task", context.attempt)


def count_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """Append ``<result id> <status> <pid>`` to ``CHAOS_FINISHED_LOG`` (if set)."""
    path = os.environ.get("CHAOS_FINISHED_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{task_result.id} {task_result.status} {os.getpid()}\n")
