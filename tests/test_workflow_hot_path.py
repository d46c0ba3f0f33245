"""The worker keeps the run it drives, and on PostgreSQL each unit is one statement."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_leases.clock import db_now
from django_leases.models import (
    AttemptStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker

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


@pytest.mark.postgres_only
def test_a_one_step_run_costs_one_statement_to_start_and_six_to_drive() -> None:
    with CaptureQueriesContext(connection) as started:
        run_id = start_workflow("tests.hot-path-one", {})
    assert len(started.captured_queries) == 1, started.captured_queries
    # The worker's look for due steps ahead of new runs (once per poll interval) is spent on
    # an idle unit of work first, with an interval no test outlasts.
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=None)
    assert worker.work_once() is False
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now())
    with CaptureQueriesContext(connection) as driven:
        assert worker.work_once() is True
    statements = [q["sql"] for q in driven.captured_queries]
    # pass claim (+ run and steps), run lease, step insert+claim (+ end of pass),
    # result (+ next pass, run and steps), completion, run lease check+release.
    assert len(statements) == 6, statements
    assert not any(sql.strip().upper() in ("BEGIN", "COMMIT") for sql in statements)
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
