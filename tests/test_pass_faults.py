"""A statement of the library's own fails inside a unit of work (issue 25, items 2 and 3).

A transient ``DatabaseError`` raised by the library's own statements ends the unit of work
(the worker backs off; nothing is lost); it never fails a run, never throws away a result
the worker holds, and never leaves a run idle for the run lease's TTL.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from typing import Any

import pytest
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models import Q

from django_leases.clock import DbNow, db_now
from django_leases.models import Lease, RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.values import STEP_TRANSACTION_CUT_SHORT
from django_leases.workflows.worker import Worker
from tests.helpers import work_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

_lock = threading.Lock()
_executions: list[tuple[str, str, int]] = []


def _note(ctx: Any) -> None:
    with _lock:
        _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))


@step_function("tests.pass-faults-count")
def counted(data: Any, ctx: Any) -> Any:
    """Notes each execution: (run, step, attempt)."""
    _note(ctx)
    return {"s": ctx.step_name}


@step_function("tests.pass-faults-tx", transactional=True)
def counted_tx(data: Any, ctx: Any) -> Any:
    """A transactional step that notes each execution (noted even if it rolls back: an
    execution is an execution)."""
    _note(ctx)
    return {"t": ctx.step_name}


def _worker(**options: Any) -> Worker:
    return Worker(1, step_lease_ttl=30, poll_interval=3600, **options)


def _idle(run_id: Any) -> str | None:
    """Why running run ``run_id`` waits for a lease to lapse (``None``: it does not): its
    pass due later, or its run lease held, with no step of it running or due."""
    run = WorkflowRun.objects.get(pk=run_id)
    if run.status != RunStatus.RUNNING:
        return None
    live = Lease.objects.filter(key=f"workflow-run:{run_id}", expires_at__gt=db_now()).exists()
    later = not WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=db_now()).exists()
    steps = WorkflowStep.objects.filter(run_id=run_id).filter(
        Q(status="running", lease_expires_at__gt=db_now())
        | Q(status__in=["pending", "scheduled"], available_at__lte=db_now())
    )
    if (later or live) and not steps.exists():
        return f"pass due at {run.pass_due_at}, run lease live: {live}"
    return None


# -- item 3: a pass picked whose run lease could not be taken -------------------------------------


@workflow("tests.pass-faults-plain")
def plain(run: Any, input: Any) -> Any:
    return run.step("only", "tests.pass-faults-count", {}, retries=2)


def test_a_pass_picked_whose_run_lease_acquire_fails_is_due_again_at_once(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portable pick of a due pass pushes ``pass_due_at`` a run-lease TTL ahead and
    takes the run lease. When the acquire fails (a dropped connection), the unit of work
    ends — and the run is not left idle for the run lease's TTL: its pass is due again at
    once and no run lease is held."""
    from django_leases.models.lease import LeaseQuerySet

    real = LeaseQuerySet.acquire
    failed: list[str] = []

    def dropped_once(self: Any, key: str, holder: str, ttl: Any) -> Any:
        if not failed and key.startswith("workflow-run:"):
            failed.append(key)
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, key, holder, ttl)

    run_id = start_workflow("tests.pass-faults-plain", {})
    worker = _worker()
    monkeypatch.setattr(LeaseQuerySet, "acquire", dropped_once)
    with suppress(DatabaseError, InterfaceError):
        worker.work_once()
    monkeypatch.setattr(LeaseQuerySet, "acquire", real)
    if not failed:
        pytest.skip("the pick takes the run lease in its own statement here (tuned)")
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING
    due = WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=db_now()).exists()
    held = Lease.objects.filter(key=f"workflow-run:{run_id}", expires_at__gt=db_now())
    assert due and not held.exists(), (
        f"the run idles: pass due at {run.pass_due_at}, run lease held: {held.exists()}"
    )
    work_until_idle(worker)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"s": "only"})


