"""The worker keeps the run it drives; on PostgreSQL a one-step run costs three statements
(two of them calls of the functions the migrations install). Each test runs on the tuned
statements and again on the portable ORM path (``TUNED_SQL`` off), which keeps the rules."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.checks import workflow_functions_check
from django_leases.clock import db_now
from django_leases.exceptions import WorkflowFunctionsMissing, WorkflowStepSupersededError
from django_leases.models import (
    AttemptStatus,
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.models.workflow import functions
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.values import NextStep, run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import spend_steps_first, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@step_function("tests.hot-path")
def hot_step(data: Any, ctx: Any) -> Any:
    return {"n": data["n"], "attempt": ctx.attempt}


@workflow("tests.hot-path-one")
def one_step(run: Any, input: Any) -> Any:
    return run.step("only", "tests.hot-path", {"n": 1})


@workflow("tests.hot-path-two")
def two_steps(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.hot-path", {"n": 1})
    second = run.step("second", "tests.hot-path", {"n": first["n"] + 1})
    return [first, second]


def test_one_unit_of_work_drives_a_run_through_all_its_steps() -> None:
    run_id = start_workflow("tests.hot-path-two", {})
    worker = Worker(1, step_lease_ttl=30)
    assert worker.work_once() is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, "the worker handed the run to the queue"
    assert run.output == [{"n": 1, "attempt": 1}, {"n": 2, "attempt": 1}]
    assert run.pass_due_at is None
    steps = WorkflowStep.objects.filter(run_id=run_id).order_by("id")
    assert [(s.step_name, s.status, s.attempt) for s in steps] == [
        ("first", StepStatus.SUCCEEDED, 1),
        ("second", StepStatus.SUCCEEDED, 1),
    ]
    history = WorkflowStepAttempt.objects.filter(step__run_id=run_id).order_by("id")
    assert [(a.attempt, a.status) for a in history] == [
        (1, AttemptStatus.SUCCEEDED),
        (1, AttemptStatus.SUCCEEDED),
    ]
    assert worker.work_once() is False, "work was left behind"


@pytest.fixture(params=["tuned", "portable"])
def sent_as(request: pytest.FixtureRequest) -> Iterator[str]:
    """PostgreSQL's hot path on its tuned statements (the functions the migrations install),
    then on the portable ORM path (``TUNED_SQL`` off)."""
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


def _run_in_one_unit(workflow_name: str) -> WorkflowRun:
    """Start a run of ``workflow_name``; one unit of work of a fresh worker drives it."""
    run_id = start_workflow(workflow_name, {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    assert worker.work_once() is True
    return WorkflowRun.objects.get(pk=run_id)


@pytest.mark.postgres_only
def test_a_one_step_run_costs_one_statement_to_start_and_three_to_drive() -> None:
    with CaptureQueriesContext(connection) as started:
        run_id = start_workflow("tests.hot-path-one", {})
    assert len(started.captured_queries) == 1, started.captured_queries
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    with CaptureQueriesContext(connection) as driven:
        assert worker.work_once() is True
    statements = [q["sql"] for q in driven.captured_queries]
    # pass claim (+ run and steps, + run lease), step insert+claim (+ end of pass),
    # result + completion + run lease release (+ the next pass, none here).
    assert len(statements) == 3, statements
    assert not any(sql.strip().upper() in ("BEGIN", "COMMIT") for sql in statements)
    called = [sql for sql in statements if sql.startswith("SELECT * FROM dl_")]
    assert len(called) == 3, statements
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"n": 1, "attempt": 1})
    lease = Lease.objects.with_state().get(key=run_lease_key(run_id))
    assert lease.state == "released"
    attempt = WorkflowStepAttempt.objects.get(step__run_id=run_id)
    assert (attempt.status, attempt.result) == (AttemptStatus.SUCCEEDED, {"n": 1, "attempt": 1})


def test_a_run_drives_the_same_on_the_portable_path(sent_as: str) -> None:
    run = _run_in_one_unit("tests.hot-path-two")
    assert run.status == RunStatus.COMPLETED, "the worker handed the run to the queue"
    assert run.output == [{"n": 1, "attempt": 1}, {"n": 2, "attempt": 1}]
    assert Lease.objects.with_state().get(key=run_lease_key(run.id)).state == "released"


@pytest.mark.postgres_only
def test_a_completion_picks_the_next_run_in_the_same_statement(sent_as: str) -> None:
    run_ids = [start_workflow("tests.hot-path-one", {}) for _ in range(3)]
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, run_ids)
    with CaptureQueriesContext(connection) as driven:
        assert worker.work_once() is True
    if sent_as == "tuned":
        # One pick, then per run: the step, and the completion that picks the next run.
        assert len(driven.captured_queries) == 1 + 2 * 3, driven.captured_queries
    statuses = set(WorkflowRun.objects.filter(pk__in=run_ids).values_list("status", flat=True))
    assert statuses == {RunStatus.COMPLETED}
    keys = [run_lease_key(run_id) for run_id in run_ids]
    states = set(Lease.objects.with_state().filter(key__in=keys).values_list("state", flat=True))
    assert states == {"released"}
    assert worker.work_once() is False, "work was left behind"


@pytest.mark.postgres_only
def test_a_pick_that_finds_the_run_lease_taken_retries_the_pass_later(sent_as: str) -> None:
    run_id = start_workflow("tests.hot-path-one", {})
    other = Lease.objects.acquire(run_lease_key(run_id), "someone-else", 30)
    assert other is not None
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [run_id])
    assert worker.work_once() is True
    assert not WorkflowStep.objects.filter(run_id=run_id).exists(), "ran without the lease"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING and run.pass_due_at is not None
    assert worker.work_once() is False, "the pass is retried about a second later, not now"
    assert Lease.objects.get(key=run_lease_key(run_id)).holder == "someone-else"
    Lease.objects.release(other)
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now())
    assert worker.work_once() is True
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED


def _claimed_run() -> tuple[Any, Any, Any]:
    """A run picked with its lease, its one step claimed as attempt 1: (pick, claim, lease)."""
    run_id = start_workflow("tests.hot-path-one", {})
    picked = WorkflowRun.objects.claim_due_pass(30, lease_holder="test-holder")
    assert picked is not None and picked.run_id == run_id and picked.lease is not None
    claim = WorkflowStep.objects.schedule_claimed(
        run_id, NextStep("only", "tests.hot-path", {"n": 1}), lease_ttl_seconds=30, finish_pass=1
    ).claim
    assert claim is not None
    return picked, claim, picked.lease


@pytest.mark.postgres_only
def test_a_completion_for_a_superseded_attempt_writes_nothing(sent_as: str) -> None:
    _, claim, lease = _claimed_run()
    WorkflowStep.objects.filter(pk=claim.step_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    again = WorkflowStep.objects.claim_for_execution(claim.run_id, "only", "tests.hot-path", 30)
    assert again is not None and again.attempt == 2
    done = WorkflowStep.objects.set_result_completing_run(
        claim.step_id, {"stale": True}, 1, output={"stale": True}, lease=lease
    )
    assert done is not None
    assert (done.written, done.completed, done.lease_live) == (False, False, None)
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert run.status == RunStatus.RUNNING and run.output is None
    step = WorkflowStep.objects.get(pk=claim.step_id)
    assert (step.status, step.attempt, step.result) == (StepStatus.RUNNING, 2, None)
    assert [a.status for a in WorkflowStep.objects.history(claim.run_id)] == ["running"] * 2
    assert Lease.objects.current(run_lease_key(claim.run_id)) is not None, "released anyway"
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(claim.step_id, {"stale": True}, 1)


@pytest.mark.postgres_only
def test_a_completion_says_when_the_run_lease_had_lapsed(sent_as: str) -> None:
    _, claim, lease = _claimed_run()
    Lease.objects.filter(pk=lease.pk).update(expires_at=db_now() - timedelta(seconds=1))
    done = WorkflowStep.objects.set_result_completing_run(
        claim.step_id, {"n": 1}, 1, output=[1], lease=lease
    )
    assert done is not None
    assert (done.written, done.completed, done.lease_live) == (True, True, False)
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.status, run.output, run.pass_due_at) == (RunStatus.COMPLETED, [1], None)
    assert Lease.objects.with_state().get(pk=lease.pk).state == "released"


@pytest.mark.postgres_only
def test_a_missing_function_is_an_error_and_workers_refuse_to_start() -> None:
    """No silent fallback: without the functions this code calls, the check says so and a
    worker refuses to start (until ``migrate`` installs them)."""
    assert workflow_functions_check(databases=["default"]) == []
    name = functions(connection)["complete_run"].name
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER FUNCTION {name} RENAME TO {name}_old")
    try:
        assert [m.id for m in workflow_functions_check(databases=["default"])] == [
            "django_leases.E013"
        ]
        with pytest.raises(
            WorkflowFunctionsMissing, match=r"Run 'manage\.py leases_check --install-functions"
        ):
            Worker(1, step_lease_ttl=30).run(once=True, handle_signals=False)
        with tuned_sql(False):  # the portable path needs no function
            assert workflow_functions_check(databases=["default"]) == []
            run_id = start_workflow("tests.hot-path-one", {})
            assert Worker(1, step_lease_ttl=30).work_once() is True
            assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER FUNCTION {name}_old RENAME TO {name}")
    assert workflow_functions_check(databases=["default"]) == []


@pytest.mark.postgres_only
def test_a_completion_never_picks_its_own_run(sent_as: str) -> None:
    """A pass asked for while the step ran makes the run due again; the completion that
    picks the next run must not pick this one (PostgreSQL would apply only one of the two
    updates of its row, and the completion would be lost)."""
    _, claim, lease = _claimed_run()
    assert WorkflowRun.objects.request_pass(claim.run_id)
    done = WorkflowStep.objects.set_result_completing_run(
        claim.step_id, {"n": 1}, 1, output=[1], lease=lease, next_pass_holder="next-holder"
    )
    assert done is not None
    assert (done.written, done.completed, done.next_pass) == (True, True, None)
    run = WorkflowRun.objects.get(pk=claim.run_id)
    assert (run.status, run.output, run.pass_due_at) == (RunStatus.COMPLETED, [1], None)


@step_function("tests.hot-path-asks-for-a-pass")
def asks_for_a_pass(data: Any, ctx: Any) -> Any:
    WorkflowRun.objects.request_pass(ctx.run_id)  # as an operator or another step might
    return "asked"


@workflow("tests.hot-path-asks")
def asks(run: Any, input: Any) -> Any:
    return run.step("only", "tests.hot-path-asks-for-a-pass")


@pytest.mark.postgres_only
def test_a_run_asked_for_a_pass_during_its_step_completes_at_once(sent_as: str) -> None:
    run = _run_in_one_unit("tests.hot-path-asks")
    assert (run.status, run.output) == (RunStatus.COMPLETED, "asked")


@pytest.mark.postgres_only
def test_a_completion_retried_after_a_lost_reply_picks_no_second_run(
    sent_as: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try committed (and picked a run) but its reply was lost: the retry must not
    pick another run that nobody would drive either. The run the lost reply picked waits for
    its run lease to lapse, as any run whose worker died."""
    from django.db import OperationalError

    from django_leases.models.workflow import WorkflowStepQuerySet

    run_ids = [start_workflow("tests.hot-path-one", {}) for _ in range(3)]
    real = WorkflowStepQuerySet.set_result_completing_run
    calls: list[str | None] = []

    def lost_reply(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("next_pass_holder"))
        done = real(self, *args, **kwargs)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(WorkflowStepQuerySet, "set_result_completing_run", lost_reply)
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, run_ids)
    assert worker.work_once() is True
    assert calls[0] is not None and calls[1:] == [None] * (len(calls) - 1), calls
    statuses = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("id", "status"))
    assert sorted(statuses.values()) == [RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.RUNNING]
    # The run nobody picked is still due and is driven next; the lost one waits for its lease.
    assert worker.work_once() is True
    statuses = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("id", "status"))
    assert sorted(statuses.values()) == [
        RunStatus.COMPLETED,
        RunStatus.COMPLETED,
        RunStatus.RUNNING,
    ]


@step_function("tests.hot-path-unordered")
def unordered(data: Any, ctx: Any) -> Any:
    return {"zz": 1, "a": 2, "big": 1e16, "small": 1e-7}


@workflow("tests.hot-path-reads-back")
def reads_back(run: Any, input: Any) -> Any:
    result = run.step("only", "tests.hot-path-unordered")
    input["seen"] = input.get("seen", 0) + 1  # a workflow that changes what it was given
    return {"keys": list(result), "big": type(result["big"]).__name__, "input": input}


@pytest.mark.postgres_only
def test_the_dry_pass_sees_what_a_pass_reading_the_database_sees(sent_as: str) -> None:
    run = _run_in_one_unit("tests.hot-path-reads-back")
    stored = WorkflowStep.objects.get(run_id=run.id).result
    assert run.status == RunStatus.COMPLETED
    # jsonb's key order and number forms, and the input as stored, not as the pass left it.
    assert run.output == {
        "keys": list(stored),
        "big": type(stored["big"]).__name__,
        "input": {"seen": 1},
    }
    assert run.output["keys"] == ["a", "zz", "big", "small"]
