"""A task's result completes its run in the write of that result, taking the run lease only
for that instant (``WorkflowStep.objects.set_result_completing_run`` with ``lease=None``):
no pass, no replay. On PostgreSQL one statement (and a task costs the worker two); on the
portable path (every backend, and PostgreSQL with ``TUNED_SQL`` off) one transaction that
locks the step, its run, then the run lease. A pass that holds the run lease is never
overtaken: the result is written and the run's pass asked for, and that pass completes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip(
    "django_leases.tasks_api",
    reason="needs Django 6 or the django-tasks backport (pip install -e '.[dev]')",
    exc_type=ImportError,
)

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_leases.clock import db_now
from django_leases.models import (
    AttemptStatus,
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.signals import lease_acquired, lease_released
from django_leases.tasks import TASK_STEP, TASK_WORKFLOW
from django_leases.tasks_api import TaskResultStatus
from django_leases.testing import drive
from django_leases.workflows.registry import one_step_output
from django_leases.workflows.values import Claim, run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import start_blocked, tuned_sql
from tests.workapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["tuned", "portable"])
def sent_as(request: pytest.FixtureRequest) -> Iterator[str]:
    """The tuned statement (PostgreSQL; elsewhere the portable path either way), then the
    portable ORM path (``TUNED_SQL`` off)."""
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


def claimed_task(task: Any = t.add, *args: Any) -> Claim:
    """Enqueue ``task`` (default ``add(1, 2)``) and claim its step as a worker does."""
    result = task.enqueue(*(args or (1, 2)))
    claim = WorkflowStep.objects.claim_due(30, queues=["default"])
    assert claim is not None and claim.run_id == uuid.UUID(result.id)
    assert (claim.run_workflow, claim.step_name) == (TASK_WORKFLOW, TASK_STEP)
    return claim


def complete_alone(claim: Claim, attempt: int = 1, holder: str = "instant") -> Any:
    return WorkflowStep.objects.set_result_completing_run(
        claim.step_id,
        {"return_value": 3, "worker_id": "w"},
        attempt,
        output=3,
        lease=None,
        lease_holder=holder,
    )


def test_a_claim_says_which_workflow_its_run_is_of(sent_as: str) -> None:
    claim = claimed_task()
    assert claim.run_workflow == TASK_WORKFLOW
    assert one_step_output(claim.run_workflow, claim.step_name) is not None
    assert one_step_output(claim.run_workflow, "another-step") is None
    assert one_step_output("tests.sub.two-steps", TASK_STEP) is None


def test_the_result_completes_the_run_under_a_run_lease_held_for_an_instant(
    sent_as: str,
) -> None:
    claim = claimed_task()
    sent: list[tuple[str, Any]] = []

    def acquired(sender: Any, lease: Any, **kwargs: Any) -> None:
        sent.append(("acquired", lease.key))

    def released(sender: Any, lease: Any, **kwargs: Any) -> None:
        sent.append(("released", lease.key))

    lease_acquired.connect(acquired)
    lease_released.connect(released)
    try:
        done = complete_alone(claim)
    finally:
        lease_acquired.disconnect(acquired)
        lease_released.disconnect(released)
    assert (done.written, done.completed, done.pass_asked, done.lease_live) == (
        True,
        True,
        False,
        None,
    )
    key = run_lease_key(claim.run_id)
    assert sent == [("acquired", key), ("released", key)]
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.status, run.output, run.pass_due_at) == (RunStatus.COMPLETED, 3, None)
    if done.finished_at is not None:  # read back by the tuned statement
        assert done.finished_at == run.finished_at
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"return_value": 3, "worker_id": "w"}
    attempt = WorkflowStepAttempt.objects.get(step_id=claim.step_id)
    assert attempt.status == AttemptStatus.SUCCEEDED and attempt.finished_at is not None
    lease = Lease.objects.with_state().get(key=key)
    assert (lease.state, lease.holder, lease.token) == ("released", "instant", 1)
    assert t.add.get_result(str(claim.run_id)).return_value == 3


def test_a_run_lease_that_lapsed_is_taken_over_with_a_higher_token(sent_as: str) -> None:
    claim = claimed_task()
    key = run_lease_key(claim.run_id)
    dead = Lease.objects.acquire(key, "a-dead-pass", 30)
    assert dead is not None
    Lease.objects.filter(pk=dead.pk).update(expires_at=db_now() - timedelta(seconds=1))
    done = complete_alone(claim)
    assert (done.written, done.completed, done.pass_asked) == (True, True, False)
    lease = Lease.objects.with_state().get(key=key)
    assert (lease.state, lease.holder, lease.token) == ("released", "instant", dead.token + 1)


def test_a_pass_holding_the_run_lease_gets_the_result_and_completes_the_run(
    sent_as: str,
) -> None:
    claim = claimed_task()
    key = run_lease_key(claim.run_id)
    held = Lease.objects.acquire(key, "a-pass", 30)
    assert held is not None
    before = WorkflowRun.objects.get(pk=claim.run_id)
    done = complete_alone(claim)
    assert (done.written, done.completed, done.pass_asked) == (True, False, True)
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert run.status == RunStatus.RUNNING and run.pass_due_at is not None
    assert run.pass_requests == before.pass_requests + 1
    assert WorkflowStep.objects.get(pk=claim.step_id).status == StepStatus.SUCCEEDED
    lease = Lease.objects.with_state().get(key=key)
    assert (lease.state, lease.holder, lease.token) == ("live", "a-pass", held.token)
    # The pass that held the lease ends; the pass asked for completes the run.
    assert Lease.objects.release(held)
    drive()
    result = t.add.get_result(str(claim.run_id))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


@pytest.mark.parametrize("another", [False, True], ids=["alone", "another-due"])
def test_a_result_that_asks_for_its_pass_never_picks_its_own_run(
    sent_as: str, another: bool
) -> None:
    """The pass asked for is due at once, but another holds the run lease: the completion's
    pick of the next due run must leave this run out (it would be refused its lease and put
    off), and still picks another run that is due."""
    claim = claimed_task()
    other = WorkflowRun.objects.start("tests.sub.two-steps", {}) if another else None
    held = Lease.objects.acquire(run_lease_key(claim.run_id), "a-pass", 30)
    assert held is not None
    done = WorkflowStep.objects.set_result_completing_run(
        claim.step_id,
        {"return_value": 3, "worker_id": "w"},
        1,
        output=3,
        lease=None,
        lease_holder="instant",
        next_pass_holder="next-pass",
    )
    assert (done.written, done.completed, done.pass_asked) == (True, False, True)
    if other is None:
        assert done.next_pass is None
    else:
        assert done.next_pass is not None and done.next_pass.run_id == other.id
        assert done.next_pass.lease is not None
    # Its pass is due now (not put off by a refused pick).
    assert WorkflowRun.objects.filter(pk=claim.run_id, pass_due_at__lte=db_now()).exists()


def test_a_superseded_attempt_writes_nothing_and_takes_no_lease(sent_as: str) -> None:
    claim = claimed_task(t.flaky, 1)  # the "retrying" backend: attempts left
    WorkflowStep.objects.filter(pk=claim.step_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    again = WorkflowStep.objects.claim_due(30, queues=["default"])
    assert again is not None and (again.step_id, again.attempt) == (claim.step_id, 2)
    done = complete_alone(claim, attempt=1)
    assert (done.written, done.completed, done.pass_asked) == (False, False, False)
    assert not Lease.objects.filter(key=run_lease_key(claim.run_id)).exists()
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.status, run.pass_due_at) == (RunStatus.RUNNING, None)
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert (step.status, step.attempt, step.result) == (StepStatus.RUNNING, 2, None)


def test_a_cancelled_run_is_not_completed(sent_as: str) -> None:
    claim = claimed_task()
    WorkflowRun.objects.cancel(claim.run_id)
    done = complete_alone(claim)
    assert (done.written, done.completed, done.pass_asked) == (False, False, False)
    assert WorkflowRun.objects.get(pk=claim.run_id).status == RunStatus.CANCELLED
    assert not Lease.objects.filter(key=run_lease_key(claim.run_id)).exists()


def test_a_result_written_while_a_pass_picks_the_run_waits_and_asks_for_its_pass(
    sent_as: str,
) -> None:
    """The pick of a run locks its row, then takes its lease; the completion locks the step,
    then the run, then the lease: it waits behind the pick (never a deadlock), then finds
    the lease live and asks for the pass."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: there is no lock order to lose")
    claim = claimed_task()
    assert WorkflowRun.objects.request_pass(claim.run_id)
    with transaction.atomic():
        picked = WorkflowRun.objects.claim_due_pass(30, lease_holder="a-pass")
        assert picked is not None and picked.run_id == claim.run_id
        assert picked.lease is not None
        blocked = start_blocked(lambda: complete_alone(claim))
        assert blocked.waited, "the completion did not wait for the pick's run row"
    done = blocked.result()
    assert (done.written, done.completed, done.pass_asked) == (True, False, True)
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert run.status == RunStatus.RUNNING and run.pass_due_at is not None
    assert Lease.objects.with_state().get(key=run_lease_key(claim.run_id)).holder == "a-pass"


@pytest.mark.postgres_only
def test_a_task_costs_the_worker_two_statements() -> None:
    results = [t.add.enqueue(n, 1) for n in range(3)]
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["default"])
    assert worker.work_once() is True  # steps first (once per poll interval): the first task
    assert worker.work_once() is True  # passes first (once per poll interval), then a task
    with CaptureQueriesContext(connection) as driven:
        assert worker.work_once() is True  # after a task, the next step is looked for first
    statements = [q["sql"] for q in driven.captured_queries]
    # The step claim (+ its attempt row), then its result + the run's completion under a run
    # lease held for that instant (+ the pick of the next due run: none here).
    assert len(statements) == 2, statements
    assert "claim_step" in statements[0] and "complete_run_alone" in statements[1], statements
    for n, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, n + 1)
        lease = Lease.objects.with_state().get(key=run_lease_key(result.id))
        assert lease.state == "released"
