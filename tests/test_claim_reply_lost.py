"""A claim of a due step whose reply is lost: the claim landed (the step is ``running``
under a step lease for this worker) and the worker saw a database error.

The rule (``tests/test_statement_faults.py``): a fault in the library's own work ends the
unit of work, never the run. A step that never ran has not lost a worker: its lease lapsing
must not spend its last attempt and fail the run with ``STEP_LEASE_LAPSED``; the step runs
and the run completes — as a pass whose pick's reply was lost is due again
(``tests/test_pass_faults.py``). The step is handed back by the name its claim carried
(``StepClaims.hand_back_claimed``): only a step that claim still holds, never one another
worker runs, and it is claimed again at the attempt the claim gave it.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection

from django_leases.clock import db_now
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowStepAttempt
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


@step_function("tests.hand-back-noted")
def noted(data: Any, ctx: Any) -> Any:
    """Returns its step's name."""
    return {"s": ctx.step_name}


@workflow("tests.hand-back-timed")
def timed(run: Any, input: Any) -> Any:
    return run.step(
        "q", "tests.hand-back-noted", {}, retries=1, retry_delay=60, timeout=3, queue="tests-other"
    )


@workflow("tests.hand-back-retried")
def retried(run: Any, input: Any) -> Any:
    return run.step("q", "tests.hand-back-noted", {}, retries=2, queue="tests-other")


def _created(name: str) -> WorkflowStep:
    """A run of workflow ``name``, its pass run: its step ``q``, created for its queue."""
    run_id = start_workflow(name, {})
    work_until_idle(_worker(["default"]))
    return WorkflowStep.objects.get(run_id=run_id, step_name="q")


def _lost_after(monkeypatch: pytest.MonkeyPatch, meanwhile: Any) -> list[Any]:
    """Make the next ``claim_due`` commit its claim, then run ``meanwhile`` (what others do
    while its reply is on the way), then lose the reply."""
    from django_leases.models.claims import StepClaims

    real = StepClaims._claim_due
    lost: list[Any] = []

    def lost_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        claimed = real(self, *args, **kwargs)
        if not lost and claimed is not None:
            lost.append(claimed)
            meanwhile()
            raise OperationalError("server closed the connection unexpectedly")
        return claimed

    monkeypatch.setattr(StepClaims, "_claim_due", lost_once)
    return lost


def test_a_claim_whose_reply_is_lost_does_not_spend_the_steps_last_attempt(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step ``q`` (no retries) of queue ``tests-other`` is claimed by a worker of that
    queue; the claim lands and its reply is lost. The worker hands the step back by the
    name its claim carried: it runs once, as attempt 1, and the run completes."""
    _executions.clear()
    run_id = start_workflow("tests.claim-reply-one", {})
    work_until_idle(_worker(["default"]))  # the pass creates "q" for its queue's workers
    lost = _lost_after(monkeypatch, lambda: None)
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


def test_a_step_claimed_again_from_failed_and_handed_back_runs_that_attempt(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step ``q`` failed attempt 1; a claim gives it attempt 2 and its reply is lost: the
    step is handed back ``scheduled`` at attempt 2, and the next claim runs attempt 2 (not
    3), its attempt row restarted."""
    step = _created("tests.hand-back-retried")
    first = WorkflowStep.objects.claim_due(30, queues=["tests-other"])
    assert first is not None and first.attempt == 1
    WorkflowStep.objects.set_error(first.step_id, {"message": "boom"}, first.attempt)
    lost = _lost_after(monkeypatch, lambda: None)
    with pytest.raises(OperationalError):
        WorkflowStep.objects.claim_due(30, queues=["tests-other"])
    monkeypatch.undo()
    assert lost and lost[0].attempt == 2
    step.refresh_from_db()
    assert (step.status, step.attempt, step.claimant) == ("scheduled", 2, "")
    again = WorkflowStep.objects.claim_due(30, queues=["tests-other"])
    assert again is not None and again.attempt == 2
    step.refresh_from_db()
    assert (step.status, step.attempt) == ("running", 2)
    rows = dict(
        WorkflowStepAttempt.objects.filter(step_id=step.pk).values_list("attempt", "status")
    )
    assert rows == {1: "failed", 2: "running"}, rows


@pytest.mark.postgres_only
def test_a_claim_whose_reply_comes_late_never_hands_back_a_step_a_previous_release_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During a rolling deploy (the previous release's claim functions, kept by
    ``0045_named_claim_functions``, still called): a claim of ``q`` commits and its reply is
    slow to fail; meanwhile the attempt times out (recorded by this release), and when due
    again a worker of the previous release claims attempt 2 and runs it. The late failure
    must not hand back the step that worker runs: it stays ``running`` at attempt 2, and no
    other claim gets attempt 2 while that worker's lease is live."""
    kept = importlib.import_module("django_leases.migrations.0045_named_claim_functions").KEPT
    (old_claim,) = [
        name for name in kept if name.startswith("dl_claim_step_") and "except" not in name
    ]
    step = _created("tests.hand-back-timed")
    old: list[Any] = []

    def meanwhile() -> None:
        # The attempt passes its timeout (database clock); a worker of this release records
        # it timed out (failed, retried in 60 s), and the retry comes due.
        WorkflowStep.objects.filter(pk=step.pk).update(deadline_at=db_now() - timedelta(seconds=1))
        assert WorkflowStep.objects.claim_due(30, queues=["tests-other"]) is None
        timed_out = WorkflowStep.objects.get(pk=step.pk)
        assert (timed_out.status, timed_out.attempt) == ("failed", 1)
        WorkflowStep.objects.filter(pk=step.pk).update(available_at=db_now() - timedelta(seconds=1))
        # A worker of the previous release claims attempt 2, by its function.
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {old_claim}(%s, %s)", [30.0, ["tests-other"]])
            old.append(cursor.fetchone())

    _lost_after(monkeypatch, meanwhile)
    with pytest.raises(OperationalError):
        WorkflowStep.objects.claim_due(30, queues=["tests-other"])
    monkeypatch.undo()
    assert old and old[0][1] == step.pk and old[0][5] == 2, old
    step.refresh_from_db()
    assert (step.status, step.attempt) == ("running", 2), (step.status, step.attempt)
    assert WorkflowStep.objects.claim_due(30, queues=["tests-other"]) is None
