"""``demo-tick``: a per-second schedule, to show a tick starts one run across every worker.

``@workflow("demo-tick", schedule="* * * * * *")`` (six fields, seconds first) would start a
run every second; the tour keeps it **paused** (``workflow_schedules pause demo-tick`` before
its workers start) and resumes it only for the stage that watches a few ticks, so the
schedule starts no run during the other stages. Each run is keyed ``schedule:demo-tick:<tick>``
and has one journalled step, ``note`` (``journal.note_tick``), that returns the pid of the
worker that ran it.
"""

from __future__ import annotations

import os
from typing import Any

from demo_project.journal.steps import journalled
from django_leases.workflows import step_function, workflow

TICK_WORKFLOW = "demo-tick"
#: The schedule's name: a ``@workflow`` schedule is named after its workflow.
TICK_SCHEDULE = TICK_WORKFLOW


@step_function("journal.note_tick")
def note_tick(data: Any, ctx: Any) -> dict[str, Any]:
    """Journal this attempt; returns ``{"pid": <the worker process id>}``."""
    with journalled(ctx, TICK_WORKFLOW):
        return {"pid": os.getpid()}


@workflow(TICK_WORKFLOW, schedule="* * * * * *", catch_up="none")
def tick(run: Any, input: Any) -> Any:
    """One step per tick; the run's output is the step's result."""
    return run.step("note", "journal.note_tick", {})
