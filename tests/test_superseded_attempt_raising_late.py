"""A superseded attempt that *raises* late, while the next attempt still runs.

Rule: attempt 1 (sync or async), paused past its step lease while attempt 2 claimed the step
and is still running, then raising, is refused by the fence: the step stays ``running`` at
attempt 2 (no failure recorded, no retry consumed, no third attempt due), and attempt 2's
result then lands as the step's.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import execute_step
from tests.helpers import lapse_step_lease, start_thread, tuned_sql

_gates: dict[str, threading.Event] = {}


@step_function("late-raise.async")
async def late_raise_async(data: dict[str, Any], ctx: Any) -> str:
    _gates[data["started"]].set()
    await asyncio.to_thread(_gates[data["gate"]].wait, 60)
    raise RuntimeError(f"attempt {ctx.attempt} raises late")


@step_function("late-raise.sync")
def late_raise_sync(data: dict[str, Any], ctx: Any) -> str:
    _gates[data["started"]].set()
    _gates[data["gate"]].wait(60)
    raise RuntimeError(f"attempt {ctx.attempt} raises late")


@workflow("late-raise.one")
def late_one(run: Any, input: Any) -> Any:
    return run.step("only", input["function"], input["data"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tuned", [True, False])
@pytest.mark.parametrize("function", ["late-raise.async", "late-raise.sync"])
def test_a_superseded_attempt_raising_late_changes_nothing(tuned: bool, function: str) -> None:
    started, gate = uuid.uuid4().hex, uuid.uuid4().hex
    _gates[started], _gates[gate] = threading.Event(), threading.Event()
    data = {"started": started, "gate": gate}
    try:
        with tuned_sql(tuned):
            run = WorkflowRun.objects.start("late-raise.one", {"function": function, "data": data})
            WorkflowStep.objects.schedule(run.id, "only", function, data, retries=1)
            stale = WorkflowStep.objects.claim_for_execution(run.id, "only", function, 60)
            assert stale is not None and stale.attempt == 1
            outcome: list[str] = []
            first = start_thread(lambda: outcome.append(execute_step(stale)))
            assert _gates[started].wait(60)
            lapse_step_lease(run_id=run.id, step_name="only")
            current = WorkflowStep.objects.claim_for_execution(run.id, "only", function, 60)
            assert current is not None and current.attempt == 2
            _gates[gate].set()
            first.join(60)
            assert not first.is_alive()
            assert outcome == ["superseded"]
            step = WorkflowStep.objects.get(pk=current.step_id)
            assert (step.status, step.attempt, step.error) == ("running", 2, None)
            # No third attempt can be claimed while attempt 2's lease lives.
            assert WorkflowStep.objects.claim_for_execution(run.id, "only", function, 60) is None
            WorkflowStep.objects.set_result(current.step_id, "attempt 2", 2)
            step.refresh_from_db()
            assert (step.status, step.result, step.attempt) == ("succeeded", "attempt 2", 2)
    finally:
        _gates[gate].set()
        _gates.pop(started, None)
        _gates.pop(gate, None)
