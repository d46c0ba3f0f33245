"""A task's result completes its run in the write of that result, taking the run lease only
for that instant (``WorkflowStep.objects.set_result_completing_run`` with ``lease=None``):
no pass, no replay; where steps are what is due, the same write claims the next one. On
PostgreSQL one statement (and a task of a backlog costs the worker one); on the
portable path (every backend, and PostgreSQL with ``TUNED_SQL`` off) one transaction that
locks the step, its run, then the run lease. A pass that holds the run lease is never
overtaken: the result is written and the run's pass asked for, and that pass completes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
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

from django_leases import signals
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
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.registry import one_step_output
from django_leases.workflows.values import Claim, RunCompletion, run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import lapse_step_lease, race, start_blocked, tuned_sql
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


def complete_alone(
    claim: Claim, attempt: int = 1, holder: str = "instant", **more: Any
) -> RunCompletion:
    """Write ``add``'s result (3) for ``attempt`` with its run's completion, holding no run
    lease; ``more``: further arguments of ``set_result_completing_run``."""
    return WorkflowStep.objects.set_result_completing_run(
        claim.step_id,
        {"return_value": 3, "worker_id": "w"},
        attempt,
        output=3,
        lease=None,
        lease_holder=holder,
        **more,
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
def test_a_task_of_a_backlog_costs_the_worker_one_statement() -> None:
    results = [t.add.enqueue(n, 1) for n in range(6)]
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["default"])
    # Steps first (once per poll interval): the first task, whose write picks the next due
    # pass (passes come first once per poll interval; none is due).
    assert worker.work_once() is True
    with CaptureQueriesContext(connection) as driven:
        # After a task, steps first: the claim of the next, then each task's result + its
        # run's completion under a run lease held for that instant + the claim of the next.
        assert worker.work_once() is True
    statements = [q["sql"] for q in driven.captured_queries]
    assert len(statements) == 6, statements
    assert "claim_step" in statements[0], statements
    assert all("complete_run_alone_claiming" in sql for sql in statements[1:]), statements
    assert worker.work_once() is False
    for n, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, n + 1)
        lease = Lease.objects.with_state().get(key=run_lease_key(result.id))
        assert lease.state == "released"


def complete_claiming(
    claim: Claim, queues: Sequence[str] | None = ("default",), attempt: int = 1
) -> RunCompletion:
    """``complete_alone`` that also claims the next due step of ``queues``."""
    return complete_alone(
        claim,
        attempt,
        next_step_ttl=30,
        next_step_queues=None if queues is None else list(queues),
    )


@pytest.mark.parametrize("queues", [["default"], None], ids=["unlimited", "every-queue"])
def test_the_write_of_a_result_claims_the_next_due_step(
    sent_as: str, queues: list[str] | None
) -> None:
    """Every queue includes the suite's limited ones: the claim follows the write then, as
    ``claim_due`` (on PostgreSQL the portable claim), instead of joining it."""
    first = claimed_task()
    second = t.add.enqueue(2, 3)
    started: list[tuple[int, int, Any]] = []

    def on_started(sender: Any, step_id: int, attempt: int, waited: Any, **kw: Any) -> None:
        started.append((step_id, attempt, waited))

    signals.step_attempt_started.connect(on_started)
    try:
        done = complete_claiming(first, queues)
    finally:
        signals.step_attempt_started.disconnect(on_started)
    assert (done.written, done.completed, done.next_pass) == (True, True, None)
    claim = done.next_step
    assert claim is not None and claim.run_id == uuid.UUID(second.id)
    assert (claim.attempt, claim.lease_ttl, claim.data["args"]) == (1, 30, [2, 3])
    assert (claim.run_workflow, claim.step_name) == (TASK_WORKFLOW, TASK_STEP)
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert step.status == StepStatus.RUNNING and step.lease_expires_at is not None
    attempt = WorkflowStepAttempt.objects.get(step_id=claim.step_id)
    assert (attempt.attempt, attempt.status) == (1, AttemptStatus.RUNNING)
    if claim.started_at is not None:  # read back by the tuned statement
        assert claim.started_at == attempt.started_at
    assert [(step_id, n) for step_id, n, _ in started] == [(claim.step_id, 1)]
    assert WorkflowRun.objects.get(pk=first.run_id).status == RunStatus.COMPLETED
    assert t.add.get_result(second.id).status == TaskResultStatus.RUNNING
    # Nothing more is due: the next write claims nothing.
    assert complete_claiming(claim, queues).next_step is None


def test_a_refused_result_still_claims_the_next_due_step(sent_as: str) -> None:
    claim = claimed_task(t.flaky, 1)  # the "retrying" backend: attempts left
    lapse_step_lease(claim.step_id)
    again = WorkflowStep.objects.claim_due(30, queues=["default"])
    assert again is not None and (again.step_id, again.attempt) == (claim.step_id, 2)
    other = t.add.enqueue(4, 5)
    done = complete_claiming(claim, attempt=1)
    assert (done.written, done.completed) == (False, False)
    assert done.next_step is not None and done.next_step.run_id == uuid.UUID(other.id)
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert (step.status, step.attempt, step.result) == (StepStatus.RUNNING, 2, None)


def test_a_lapsed_step_is_taken_over_before_a_waiting_one(sent_as: str) -> None:
    """The tuned write claims nothing while a lost worker's step waits (it says so): the
    claim then goes the portable way, which takes that step over first."""
    first = claimed_task()
    lost = claimed_task(t.flaky, 1)
    lapse_step_lease(lost.step_id)
    t.add.enqueue(6, 7)
    done = complete_claiming(first)
    assert done.completed
    assert done.next_step is not None
    assert (done.next_step.step_id, done.next_step.attempt) == (lost.step_id, 2)


def test_only_the_queues_asked_for_are_claimed_from(sent_as: str) -> None:
    first = claimed_task()
    waiting = t.add.enqueue(8, 9)
    done = complete_claiming(first, ["tests-mail"])
    assert done.completed and done.next_step is None
    assert t.add.get_result(waiting.id).status == TaskResultStatus.READY


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_a_limited_queue_is_claimed_from_under_its_limit(tuned: bool) -> None:
    """``tests-one`` runs one step at a time: the write claims none of its steps while one
    runs, and one once it has ended."""
    first = claimed_task()
    run_id = start_workflow("tests.sub.two-steps", {})
    for name in ("a", "b"):
        WorkflowStep.objects.schedule(run_id, name, "tests.sub.echo", {}, queue="tests-one")
    with tuned_sql(tuned):
        running = WorkflowStep.objects.claim_due(30, queues=["tests-one"])
        assert running is not None
        done = complete_claiming(first, ["tests-one"])
        assert done.completed and done.next_step is None
        WorkflowStep.objects.set_result(running.step_id, "ok", running.attempt)
        second = claimed_task()
        done = complete_claiming(second, ["tests-one"])
    assert done.next_step is not None and done.next_step.run_id == run_id
    assert done.next_step.step_name in {"a", "b"} - {running.step_name}


def test_a_pick_and_a_claim_together_are_refused_and_nothing_is_written(sent_as: str) -> None:
    claim = claimed_task()
    with pytest.raises(ValueError, match="not both"):
        WorkflowStep.objects.set_result_completing_run(
            claim.step_id,
            {"return_value": 3},
            1,
            output=3,
            lease=None,
            lease_holder="instant",
            next_pass_holder="next",
            next_step_ttl=30,
        )
    assert WorkflowStep.objects.get(pk=claim.step_id).status == StepStatus.RUNNING
    assert WorkflowRun.objects.get(pk=claim.run_id).status == RunStatus.RUNNING


def test_racing_writes_claim_each_task_once(sent_as: str) -> None:
    """Four threads each chain their tasks as a worker does (the write of each result claims
    the next): every task is claimed once and completed with its own result."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: there is no race to lose")
    results = [t.add.enqueue(n, 0) for n in range(24)]

    def chain() -> list[uuid.UUID]:
        ran: list[uuid.UUID] = []
        claim = WorkflowStep.objects.claim_due(30, queues=["default"])
        while claim is not None:
            ran.append(claim.run_id)
            value = claim.data["args"][0]
            claim = WorkflowStep.objects.set_result_completing_run(
                claim.step_id,
                {"return_value": value, "worker_id": "w"},
                claim.attempt,
                output=value,
                lease=None,
                lease_holder=f"instant-{claim.run_id}",
                next_step_ttl=30,
                next_step_queues=["default"],
            ).next_step
        return ran

    found = race([chain] * 4)
    assert all(isinstance(chained, list) for chained in found), found
    ran = [run_id for chained in found for run_id in chained]
    assert sorted(ran) == sorted(uuid.UUID(r.id) for r in results), "each task claimed once"
    for n, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, n)
    assert not WorkflowStepAttempt.objects.exclude(attempt=1).exists()
