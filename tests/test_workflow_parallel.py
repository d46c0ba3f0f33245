"""Fan-out (DESIGN §5a): ``run.parallel(calls)`` schedules every step in one pass, any workers
run them concurrently under their own leases and attempt fences, the results come back in
order, and the first step out of attempts fails the run."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import Lease, RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.workflows import driver, start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import STEP_FAILED, WORKFLOW_ERROR
from django_leases.workflows.worker import Worker
from tests.helpers import (
    closing_connections,
    drain,
    in_processes,
    lapse_step_lease,
    settle,
    start_blocked,
)

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
    settle(run_id)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output["sum"] == sum(n * n for n in range(200))
    executions = Lease.objects.filter(key__startswith=EXECUTED).count()
    attempts = WorkflowStepAttempt.objects.filter(
        step__run_id=run_id, step__step_name__startswith="sq-"
    )
    assert executions == attempts.count(), "each attempt ran its function exactly once"
    assert attempts.filter(status="succeeded").count() == 200


# -- one pass to resume, however wide the fan-out ----------------------------------------------


@workflow("tests.parallel.only")
def only_parallel(run: Any, input: dict[str, Any]) -> Any:
    calls = [
        (f"br-{n}", "tests.parallel.square", {"n": n, **input.get(str(n), {})})
        for n in range(input["n"])
    ]
    return {"sum": sum(run.parallel(calls, retries=input.get("retries", 0)))}


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The outcome of every orchestration pass the driver replays, in order."""
    seen: list[str] = []
    real = driver.RunDriver._one

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = real(self, *args, **kwargs)
        seen.append(outcome)
        return outcome

    monkeypatch.setattr(driver.RunDriver, "_one", counting)
    return seen


def branches_left(run_id: uuid.UUID) -> int:
    return WorkflowRun.objects.values_list("branches_left", flat=True).get(pk=run_id)


