"""A claim of a due step whose reply is lost: the claim landed (the step is ``running``
under a step lease for this worker) and the worker saw a database error.

The rule (``tests/test_statement_faults.py``): a fault in the library's own work ends the
unit of work, never the run. A step that never ran has not lost a worker: its lease lapsing
must not spend its last attempt and fail the run with ``STEP_LEASE_LAPSED``; the step runs
and the run completes — as a pass whose pick's reply was lost is due again
(``tests/test_pass_faults.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.worker import Worker
from tests.helpers import work_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

_executions: list[tuple[str, str, int]] = []


@step_function("tests.claim-reply-counted")
def counted(data: Any, ctx: Any) -> Any:
    """Notes each execution: (run, step, attempt)."""
    _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))
    return {"s": ctx.step_name}


@workflow("tests.claim-reply-one")
def one(run: Any, input: Any) -> Any:
    return run.step("q", "tests.claim-reply-counted", {}, retries=0, queue="tests-other")


def _worker(queues: list[str]) -> Worker:
    return Worker(1, step_lease_ttl=30, poll_interval=3600, queues=queues)


def test_a_claim_whose_reply_is_lost_does_not_spend_the_steps_last_attempt(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step ``q`` (no retries) of queue ``tests-other`` is claimed by a worker of that
    queue; the claim lands and its reply is lost. The worker hands the step back by the
    name its claim carried: it runs once, as attempt 1, and the run completes."""
    from django_leases.models.claims import StepClaims

    _executions.clear()
    run_id = start_workflow("tests.claim-reply-one", {})
    work_until_idle(_worker(["default"]))  # the pass creates "q" for its queue's workers
    real = StepClaims._claim_due
    lost: list[Any] = []

    def lost_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The claim commits; its reply is lost on the way back.
        claimed = real(self, *args, **kwargs)
        if not lost and claimed is not None:
            lost.append(claimed)
            raise OperationalError("server closed the connection unexpectedly")
        return claimed

    monkeypatch.setattr(StepClaims, "_claim_due", lost_once)
    work_until_idle(_worker(["tests-other"]))
    monkeypatch.undo()
    assert lost, "no claim's reply was lost"
    # Handed back at once, its attempt unspent: no lease had to lapse.
    step = WorkflowStep.objects.get(run_id=run_id, step_name="q")
    assert step.status in ("scheduled", "succeeded") and step.attempt == 1
    work_until_idle(_worker(["tests-other"]))
    work_until_idle(_worker(["default"]))
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"s": "q"}), (run.status, run.error)
    ran = [(step, attempt) for r, step, attempt in _executions if r == str(run_id)]
    assert ran == [("q", 1)], ran
