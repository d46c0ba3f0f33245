"""``demo-tick``: the workflow of a per-second schedule, to show that a tick starts one run
across every worker.

The demo's settings declare the schedule ``demo-tick`` (``DJANGO_LEASES["SCHEDULES"]``, cron
``* * * * * *``: six fields, seconds first; ``catch_up="none"``). The tour keeps it **paused**
(from its first stage, before any worker starts) and resumes it only for the stage that
watches a few ticks, so it starts no run during the other stages. Each run is keyed
``schedule:demo-tick:<tick>`` and has one journalled step, ``note`` (``journal.note_tick``),
that returns the pid of the worker that ran it.
"""

from __future__ import annotations

import os
from typing import Any

from demo_project.journal.steps import journalled
from django_leases.workflows import step_function, workflow

TICK_WORKFLOW = "demo-tick"
#: The schedule's name in ``DJANGO_LEASES["SCHEDULES"]``.
TICK_SCHEDULE = "demo-tick"


@step_function("journal.note_tick")
def note_tick(data: Any, ctx: Any) -> dict[str, Any]:
    """Journal this attempt; returns ``{"pid": <the worker process id>}``."""
    with journalled(ctx, TICK_WORKFLOW):
        return {"pid": os.getpid()}


@workflow(TICK_WORKFLOW)
def tick(run: Any, input: Any) -> Any:
    """One step per tick; the run's output is the step's result."""
    return run.step("note", "journal.note_tick", {})
