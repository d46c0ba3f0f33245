"""A run's deadline enforced while the worker that drives it writes its last step's result
and completes it in one write (``set_result_completing_run``), on real threads released
together. Either the run completed with its step succeeded (the deadline then finds nothing
to fail), or it failed at its deadline with its step failed and no result: never a mix
(docs/howto/timing.md, "A write that committed first wins")."""

from __future__ import annotations

from typing import Any

import pytest

from django_leases import clock
from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from tests.helpers import race

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("tests.deadline-race-last")
def last(data: Any, ctx: Any) -> Any:
    return 1


@workflow("tests.deadline-race")
def one_step(run: Any, input: Any) -> Any:
    return {"got": run.step("only", "tests.deadline-race-last", {})}


def test_a_deadline_racing_the_completing_write_ends_the_run_one_way(sql_path: str) -> None:
    for _ in range(12):
        run_id = start_workflow("tests.deadline-race", deadline=3600)
        run_pass(run_id)
        claim = WorkflowStep.objects.claim_due(60)
        assert claim is not None
        WorkflowRun.objects.filter(pk=run_id).update(deadline_at=clock.db_now_plus(-0.001))
        expired, done = race(
            [
                lambda: WorkflowRun.objects.expire_deadlines(),
                lambda claim=claim: WorkflowStep.objects.set_result_completing_run(
                    claim.step_id,
                    1,
                    claim.attempt,
                    output={"got": 1},
                    lease=None,
                    lease_holder="deadline-race-holder",
                ),
            ]
        )
        assert not isinstance(expired, BaseException), expired
        run = WorkflowRun.objects.get(pk=run_id)
        step = WorkflowStep.objects.get(pk=claim.step_id)
        if run.status == "completed":
            assert (step.status, step.result, run.output) == ("succeeded", 1, {"got": 1})
        else:
            assert run.status == "failed", run.status
            assert (step.status, step.result) == ("failed", None), done
