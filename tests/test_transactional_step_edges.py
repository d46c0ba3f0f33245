"""Transactional steps at their edges: an ``on_commit`` hook that raises after the commit, a
rolled-back savepoint, a step that closes its own connection, a superseded attempt's hook
and fenced write: each attempt's writes land with its result or not at all, and one
attempt's land once (a worker SIGKILLed or SIGSTOPped inside the step's transaction:
``tests/test_transactional_steps.py``)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import registry, start_workflow, step_function
from django_leases.workflows.engine import StepContext, execute_step
from tests.helpers import (
    drain,
    lapse_step_lease,
    on_another_thread,
)
from tests.workapp.models import Account, LedgerEntry


def rows(run_id: Any) -> list[tuple[str, int]]:
    return list(
        LedgerEntry.objects.filter(run_id=run_id).order_by("id").values_list("step", "attempt")
    )


def finished(function: str, runner: str) -> WorkflowRun:
    """A run of ``tests.tx.one`` over step function ``function``, run to its end by a worker
    or by ``drive()``."""
    run_id = start_workflow("tests.tx.one", {"function": function})
    if runner == "worker":
        drain()
    else:
        drive(run_id)
    return WorkflowRun.objects.get(pk=run_id)


_calls: list[tuple[str, int]] = []
_hooks_ran: list[tuple[str, int]] = []


@step_function("tests.tx-edges.on-commit-raises", transactional=True)
def on_commit_raises(data: Any, ctx: StepContext) -> Any:
    _calls.append((ctx.step_name, ctx.attempt))
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)

    def hook() -> None:
        _hooks_ran.append((ctx.step_name, ctx.attempt))
        raise RuntimeError("an on_commit hook fails after the commit")

    transaction.on_commit(hook)
    return {"attempt": ctx.attempt}


@pytest.mark.parametrize("runner", ["worker", "drive"])
@pytest.mark.django_db(transaction=True)
def test_an_on_commit_hook_that_raises_after_the_commit_runs_nothing_twice(runner: str) -> None:
    """The step's writes and result committed; then a hook it registered raises. The
    attempt landed: it must not be run again, nor its run failed for it."""
    _calls.clear()
    _hooks_ran.clear()
    run_id = start_workflow(
        "tests.tx.one", {"function": "tests.tx-edges.on-commit-raises", "retries": 2}
    )
    if runner == "worker":
        for _ in range(5):
            try:
                drain()
                break
            except RuntimeError:
                continue
    else:
        with contextlib.suppress(RuntimeError):
            drive(run_id)
        drive(run_id)
    run = WorkflowRun.objects.get(pk=run_id)
    history = WorkflowStep.objects.history(run_id)
    assert rows(run_id) == [("only", 1)]
    assert _calls == [("only", 1)], (_calls, [(h.attempt, h.status, h.error) for h in history])
    assert [(h.attempt, h.status) for h in history] == [(1, "succeeded")]
    assert (run.status, run.output) == ("completed", {"attempt": 1})


@step_function("tests.tx-edges.savepoint", transactional=True)
def with_savepoint(data: Any, ctx: StepContext) -> Any:
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    Account.objects.get_or_create(name=f"sp-{ctx.run_id}")
    try:
        with transaction.atomic():
            LedgerEntry.objects.create(run_id=ctx.run_id, step="inner", attempt=ctx.attempt)
            Account.objects.create(name=f"sp-{ctx.run_id}")  # unique: IntegrityError
    except IntegrityError:
        pass
    transaction.on_commit(lambda: _hooks_ran.append((ctx.step_name, ctx.attempt)))
    Account.objects.filter(name=f"sp-{ctx.run_id}").fenced_update(ctx.fence, balance=ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("after the savepoint")
    return {"attempt": ctx.attempt}


@pytest.mark.parametrize("runner", ["worker", "drive"])
@pytest.mark.django_db(transaction=True)
def test_a_step_with_a_rolled_back_savepoint_lands_once(runner: str) -> None:
    _hooks_ran.clear()
    run = finished("tests.tx-edges.savepoint", runner)
    run_id = run.pk
    assert (run.status, run.output) == ("completed", {"attempt": 2})
    assert rows(run_id) == [("only", 2)]
    assert _hooks_ran == [("only", 2)]
    account = Account.objects.get(name=f"sp-{run_id}")
    assert (account.balance, account.fence) == (2, 2)


@step_function("tests.tx-edges.closes", transactional=True)
def closes_connection(data: Any, ctx: StepContext) -> Any:
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    if ctx.attempt == 1:
        connection.close()
    return {"attempt": ctx.attempt}


@pytest.mark.parametrize("runner", ["worker", "drive"])
@pytest.mark.django_db(transaction=True)
def test_a_step_that_closes_its_connection_lands_nothing_and_its_retry_lands_once(
    runner: str,
) -> None:
    run = finished("tests.tx-edges.closes", runner)
    assert (run.status, run.output) == ("completed", {"attempt": 2})
    assert rows(run.pk) == [("only", 2)]


@pytest.mark.django_db(transaction=True)
def test_a_superseded_attempt_runs_no_on_commit_hook_and_its_fenced_row_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hooks_ran.clear()
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append")
    stale = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
    assert stale is not None
    Account.objects.create(name="sup")

    def superseding(data: Any, ctx: StepContext) -> Any:
        LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
        assert Account.objects.filter(name="sup").fenced_update(ctx.fence, balance=1) == 1
        transaction.on_commit(lambda: _hooks_ran.append(("only", ctx.attempt)))

        def take_over() -> None:
            lapse_step_lease(stale.step_id)
            newer = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
            assert newer is not None and newer.attempt == 2

        if connection.vendor == "sqlite":
            take_over()  # the one write lock is ours: same connection
        else:
            on_another_thread(take_over)
        return {"attempt": ctx.attempt}

    monkeypatch.setitem(registry._step_functions, "tests.tx.append", superseding)
    assert execute_step(stale) == "superseded"
    assert rows(run.id) == []
    assert _hooks_ran == []
    row = Account.objects.get(name="sup")
    assert (row.balance, row.fenced_by, row.fence) == (0, "", 0)
