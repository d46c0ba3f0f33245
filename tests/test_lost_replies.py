"""Lost replies: a write that committed but whose caller never heard so.

A fault point (:mod:`django_leases.faults`) makes the write fail exactly where a lost reply
would: its rows are committed and the writer sees ``OperationalError``. The worker tries the
write again on a fresh connection; what it must never do is take for its own what another
worker did meanwhile. One attempt of a step runs once (DESIGN §5: a token, here an attempt,
names one holder).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError

from django_leases import faults
from django_leases.clock import db_now
from django_leases.models import Lease, RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import execute_step, start_workflow
from django_leases.workflows.values import Claim, run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import on_another_thread, spend_steps_first, tuned_sql
from tests.workapp.models import LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)

_lock = threading.Lock()
_executions: list[tuple[str, str, int]] = []


@step_function("tests.lost-reply-counted")
def counted_step(data: Any, ctx: Any) -> Any:
    """Records each execution: (run, step, attempt)."""
    with _lock:
        _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))
    return {"name": ctx.step_name}


@workflow("tests.lost-reply-two-steps")
def two_steps(run: Any, input: Any) -> Any:
    options = input["options"]
    a = run.step("a", "tests.lost-reply-counted", {}, retries=2, **options)
    b = run.step("b", "tests.lost-reply-counted", {}, retries=2, **options)
    return [a, b]


#: The ways a step's result and the next step are written: the tuned statement (PostgreSQL;
#: the portable path elsewhere), the portable path on every backend, and steps the tuned
#: statement does not take (a timeout, another queue, a limited queue: two writes then).
PATHS: dict[str, tuple[bool, dict[str, Any]]] = {
    "tuned": (True, {}),
    "portable": (False, {}),
    "timeout": (True, {"timeout": 600}),
    "other-queue": (True, {"queue": "tests-other"}),
    "limited-queue": (True, {"queue": "tests-limited"}),
}


@pytest.fixture(params=sorted(PATHS))
def path(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    tuned, options = PATHS[request.param]
    with tuned_sql(tuned):
        yield options


def lost_reply_once(step_name: str, before: Callable[[], None]) -> Callable[..., None]:
    """A hook that, the first time the write creating step ``step_name`` reaches it, runs
    ``before`` and then fails as a lost reply does; later times it does nothing (the write
    tried again goes through)."""
    fired = threading.Event()

    def hook(**context: Any) -> None:
        if fired.is_set() or context["step_name"] != step_name:
            return
        fired.set()
        before()
        raise OperationalError("server closed the connection unexpectedly")

    return hook


def test_a_retry_after_a_lost_reply_never_adopts_another_workers_claim(
    path: dict[str, Any],
) -> None:
    """Worker A records step ``a`` and creates ``b``; the reply is lost. Before A tries
    again, worker B looks for due steps (as any worker does at any time) and claims what it
    can; then A's retry goes through and B runs whatever it claimed. Every attempt of every
    step ran once, and the run completed with A's or B's results, never both."""
    _executions.clear()
    run_id = start_workflow("tests.lost-reply-two-steps", {"options": path})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    stolen: list[Claim | None] = []

    def second_worker_claims() -> None:
        stolen.append(on_another_thread(lambda: WorkflowStep.objects.claim_due(30)))

    with faults.injected("workflow.next-step-written", lost_reply_once("b", second_worker_claims)):
        assert worker.work_once() is True
    assert len(stolen) == 1, "the fault point was not reached: the test proves nothing"
    claim = stolen[0]
    if claim is not None:  # B runs what it claimed, as a worker would
        on_another_thread(lambda: execute_step(claim))
    for _ in range(3):  # whatever is due still (the pass B's result asked for, say)
        if not worker.work_once():
            break
    ran = [(step, attempt) for run, step, attempt in _executions if run == str(run_id)]
    assert sorted(ran) == sorted(set(ran)), f"an attempt ran twice: {ran}"
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, [{"name": "a"}, {"name": "b"}])


# -- a transactional step's commit ---------------------------------------------------------------


@step_function("tests.lost-reply-transactional", transactional=True)
def transactional_step(data: Any, ctx: Any) -> Any:
    """Transactional: a ledger row for this attempt, and each execution recorded."""
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    with _lock:
        _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))
    return {"name": ctx.step_name}


@workflow("tests.lost-reply-transactional-then-plain")
def transactional_then_plain(run: Any, input: Any) -> Any:
    a = run.step("a", "tests.lost-reply-transactional", {}, retries=2)
    b = run.step("b", "tests.lost-reply-counted", {}, retries=2)
    return [a, b]


def test_a_lost_commit_reply_of_a_transactional_step_runs_no_attempt_twice(
    sql_path: str,
) -> None:
    """Step ``a`` is transactional: its row, its result and ``b`` created and claimed for
    the worker commit in one transaction, and the commit's reply is lost. Another worker
    looking for due steps meanwhile finds nothing (``b`` is claimed). The unit of work ends
    (the error is raised, as a database error of the library's own ends one); on a fresh
    connection the worker finds that the commit landed (``a`` succeeded: its attempt cannot
    be given back) and hands ``b`` — claimed by that commit for this worker, never run —
    back unclaimed, and releases the run lease: the run goes on at once, no lease waited
    out. Every attempt ran at most once, and ``a``'s row was written once."""
    _executions.clear()
    run_id = start_workflow("tests.lost-reply-transactional-then-plain", {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    stolen: list[Claim | None] = []

    def second_worker_claims() -> None:
        stolen.append(on_another_thread(lambda: WorkflowStep.objects.claim_due(30)))

    lost = lost_reply_once("a", second_worker_claims)
    with (
        faults.injected("workflow.step-transaction-committed", lost),
        pytest.raises(OperationalError),
    ):
        worker.work_once()
    assert stolen == [None], "the fault point was not reached, or b was not claimed"
    steps = WorkflowStep.objects.filter(run_id=run_id)
    assert dict(steps.values_list("step_name", "status")) == {"a": "succeeded", "b": "pending"}
    live = Lease.objects.filter(key=run_lease_key(run_id), expires_at__gt=db_now())
    assert not live.exists(), "the run lease was left to lapse"
    for _ in range(5):
        if not worker.work_once():
            break
    ran = [(step, attempt) for run, step, attempt in _executions if run == str(run_id)]
    assert sorted(ran) == sorted(set(ran)), f"an attempt ran twice: {ran}"
    assert ran == [("a", 1), ("b", 1)]
    rows = LedgerEntry.objects.filter(run_id=run_id).values_list("step", "attempt")
    assert list(rows) == [("a", 1)]
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, [{"name": "a"}, {"name": "b"}])


# -- transient errors inside a pass ---------------------------------------------------------------


@workflow("tests.lost-reply-one-step")
def one_step(run: Any, input: Any) -> Any:
    return run.step("only", "tests.lost-reply-counted", {}, retries=0)


@pytest.fixture(params=["tuned", "portable"])
def sql_path(request: pytest.FixtureRequest) -> Iterator[str]:
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("server closed the connection unexpectedly"),
        # What a driver raises for a connection it found closed: not a DatabaseError.
        InterfaceError("connection already closed"),
    ],
    ids=["operational", "interface"],
)
def test_a_database_error_inside_a_pass_ends_the_unit_of_work_not_the_run(
    sql_path: str, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's own statement inside the workflow function (the pass creating and
    claiming its step) fails as a dropped connection does: the run is not failed — the error
    ends the worker's unit of work, as a dead worker's would — and the run lease is released
    with the run's next pass due at once, so another pass follows without waiting out the
    lease's TTL. That pass runs the run to its end."""
    from django_leases.models.workflow import WorkflowStepQuerySet

    _executions.clear()
    run_id = start_workflow("tests.lost-reply-one-step", {})
    real = WorkflowStepQuerySet.schedule_claimed
    failed: list[str] = []

    def dropped_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append("dropped")
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(WorkflowStepQuerySet, "schedule_claimed", dropped_once)
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    with pytest.raises(type(error)):
        worker.work_once()
    assert failed == ["dropped"]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING, run.error
    lease = Lease.objects.current(run_lease_key(run_id))
    assert lease is None, "the run lease was kept: the next pass would wait out its TTL"
    due_now = WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=db_now())
    assert due_now.exists(), "no pass is due now"
    assert worker.work_once() is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"name": "only"})
    assert [(step, attempt) for _, step, attempt in _executions] == [("only", 1)]


def test_a_workflow_s_own_database_error_still_fails_its_run(sql_path: str) -> None:
    """Only the library's own statements are spared: an error the workflow code raises — a
    DatabaseError of its own included — fails the run as any workflow error does."""
    run_id = start_workflow("tests.lost-reply-own-error", {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    assert worker.work_once() is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "OperationalError"


@workflow("tests.lost-reply-own-error")
def own_error(run: Any, input: Any) -> Any:
    raise OperationalError("the workflow's own query failed")
