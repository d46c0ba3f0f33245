"""Fan-out (DESIGN §5a): ``run.parallel(calls)`` schedules every step in one pass, any workers
run them concurrently under their own leases and attempt fences, the results come back in
order, and the first step out of attempts fails the run."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db.models.functions import Now

from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import Lease, RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import STEP_FAILED, WORKFLOW_ERROR
from django_leases.workflows.worker import Worker
from tests.helpers import drain, in_processes, lapse_step_lease

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
#: Prefix of the lease rows the counting step function leaves, one per execution.
EXECUTED = "tests.parallel.executed:"


@step_function("tests.parallel.square")
def square(data: dict[str, Any], ctx: Any) -> int:
    if data.get("fail"):
        raise RuntimeError(f"step {ctx.step_name} fails")
    return int(data["n"]) ** 2


@step_function("tests.parallel.counted")
def counted(data: dict[str, Any], ctx: Any) -> int:
    """Leaves one row per execution (a lease nobody else takes), then squares."""
    Lease.objects.acquire(f"{EXECUTED}{ctx.step_name}:{ctx.attempt}:{uuid.uuid4().hex}", "x", 60)
    return int(data["n"]) ** 2


@workflow("tests.parallel.fan-out")
def fan_out(run: Any, input: dict[str, Any]) -> Any:
    first = run.step("first", "tests.parallel.square", {"n": 2})
    calls = [
        (
            f"sq-{n}",
            input.get("function", "tests.parallel.square"),
            {"n": n, **input.get(str(n), {})},
        )
        for n in range(input["n"])
    ]
    squares = run.parallel(calls, retries=input.get("retries", 0))
    return {"first": first, "sum": sum(squares), "squares": squares[:5]}


@workflow("tests.parallel.bad-calls")
def bad_calls(run: Any, input: Any) -> Any:
    return run.parallel([("a", "tests.parallel.square")])


@workflow("tests.parallel.duplicate")
def duplicate(run: Any, input: Any) -> Any:
    return run.parallel([("a", "tests.parallel.square", {"n": 1})] * 2)


def steps(run_id: uuid.UUID) -> Any:
    return WorkflowStep.objects.filter(run_id=run_id)


def run_due_steps() -> int:
    """Run every due step here, each writing its result the ordinary way (no pass taken)."""
    done = 0
    while (claim := WorkflowStep.objects.claim_due(LEASE)) is not None:
        execute_step(claim)
        done += 1
    return done


def test_every_step_is_scheduled_in_one_pass_and_results_come_back_in_order() -> None:
    run_id = start_workflow("tests.parallel.fan-out", {"n": 10})
    drain()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output == {
        "first": 4,
        "sum": sum(n * n for n in range(10)),
        "squares": [0, 1, 4, 9, 16],
    }


def test_a_thousand_parallel_steps_are_one_pass_then_one_more() -> None:
    run_id = start_workflow("tests.parallel.fan-out", {"n": 1000})
    assert run_pass(run_id) == "waiting"  # schedules "first"
    assert run_due_steps() == 1
    assert run_pass(run_id) == "waiting"
    assert steps(run_id).count() == 1001, "one pass scheduled all 1,000"
    assert steps(run_id).filter(status=StepStatus.PENDING, available_at__lte=Now()).count() == 1000
    assert run_pass(run_id) == "waiting", "a pass meanwhile schedules nothing more"
    assert steps(run_id).count() == 1001
    assert run_due_steps() == 1000
    assert run_pass(run_id) == "completed"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.output["sum"] == sum(n * n for n in range(1000))


def test_the_first_step_out_of_attempts_fails_the_run() -> None:
    run_id = start_workflow(
        "tests.parallel.fan-out", {"n": 4, "2": {"fail": True}, "3": {"fail": True}}
    )
    drain()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED
    assert (run.error["code"], run.error["step_name"]) == (STEP_FAILED, "sq-2")


def test_a_failing_step_with_retries_left_is_retried_before_the_run_goes_on() -> None:
    run_id = start_workflow("tests.parallel.fan-out", {"n": 3, "retries": 2})
    drain()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED


def test_a_superseded_attempt_cannot_complete_a_parallel_step() -> None:
    run_id = start_workflow("tests.parallel.fan-out", {"n": 2, "retries": 1})
    run_pass(run_id)
    run_due_steps()
    run_pass(run_id)
    stale = WorkflowStep.objects.claim_for_execution(run_id, "sq-1", "tests.parallel.square", LEASE)
    assert stale is not None
    lapse_step_lease(run_id=run_id, step_name="sq-1")
    current = WorkflowStep.objects.claim_for_execution(
        run_id, "sq-1", "tests.parallel.square", LEASE
    )
    assert current is not None and current.attempt == stale.attempt + 1
    run_due_steps()  # sq-0
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, 999, stale.attempt)
    assert run_pass(run_id) == "waiting", "sq-1 is not finished: the stale result did not land"
    WorkflowStep.objects.set_result(current.step_id, 1, current.attempt)
    assert run_pass(run_id) == "completed"
    assert WorkflowRun.objects.get(pk=run_id).output["sum"] == 1


def test_bad_calls_fail_the_run_clearly_with_nothing_scheduled() -> None:
    for name in ("tests.parallel.bad-calls", "tests.parallel.duplicate"):
        run_id = start_workflow(name, {})
        drain()
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == RunStatus.FAILED and run.error["code"] == WORKFLOW_ERROR
        assert not steps(run_id).exists()


def test_two_hundred_steps_with_four_worker_processes_run_once_per_attempt() -> None:
    run_id = start_workflow(
        "tests.parallel.fan-out", {"n": 200, "function": "tests.parallel.counted"}
    )

    def work() -> int:
        return Worker(2, step_lease_ttl=LEASE, poll_interval=0.05).run(
            once=True, handle_signals=False
        )

    outcomes = in_processes([work] * 4)
    assert outcomes == [(0, "")] * 4
    drain()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output["sum"] == sum(n * n for n in range(200))
    executions = Lease.objects.filter(key__startswith=EXECUTED).count()
    attempts = WorkflowStepAttempt.objects.filter(
        step__run_id=run_id, step__step_name__startswith="sq-"
    )
    assert executions == attempts.count(), "each attempt ran its function exactly once"
    assert attempts.filter(status="succeeded").count() == 200
