"""Pruning finished runs on a schedule: ``DJANGO_LEASES["PRUNE"]``.

Retention without a cron job or timer of its own: the setting declares the built-in schedule
``django_leases.prune`` (:func:`~django_leases.workflows.schedules.prune_from_settings`),
which the workflow workers fire like any schedule — one run per tick, exactly once across
every worker, keyed by the tick — and each run is the built-in workflow
``django_leases.prune``: one step that calls ``WorkflowRun.objects.prune(older_than,
batch_size=...)`` and whose result, the run's output, is ``{"deleted": <runs deleted>}``::

    from datetime import timedelta

    DJANGO_LEASES = {
        "PRUNE": {
            "schedule": "17 * * * *",            # a cron expression: hourly at :17
            "older_than": timedelta(days=30),    # or seconds
            "batch_size": 500,                   # runs per transaction (default 500)
            "timezone": "UTC",                   # of the schedule (default "UTC")
            "queue": "default",                  # of the prune step (default "default")
        },
    }

What operators see and can do: the schedule is listed, paused and resumed like any other
(admin **Workflow schedules**, ``manage.py workflow_schedules``), its input is the prune's
arguments, and each tick's run (the schedule's *last run*) shows what it deleted.

Why this is safe to leave running:

* ``prune`` deletes in transactions of ``batch_size`` runs, so a large backlog never holds
  one long transaction, and never touches a running or suspended run, a run whose lease is
  live, or a child whose parent may still read it. The prune's own run is ``running`` while
  its step prunes, so it never deletes itself; earlier prune runs go once they are older than
  ``older_than``, like any finished run.
* The schedule's ``catch_up`` is ``"latest"``: after downtime that missed ticks, **one**
  catch-up prune runs when a worker returns, not one per missed tick.
* The step may be retried (:data:`PRUNE_RETRIES` more attempts, :data:`PRUNE_RETRY_DELAY`
  seconds apart, e.g. after a deadlock): a prune done twice deletes nothing twice. A prune
  that outlasts the interval between ticks overlaps the next tick's; the two wait for each
  other's batch locks and delete each run once (the outputs add up to what went).
* Removing the setting stops the pruning: the schedule's row becomes undeclared and starts
  nothing more. The workflow and its step function stay registered, so a run already
  started still finishes.

This module is imported by the app's ``ready()``: the built-in workflow and step function are
registered in every process, whatever the settings say.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django_leases.conf import DEFAULT_QUEUE
from django_leases.models.workflow import WorkflowRun
from django_leases.workflows.registry import step_function, workflow
from django_leases.workflows.schedules import (
    PRUNE_DEFAULTS,
    PRUNE_FUNCTION,
    PRUNE_STEP,
    PRUNE_WORKFLOW,
)

__all__ = ["PRUNE_RETRIES", "PRUNE_RETRY_DELAY", "prune_finished_runs", "prune_workflow"]

logger = logging.getLogger("django_leases.workflows")

#: Attempts of the prune step beyond the first (a prune is safe to repeat).
PRUNE_RETRIES = 3
#: Seconds between two attempts of the prune step.
PRUNE_RETRY_DELAY = 30.0


@workflow(PRUNE_WORKFLOW)
def prune_workflow(run: Any, input: Any) -> Any:
    """The built-in workflow of a prune tick: one step, :data:`PRUNE_STEP`, running
    :func:`prune_finished_runs` on the run's ``input`` (``{"older_than": seconds,
    "batch_size": n, "queue": name}``, from the schedule) on that queue. Returns the step's
    result, ``{"deleted": n}``, as the run's output.

    Raises ``WorkflowStepFailedError`` when the step failed on its last attempt (the run
    fails, with the step's error for operators to read).
    """
    data = dict(input) if isinstance(input, Mapping) else {}
    queue = data.get("queue") or DEFAULT_QUEUE
    return run.step(
        PRUNE_STEP,
        PRUNE_FUNCTION,
        data,
        retries=PRUNE_RETRIES,
        retry_delay=PRUNE_RETRY_DELAY,
        queue=queue,
    )


@step_function(PRUNE_FUNCTION)
def prune_finished_runs(data: Any, ctx: Any) -> dict[str, int]:
    """The built-in prune step: ``WorkflowRun.objects.prune(data["older_than"],
    batch_size=data["batch_size"])`` (``older_than`` in seconds, ``batch_size`` in runs,
    default 500) on the router's database for runs. Returns ``{"deleted": n}``, the number
    of runs deleted.

    Raises ``ValueError`` for data without a usable ``older_than`` or ``batch_size`` (a
    schedule row edited by hand), and the database's errors; the step is retried then.
    """
    values = data if isinstance(data, Mapping) else {}
    if "older_than" not in values:
        raise ValueError("the prune step's data has no 'older_than'")
    older_than = values["older_than"]
    batch_size = values.get("batch_size", PRUNE_DEFAULTS["batch_size"])
    deleted = WorkflowRun.objects.prune(older_than, batch_size=batch_size)
    logger.info(
        "Pruned %d workflow run(s) finished more than %s s ago (run %s)",
        deleted,
        older_than,
        ctx.run_id,
    )
    return {"deleted": deleted}
