"""Step timeouts (DESIGN §5a): ``run.step(..., timeout=seconds)`` bounds each attempt on the
database clock. An attempt past it is failed with ``STEP_TIMED_OUT`` by the next claim that
looks for due work, and retried while attempts remain; its worker's late result, error and
renewals are refused by the attempt fence. Nothing waits for real time here: the deadline is
moved into the past on the database clock."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_leases.clock import DbNow, db_now_plus
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import STEP_FAILED, STEP_TIMED_OUT
from django_leases.workflows.worker import Worker
from tests.helpers import no_queue_limits, on_another_thread

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0


@step_function("tests.timeouts.quick")
def quick(data: Any, ctx: Any) -> str:
    return f"attempt {ctx.attempt}"


@workflow("tests.timeouts.bounded")
def bounded(run: Any, input: dict[str, Any]) -> Any:
    return run.step(
        "work", "tests.timeouts.quick", {}, retries=input["retries"], timeout=input["timeout"]
    )


@workflow("tests.timeouts.backing-off")
def backing_off(run: Any, input: dict[str, Any]) -> Any:
    return run.step("work", "tests.timeouts.quick", {}, timeout=60, **input)


release = threading.Event()
running = threading.Event()


@step_function("tests.timeouts.blocking")
def blocking(data: Any, ctx: Any) -> str:
    if ctx.attempt == 1:
        running.set()
        release.wait(30)
        return "late"
    return "retried"


@workflow("tests.timeouts.blocking")
def blocked(run: Any, input: Any) -> Any:
    return run.step("work", "tests.timeouts.blocking", {}, retries=1, timeout=60)


def past_deadline(run_id: uuid.UUID) -> None:
    """The running attempt's deadline a second ago, on the database clock."""
    assert WorkflowStep.objects.filter(run_id=run_id, status="running").update(
        deadline_at=db_now_plus(-1)
    )


def started(run_id: uuid.UUID) -> Any:
    assert run_pass(run_id) == "waiting"
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and claim.run_id == run_id
    return claim


def test_a_timed_out_attempt_is_failed_retried_and_its_late_result_refused() -> None:
    run_id = start_workflow("tests.timeouts.bounded", {"retries": 1, "timeout": 30})
    slow = started(run_id)
    step = WorkflowStep.objects.get(pk=slow.step_id)
    assert step.timeout == 30 and step.deadline_at is not None
    assert WorkflowStep.objects.claim_due(LEASE) is None, "within its timeout: left alone"
    past_deadline(run_id)
    retry = WorkflowStep.objects.claim_due(LEASE)
    assert retry is not None and retry.attempt == slow.attempt + 1
    first = WorkflowStepAttempt.objects.get(step_id=slow.step_id, attempt=slow.attempt)
    assert (first.status, first.error["code"]) == ("failed", STEP_TIMED_OUT)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(slow.step_id, "too late", slow.attempt)
    assert not WorkflowStep.objects.refresh_lease(slow.step_id, LEASE, slow.attempt)
    assert execute_step(retry) == "succeeded"
    assert run_pass(run_id) == "completed"
    assert WorkflowRun.objects.get(pk=run_id).output == "attempt 2"


def db_clock(run_id: uuid.UUID) -> datetime:
    """The database clock's now, read with the row of run ``run_id``."""
    rows = WorkflowRun.objects.filter(pk=run_id).annotate(now=DbNow())
    now: datetime = rows.values_list("now", flat=True).get()
    return now


