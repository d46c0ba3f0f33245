"""A transactional step whose worker pauses in the workflow code that its open
transaction carries to the next action (a ``run.child``), past its step lease and its run
lease, while another worker runs attempt 2, its child and completes the run.

Rule: nothing of the stale attempt lands when it resumes — not its row, not its result, not
the child run its carried write would create; exactly one child run and one ledger row
(attempt 2's); the run's output is attempt 2's.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.values import run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_lease, lapse_step_lease, start_thread, tuned_sql
from tests.workapp.models import LedgerEntry

_gates: dict[str, threading.Event] = {}


@step_function("paused-tx.write", transactional=True)
def tx_write(data: Any, ctx: Any) -> dict[str, Any]:
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    return {"attempt": ctx.attempt}


@workflow("paused-tx.kid")
def kid(run: Any, input: Any) -> Any:
    return {"kid": input}


@workflow("paused-tx.then-child")
def tx_then_child(run: Any, input: Any) -> Any:
    done = run.step("write", "paused-tx.write", {})
    if done["attempt"] == 1 and not _gates[input["gate"]].is_set():
        # Workflow code inside attempt 1's open transaction: pause here.
        _gates[input["started"]].set()
        assert _gates[input["gate"]].wait(60)
    child = run.child("kid", "paused-tx.kid", done["attempt"])
    return {"step": done["attempt"], "child": child}


needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite: the open transaction holds the write lock, nobody else can take over",
)


@needs_row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tuned", [True, False])
def test_a_carried_transaction_paused_before_its_child_lands_nothing(tuned: bool) -> None:
    started, gate = uuid.uuid4().hex, uuid.uuid4().hex
    _gates[started], _gates[gate] = threading.Event(), threading.Event()
    try:
        with tuned_sql(tuned):
            run = WorkflowRun.objects.start(
                "paused-tx.then-child", {"started": started, "gate": gate}
            )
            stale = Worker(step_lease_ttl=60.0)
            first = start_thread(stale.work_once)
            assert _gates[started].wait(60), "attempt 1 never reached its workflow code"
            lapse_step_lease(run_id=run.id, step_name="write")
            lapse_lease(run_lease_key(run.id))
            drain(Worker(step_lease_ttl=60.0))
            run.refresh_from_db()
            assert run.status == "completed", run.error
            _gates[gate].set()
            first.join(60)
            assert not first.is_alive()
            drain(Worker(step_lease_ttl=60.0))
            run.refresh_from_db()
            assert run.status == "completed"
            assert run.output == {"step": 2, "child": {"kid": 2}}
            ledger = list(LedgerEntry.objects.filter(run_id=run.id).values_list("step", "attempt"))
            assert ledger == [("write", 2)]
            children = list(WorkflowRun.objects.filter(parent_id=run.id).values_list("input"))
            assert children == [(2,)]
            step = WorkflowStep.objects.get(run_id=run.id, step_name="write")
            assert (step.status, step.attempt, step.result) == ("succeeded", 2, {"attempt": 2})
    finally:
        _gates[gate].set()
        _gates.pop(started, None)
        _gates.pop(gate, None)


@needs_row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tuned", [True, False])
def test_a_carried_transaction_paused_while_its_run_is_cancelled_lands_nothing(
    tuned: bool,
) -> None:
    """Rule: a run cancelled while a transactional attempt's transaction is open (paused in
    the carried workflow code, its leases still live) gets nothing of that attempt: no row,
    no result, no child run, and stays cancelled."""
    started, gate = uuid.uuid4().hex, uuid.uuid4().hex
    _gates[started], _gates[gate] = threading.Event(), threading.Event()
    try:
        with tuned_sql(tuned):
            run = WorkflowRun.objects.start(
                "paused-tx.then-child", {"started": started, "gate": gate}
            )
            first = start_thread(Worker(step_lease_ttl=60.0).work_once)
            assert _gates[started].wait(60), "attempt 1 never reached its workflow code"
            WorkflowRun.objects.cancel(run.id)
            _gates[gate].set()
            first.join(60)
            assert not first.is_alive()
            drain(Worker(step_lease_ttl=60.0))
            run.refresh_from_db()
            assert run.status == "cancelled"
            assert list(LedgerEntry.objects.filter(run_id=run.id)) == []
            assert not WorkflowRun.objects.filter(parent_id=run.id).exists()
            step = WorkflowStep.objects.get(run_id=run.id, step_name="write")
            assert step.result is None and step.status != "succeeded"
    finally:
        _gates[gate].set()
        _gates.pop(started, None)
        _gates.pop(gate, None)
