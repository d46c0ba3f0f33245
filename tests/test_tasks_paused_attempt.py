"""A Django Tasks attempt paused past its step lease (in-process, real threads).

Rule: a task whose first attempt's worker pauses past its step lease while a second attempt
runs and succeeds is SUCCESSFUL once; the paused attempt, resumed, lands nothing — its
return value is not the task's, its status never regresses from SUCCESSFUL, ``task_finished``
is sent exactly once, and its worker is not named as the successful attempt's.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)

from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from django_leases.tasks import TASK_FUNCTION, TASK_STEP
from django_leases.tasks_api import TaskResultStatus, task, task_finished
from django_leases.testing import drive
from django_leases.workflows.engine import execute_step
from tests.helpers import drain, lapse_step_lease, start_thread, tuned_sql

_gates: dict[str, threading.Event] = {}


@task(takes_context=True)
def gated_task(context: Any, started: str, gate: str) -> dict[str, Any]:
    """Attempt 1 says it started, then waits for the test's gate; later attempts return."""
    attempt = context.attempt
    if attempt == 1:
        _gates[started].set()
        assert _gates[gate].wait(60)
    return {"attempt": attempt}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tuned", [True, False])
def test_a_paused_task_attempt_lands_nothing_and_task_finished_is_sent_once(tuned: bool) -> None:
    started, gate = uuid.uuid4().hex, uuid.uuid4().hex
    _gates[started], _gates[gate] = threading.Event(), threading.Event()
    finished: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append((task_result.status, task_result.return_value))

    task_finished.connect(receive)
    try:
        with tuned_sql(tuned):
            result = gated_task.using(backend="retrying").enqueue(started, gate)
            run_id = uuid.UUID(result.id)
            stale = WorkflowStep.objects.claim_for_execution(run_id, TASK_STEP, TASK_FUNCTION, 60)
            assert stale is not None and stale.attempt == 1
            outcome: list[str] = []
            dispatch = start_thread(lambda: outcome.append(execute_step(stale)))
            assert _gates[started].wait(60), "attempt 1 never started"
            lapse_step_lease(run_id=run_id, step_name=TASK_STEP)
            drive()  # attempt 2 takes over (its retry delay jumped), returns, completes
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL
            assert result.return_value == {"attempt": 2}
            _gates[gate].set()
            dispatch.join(60)
            assert not dispatch.is_alive()
            drain()
            assert outcome == ["superseded"]
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL
            assert result.return_value == {"attempt": 2}
            assert result.attempts == 2
            assert result.worker_ids[0] == ""  # attempt 1 never reported back
            step = WorkflowStep.objects.get(run_id=run_id, step_name=TASK_STEP)
            assert (step.status, step.attempt) == ("succeeded", 2)
            assert step.result["return_value"] == {"attempt": 2}
            run = WorkflowRun.objects.get(pk=run_id)
            assert run.status == "completed" and run.output == {"attempt": 2}
            statuses = dict(
                WorkflowStepAttempt.objects.filter(step__run_id=run_id).values_list(
                    "attempt", "status"
                )
            )
            assert statuses[2] == "succeeded"
            assert finished == [(TaskResultStatus.SUCCESSFUL, {"attempt": 2})]
    finally:
        task_finished.disconnect(receive)
        _gates[gate].set()
        _gates.pop(started, None)
        _gates.pop(gate, None)