@pytest.mark.parametrize(
    ("backoff", "delays"),
    [
        ({"retry_backoff": 3, "retry_delay_max": 60}, [10, 30, 60]),
        ({}, [10, 10, 10]),  # no backoff: the constant delay
    ],
)
def test_a_timed_out_attempt_is_retried_after_the_backoff_delay(
    sql_path: str, backoff: dict[str, Any], delays: list[float]
) -> None:
    """A timed-out attempt waits the same growing delay as one that raised: after attempt n
    times out, attempt n + 1 is due ``min(retry_delay × retry_backoff^(n − 1),
    retry_delay_max)`` seconds later on the database clock (on PostgreSQL's tuned claim too,
    which leaves the timed-out step to the portable rule)."""
    with no_queue_limits():
        run_id = start_workflow(
            "tests.timeouts.backing-off", {"retries": 3, "retry_delay": 10, **backoff}
        )
        assert run_pass(run_id) == "waiting"
        for attempt, delay in enumerate(delays, start=1):
            claim = WorkflowStep.objects.claim_due(LEASE)
            assert claim is not None and (claim.run_id, claim.attempt) == (run_id, attempt)
            past_deadline(run_id)
            before = db_clock(run_id)
            assert WorkflowStep.objects.claim_due(LEASE) is None  # times it out: not yet due
            after = db_clock(run_id)
            step = WorkflowStep.objects.get(pk=claim.step_id)
            assert (step.status, step.error["code"]) == (StepStatus.FAILED, STEP_TIMED_OUT)
            wait = timedelta(seconds=delay)
            assert step.available_at is not None
            assert before + wait <= step.available_at <= after + wait
            WorkflowStep.objects.filter(pk=step.pk).update(available_at=db_now_plus(-1))


def test_a_timeout_on_the_last_attempt_fails_the_run() -> None:
    run_id = start_workflow("tests.timeouts.bounded", {"retries": 0, "timeout": 5})
    slow = started(run_id)
    past_deadline(run_id)
    assert WorkflowStep.objects.claim_due(LEASE) is None
    step = WorkflowStep.objects.get(pk=slow.step_id)
    assert (step.status, step.error["code"]) == (StepStatus.FAILED, STEP_TIMED_OUT)
    assert run_pass(run_id) == "failed"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.error["code"] == STEP_FAILED and run.error["step_error"]["code"] == STEP_TIMED_OUT


def test_a_worker_running_a_timed_out_attempt_sees_its_lease_lost_and_writes_nothing() -> None:
    """The attempt's function is still running on another thread when its deadline passes
    and a worker looking for due work fails it: the function's renewals fail
    (``ctx.lease_lost``), its result is discarded, and the retry's result lands."""
    release.clear()
    running.clear()
    run_id = start_workflow("tests.timeouts.blocking", {})
    run_pass(run_id)
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None

    def run_first_attempt() -> str:
        return execute_step(claim)

    thread_result: list[str] = []
    thread = threading.Thread(
        target=lambda: thread_result.append(on_another_thread(run_first_attempt))
    )
    thread.start()
    try:
        assert running.wait(30)
        past_deadline(run_id)
        retry = WorkflowStep.objects.claim_due(LEASE)
        assert retry is not None and retry.attempt == 2
    finally:
        release.set()
        thread.join(30)
    assert thread_result == ["superseded"]
    assert execute_step(retry) == "succeeded"
    worker = Worker(step_lease_ttl=LEASE)
    while worker.work_once():
        pass
    assert WorkflowRun.objects.get(pk=run_id).output == "retried"


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5"])
def test_a_bad_timeout_fails_the_run_clearly_with_no_step(bad: Any) -> None:
    run_id = WorkflowRun.objects.start("tests.timeouts.bounded", {"retries": 0, "timeout": 1}).id
    with pytest.raises(ValueError, match="timeout"):
        WorkflowStep.objects.schedule(run_id, "work", "tests.timeouts.quick", timeout=bad)
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.RUNNING


def test_an_attempt_about_to_time_out_counts_as_work_due_soon() -> None:
    """``run_workflow_worker --once`` must not stop while an attempt is about to time out."""
    run_id = start_workflow("tests.timeouts.bounded", {"retries": 1, "timeout": 3600})
    started(run_id)
    assert not WorkflowRun.objects.work_due_within(60)
    WorkflowStep.objects.filter(run_id=run_id).update(deadline_at=db_now_plus(30))
    assert WorkflowRun.objects.work_due_within(60)