def claim(run_id: uuid.UUID, step_name: str) -> Any:
    claimed = WorkflowStep.objects.claim_for_execution(
        run_id, step_name, "tests.parallel.square", LEASE
    )
    assert claimed is not None
    return claimed


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
# 200 wide: the count of passes does not depend on the width (a thousand-wide fan-out, the
# bulk writes at that width, is test_a_thousand_parallel_steps_are_one_pass_then_one_more's).
@pytest.mark.parametrize("width", [200])
def test_a_fan_out_is_one_scheduling_pass_and_the_last_result_completes_the_run(
    sql_path: str, width: int, passes: list[str]
) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": width})
    drain(Worker(1, step_lease_ttl=LEASE))
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output == {"sum": sum(n * n for n in range(width))}
    # The branch that finishes last takes the run's pass before it writes and carries its
    # result into it: the workflow returns there, so the result completes the run in one
    # write. Two passes whatever the width: the one that fans out, the one that completes.
    assert passes == ["waiting", "completed"], "N branches cost two passes, not N + 1"
    assert branches_left(run_id) == 0


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
def test_only_the_last_branch_to_finish_asks_for_the_pass(sql_path: str) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": 3})
    assert run_pass(run_id) == "waiting"
    assert branches_left(run_id) == 3
    requests = WorkflowRun.objects.get(pk=run_id).pass_requests
    for n, last in ((0, False), (1, False), (2, True)):
        step = claim(run_id, f"br-{n}")
        wrote = WorkflowStep.objects.set_result(step.step_id, n * n, step.attempt)
        assert wrote.pass_requested is last
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.pass_requests == requests + n + 1, "every finish still counts as a request"
        assert (run.pass_due_at is not None) is last
    assert branches_left(run_id) == 0
    assert run_pass(run_id) == "completed"


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
def test_two_branches_finishing_at_once_wake_the_run_exactly_once(
    sql_path: str, passes: list[str]
) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": 2})
    assert run_pass(run_id) == "waiting"
    first, second = claim(run_id, "br-0"), claim(run_id, "br-1")
    with transaction.atomic():
        # The first finish holds the run row (count 2 → 1) while the second one's write
        # starts and waits for it: the second must decide on the row the first leaves.
        wrote_first = WorkflowStep.objects.set_result(first.step_id, 0, first.attempt)
        later = start_blocked(
            closing_connections(
                lambda: WorkflowStep.objects.set_result(second.step_id, 1, second.attempt)
            )
        )
        if connection.vendor == "postgresql":
            assert later.waited, "the second finish waited for the first one's lock"
    wrote_second = later.result()
    assert (wrote_first.pass_requested, wrote_second.pass_requested) == (False, True)
    assert branches_left(run_id) == 0
    drain(Worker(1, step_lease_ttl=LEASE))
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert passes == ["waiting", "completed"], "woken exactly once"


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
def test_the_first_exhausted_failure_fails_the_run_without_waiting_for_the_others(
    sql_path: str,
) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": 200, "7": {"fail": True}})
    assert run_pass(run_id) == "waiting"
    execute_step(claim(run_id, "br-3"))
    assert WorkflowRun.objects.get(pk=run_id).pass_due_at is None, "198 more to go"
    execute_step(claim(run_id, "br-7"))  # out of attempts: the run is due at once
    picked = WorkflowRun.objects.claim_due_pass(LEASE)
    assert picked is not None and picked.run_id == run_id
    assert run_pass(run_id) == "failed"
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.error["code"], run.error["step_name"]) == (STEP_FAILED, "br-7")
    assert steps(run_id).filter(status=StepStatus.PENDING).count() == 198


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
def test_a_superseded_branch_finish_counts_nothing_off(sql_path: str) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": 2, "retries": 1})
    assert run_pass(run_id) == "waiting"
    stale = claim(run_id, "br-0")
    lapse_step_lease(run_id=run_id, step_name="br-0")
    current = claim(run_id, "br-0")
    assert current.attempt == stale.attempt + 1
    before = WorkflowRun.objects.get(pk=run_id)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, 999, stale.attempt)
    after = WorkflowRun.objects.get(pk=run_id)
    assert (after.branches_left, after.pass_requests, after.pass_due_at) == (
        before.branches_left,
        before.pass_requests,
        before.pass_due_at,
    )
    assert (
        WorkflowStep.objects.set_result(current.step_id, 0, current.attempt).pass_requested is False
    )
    drain(Worker(1, step_lease_ttl=LEASE))
    assert WorkflowRun.objects.get(pk=run_id).output == {"sum": 1}


@pytest.mark.parametrize("sql_path", ["tuned", "portable"], indirect=True)
def test_a_drifted_count_is_set_right_by_the_next_pass(sql_path: str, passes: list[str]) -> None:
    run_id = start_workflow("tests.parallel.only", {"n": 4})
    assert run_pass(run_id) == "waiting"
    WorkflowRun.objects.filter(pk=run_id).update(branches_left=1)  # too low: lost count
    execute_step(claim(run_id, "br-0"))  # wakes the run early
    assert run_pass(run_id) == "waiting"
    assert branches_left(run_id) == 3, "the pass counted again"
    # Too high (a count nobody will bring to 0): any other request for a pass resets it.
    WorkflowRun.objects.filter(pk=run_id).update(branches_left=50)
    WorkflowRun.objects.request_pass(run_id)
    assert branches_left(run_id) == 0
    drain(Worker(1, step_lease_ttl=LEASE))
    assert WorkflowRun.objects.get(pk=run_id).output == {"sum": 14}


def test_the_worker_log_says_each_parallel_branch_succeeded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every branch a worker ran gets its "succeeded" line, as an inline step does (the
    worker log used to stop at "claimed" for branches whose result a pass carried)."""
    run_id = start_workflow("tests.parallel.fan-out", {"n": 3})
    with caplog.at_level("INFO", logger="django_leases"):
        drain()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    lines = [record.getMessage() for record in caplog.records]
    for name in ("first", "sq-0", "sq-1", "sq-2"):
        said = f"Run {run_id}: step {name!r} attempt 1 succeeded"
        assert lines.count(said) == 1, (name, lines)