def test_a_pick_whose_reply_is_lost_leaves_the_pass_due(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pick of a due pass lands (the run lease taken for the worker's holder, the pass
    pushed ahead) and its reply is lost: the worker releases what its holder holds and the
    pass is due again at once."""
    from django_leases.models.passes import RunPasses

    real = RunPasses._pick_pass
    lost: list[Any] = []

    def lost_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        picked = real(self, *args, **kwargs)
        if not lost and picked is not None:
            lost.append(picked)
            raise OperationalError("server closed the connection unexpectedly")
        return picked

    run_id = start_workflow("tests.pass-faults-plain", {})
    worker = _worker()
    monkeypatch.setattr(RunPasses, "_pick_pass", lost_once)
    with suppress(DatabaseError, InterfaceError):
        worker.work_once()
    monkeypatch.undo()
    assert lost, "no pick's reply was lost"
    assert _idle(run_id) is None, _idle(run_id)
    work_until_idle(worker)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"s": "only"})


# -- items 2 and 3: a transactional step's own write fails ----------------------------------------


@workflow("tests.pass-faults-tx-once")
def tx_once(run: Any, input: Any) -> Any:
    return run.step("t", "tests.pass-faults-tx", {}, retries=0)


@workflow("tests.pass-faults-tx-then")
def tx_then(run: Any, input: Any) -> Any:
    t = run.step("t", "tests.pass-faults-tx", {}, retries=0)
    u = run.step("u", "tests.pass-faults-count", {}, retries=0)
    return [t, u]


def _drop_lock_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the fenced lock of a transactional step's row (the library's first statement
    in the step's transaction once the function returned) fail once as a dropped
    connection does; returns the list the failed step's id is put in."""
    from django_leases.models.exactly import StepTransactions

    real = StepTransactions.lock_for_result
    failed: list[int] = []

    def dropped_once(self: Any, step_id: int, attempt: int, **options: Any) -> None:
        if not failed:
            failed.append(step_id)
            raise OperationalError("server closed the connection unexpectedly")
        real(self, step_id, attempt, **options)

    monkeypatch.setattr(StepTransactions, "lock_for_result", dropped_once)
    return failed


@pytest.mark.parametrize("flow", ["tx-once", "tx-then"])
def test_a_transactional_steps_result_write_dropped_does_not_fail_the_run(
    sql_path: str, flow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's own statement inside a transactional step's transaction (the fenced
    lock of the step row before its result is written) fails as a dropped connection does:
    the transaction rolls back, nothing of the attempt is kept. That is a transient database
    error of the library's, not the step function's error: the run is not failed for it
    (here the step has no retry left to absorb it), the attempt is given back so the next
    one runs at once, and the run is not left idle."""
    _executions.clear()
    run_id = start_workflow(f"tests.pass-faults-{flow}", {})
    failed = _drop_lock_once(monkeypatch)
    worker = _worker()
    assert work_until_idle(worker) == 1
    monkeypatch.undo()
    assert failed, "the result write was never reached"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    output = {"t": "t"} if flow == "tx-once" else [{"t": "t"}, {"s": "u"}]
    assert run.output == output
    ran = [(s, a) for _, s, a in _executions]
    assert ran == [("t", 1), ("t", 2)] + ([("u", 1)] if flow == "tx-then" else [])


def test_a_library_error_on_every_attempt_fails_the_step_after_the_give_backs(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fenced lock fails on every attempt: after ``MAX_GIVE_BACKS`` attempts given back
    (not counted against ``retries=0``), the next one counts, and the run fails — an error
    that recurs every time is not retried for ever."""
    from django_leases.models.exactly import MAX_GIVE_BACKS, StepTransactions

    def dropped(self: Any, step_id: int, attempt: int, **options: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    _executions.clear()
    run_id = start_workflow("tests.pass-faults-tx-once", {})
    monkeypatch.setattr(StepTransactions, "lock_for_result", dropped)
    assert work_until_idle(_worker()) == MAX_GIVE_BACKS + 1
    monkeypatch.undo()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED, run.status
    assert [a for _, s, a in _executions] == list(range(1, MAX_GIVE_BACKS + 2))
    step = WorkflowStep.objects.get(run_id=run_id, step_name="t")
    assert (step.status, step.retries, step.error["code"]) == (
        "failed",
        MAX_GIVE_BACKS,
        STEP_TRANSACTION_CUT_SHORT,
    )


@workflow("tests.pass-faults-given-back")
def given_back_flow(run: Any, input: Any) -> Any:
    return run.step("t", "tests.pass-faults-count", {}, **input)


def _cut_short_step(options: dict[str, Any]) -> tuple[Any, WorkflowStep]:
    """A run whose step ``t`` (of queue ``tests-given-back``, with ``options``) is due, the
    pass that scheduled it over (no pass of the run due)."""
    run = WorkflowRun.objects.start("tests.pass-faults-given-back", options)
    step = WorkflowStep.objects.schedule(
        run.id, "t", "tests.pass-faults-count", queue="tests-given-back", **options
    )
    WorkflowRun.objects.filter(pk=run.id).update(pass_due_at=None)
    return run, step


def _give_back(step_id: int, times: int) -> None:
    """Claim step ``step_id`` and give its attempt back, ``times`` times over."""
    for _ in range(times):
        claim = WorkflowStep.objects.claim_due(30, queues=["tests-given-back"])
        assert claim is not None and claim.step_id == step_id
        assert WorkflowStep.objects.give_back(step_id, claim.attempt, "cut short")


def test_a_give_back_past_the_bound_is_a_failed_attempt_with_its_retry_delay(
    sql_path: str,
) -> None:
    from django_leases.models.exactly import MAX_GIVE_BACKS

    _, step = _cut_short_step({"retries": 3, "retry_delay": 600})
    _give_back(step.pk, MAX_GIVE_BACKS + 1)
    row = WorkflowStep.objects.get(pk=step.pk)
    assert (row.status, row.attempt, row.retries) == ("failed", MAX_GIVE_BACKS + 1, 3 + 10)
    assert WorkflowStep.objects.filter(pk=step.pk, available_at__gt=DbNow()).exists(), (
        "the counted attempt is due at once: no retry delay"
    )


def test_a_give_back_past_the_bound_that_ends_the_retries_asks_for_the_runs_pass(
    sql_path: str,
) -> None:
    from django_leases.models.exactly import MAX_GIVE_BACKS

    run, step = _cut_short_step({"retries": 0})
    _give_back(step.pk, MAX_GIVE_BACKS + 1)
    row = WorkflowStep.objects.get(pk=step.pk)
    assert row.status == "failed" and row.attempt == row.retries + 1
    assert WorkflowRun.objects.filter(pk=run.id, pass_due_at__lte=db_now()).exists(), (
        "the step failed for good and no pass of its run is due: the run would hang"
    )
    work_until_idle(_worker())
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.FAILED


def test_an_operators_retry_starts_the_count_of_give_backs_again(sql_path: str) -> None:
    from django_leases.models.exactly import MAX_GIVE_BACKS

    run, step = _cut_short_step({"retries": 0})
    _give_back(step.pk, MAX_GIVE_BACKS + 1)
    work_until_idle(_worker())  # the run fails with its step
    WorkflowRun.objects.retry_step(run.id, "t")
    _give_back(step.pk, 1)
    row = WorkflowStep.objects.get(pk=step.pk)
    assert (row.given_back, row.attempt < row.retries + 1) == (1, True), (
        "one transient error after an operator's retry failed the step for good"
    )


def test_a_queued_transactional_step_failing_every_attempt_fails_its_run(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the bound test above, for a step claimed from its own queue (not carried by the
    pass): once the give-backs are spent, the run fails rather than waits."""
    from django_leases.models.exactly import StepTransactions

    def dropped(self: Any, step_id: int, attempt: int, **options: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    run_id = start_workflow("tests.pass-faults-tx-queued", {})
    work_until_idle(_worker(queues=["default"]))  # the pass creates "t" for its queue's workers
    monkeypatch.setattr(StepTransactions, "lock_for_result", dropped)
    work_until_idle(_worker(queues=["tests-other"]))
    monkeypatch.undo()
    work_until_idle(_worker())
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED, (run.status, run.pass_due_at)


@workflow("tests.pass-faults-tx-queued")
def tx_queued(run: Any, input: Any) -> Any:
    return run.step("t", "tests.pass-faults-tx", {}, retries=0, queue="tests-other")


def test_a_queued_transactional_steps_result_write_dropped_does_not_fail_the_run(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a transactional step claimed from its queue (its result written at the
    end of its own transaction, not carried): the attempt is given back, the next one runs
    at once, the run completes."""
    _executions.clear()
    run_id = start_workflow("tests.pass-faults-tx-queued", {})
    work_until_idle(_worker(queues=["default"]))  # the pass creates "t" for its queue's workers
    failed = _drop_lock_once(monkeypatch)
    assert work_until_idle(_worker(queues=["tests-other"])) == 1
    monkeypatch.undo()
    assert failed, "the result write was never reached"
    work_until_idle(_worker())
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"t": "t"}), run.error
    assert [(s, a) for _, s, a in _executions] == [("t", 1), ("t", 2)]


def test_a_transactional_steps_own_database_error_fails_the_attempt(sql_path: str) -> None:
    """The line: a database error the step function's own queries raise (and let out) is
    the attempt's failure, as any exception of the step's; with no retry left the run
    fails ``STEP_FAILED``."""
    run_id = start_workflow("tests.pass-faults-tx-raises", {})
    work_until_idle(_worker())
    run = WorkflowRun.objects.get(pk=run_id)
    error = run.error or {}
    assert (run.status, error.get("code")) == (RunStatus.FAILED, "STEP_FAILED"), error


@step_function("tests.pass-faults-tx-raising", transactional=True)
def raising_tx(data: Any, ctx: Any) -> Any:
    """Raises a database error of its own (a duplicate row)."""
    from tests.workapp.models import Account

    Account.objects.create(name="pass-faults")
    Account.objects.create(name="pass-faults")
    return {}


@workflow("tests.pass-faults-tx-raises")
def tx_raises(run: Any, input: Any) -> Any:
    return run.step("t", "tests.pass-faults-tx-raising", {}, retries=0)


@pytest.mark.parametrize("flow", ["tx-once", "tx-then"])
def test_a_transactional_steps_commit_reply_lost_leaves_no_idle_run(
    sql_path: str, flow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transactional step's transaction commits (its writes and result, with the
    workflow's next action: the run's completion, or the next step claimed for this
    worker) and the reply to the commit is lost. The run is not left idle for a lease's
    TTL — it goes on at once — and no attempt runs twice."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    real_commit = BaseDatabaseWrapper._commit  # type: ignore[attr-defined]
    lost: list[bool] = []
    armed = threading.Event()

    def commit_then_lose(self: Any) -> Any:
        done = real_commit(self)
        if armed.is_set() and not lost and _executions:
            lost.append(True)
            raise OperationalError("server closed the connection unexpectedly")
        return done

    _executions.clear()
    run_id = start_workflow(f"tests.pass-faults-{flow}", {})
    monkeypatch.setattr(BaseDatabaseWrapper, "_commit", commit_then_lose)
    armed.set()
    worker = _worker()
    work_until_idle(worker)
    armed.clear()
    monkeypatch.undo()
    assert lost, "no commit reply was lost"
    run = WorkflowRun.objects.get(pk=run_id)
    ran = [(s, a) for _, s, a in _executions]
    assert ran[0] == ("t", 1) and ran.count(("t", 1)) == 1 and ("t", 2) not in ran, ran
    output = {"t": "t"} if flow == "tx-once" else [{"t": "t"}, {"s": "u"}]
    assert (run.status, run.output) == (RunStatus.COMPLETED, output), (
        f"{run.status}: {_idle(run_id)}"
    )


# -- item 2: the pass a worker takes after a step it claimed from the queue -----------------------


@workflow("tests.pass-faults-queued")
def queued(run: Any, input: Any) -> Any:
    a = run.step("q", "tests.pass-faults-count", {}, retries=2, queue="tests-other")
    b = run.step("after", "tests.pass-faults-count", {}, retries=2)
    return [a, b]


def test_a_dropped_connection_taking_the_pass_keeps_the_steps_result(
    sql_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claims a step from its queue, runs it, then takes its run's pass
    (``take_pass``) to carry the result into it; that statement fails as a dropped
    connection does. The unit of work ends — but the result the worker holds is written on
    its own (fenced), not thrown away for another attempt to run the step again."""
    from django_leases.models.passes import RunPasses

    real = RunPasses.take_pass
    failed: list[str] = []

    def dropped_once(self: Any, run_id: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(str(run_id))
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, run_id, *args, **kwargs)

    _executions.clear()
    run_id = start_workflow("tests.pass-faults-queued", {})
    work_until_idle(_worker(queues=["default"]))  # the pass creates "q" for its queue's workers
    other = _worker(queues=["tests-other"])
    monkeypatch.setattr(RunPasses, "take_pass", dropped_once)
    assert work_until_idle(other) == 1
    monkeypatch.undo()
    assert failed, "take_pass was never called"
    step = WorkflowStep.objects.get(run_id=run_id, step_name="q")
    assert (step.status, step.attempt) == ("succeeded", 1)
    assert _idle(run_id) is None, _idle(run_id)
    work_until_idle(_worker())
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, [{"s": "q"}, {"s": "after"}])
    ran = [(s, a) for r, s, a in _executions if r == str(run_id)]
    assert ran == [("q", 1), ("after", 1)], ran


@step_function("tests.pass-faults-tx-swallows", transactional=True)
def swallowing_tx(data: Any, ctx: Any) -> Any:
    """Catches a database error of its own without a savepoint and returns."""
    from django.db import IntegrityError

    from tests.workapp.models import Account

    Account.objects.create(name="pass-faults")
    with suppress(IntegrityError):
        Account.objects.create(name="pass-faults")
    return {}


@workflow("tests.pass-faults-tx-swallows")
def tx_swallows(run: Any, input: Any) -> Any:
    return run.step("t", "tests.pass-faults-tx-swallows", {}, retries=0)


def test_a_transactional_step_that_leaves_its_transaction_failed_fails_the_attempt(
    sql_path: str,
) -> None:
    """The line, on PostgreSQL: a step function that catches its own database error without
    a savepoint leaves its transaction failed (every later statement would fail "current
    transaction is aborted", the library's result write first). That is the step's error,
    not a transient one of the library's: the attempt fails (no retry left: the run fails),
    it is not given back for ever."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL aborts a transaction on a failed statement")
    run_id = start_workflow("tests.pass-faults-tx-swallows", {})
    work_until_idle(_worker())
    run = WorkflowRun.objects.get(pk=run_id)
    error = run.error or {}
    assert (run.status, error.get("code")) == (RunStatus.FAILED, "STEP_FAILED"), error
    assert "without rolling back to a savepoint" in error["message"]
