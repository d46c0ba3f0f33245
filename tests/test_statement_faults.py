"""Every statement of a run fails in turn (issue 25): a fault in the library's own work ends
the unit of work, never the run, and never runs an attempt twice.

A workflow of a step, two parallel steps and a transactional step runs once to count the
statements its units of work send. Then, for each of them in turn, a fresh run of it has
exactly that statement fail as a dropped connection does — ``before`` it reaches the
server, or ``after`` it ran there (its reply lost: an autocommit statement has landed, a
transaction it was part of is rolled back with the connection). The
worker's loop takes the ``DatabaseError`` as it does (the unit ends, its connection is
closed); what the unit held is left to lapse, as a dead worker's is, and is lapsed on the
database clock. Every run then completes with the same output, no attempt of a step ran
twice, and the transactional step's row landed once. On every backend, both SQL paths.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection

from django_leases.models import RunStatus, WorkflowRun
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.worker import Worker
from tests.helpers import settle, work_until_idle
from tests.workapp.models import LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)

#: ``(run id, step, attempt)`` of every execution of the sweep's step functions.
_executions: list[tuple[str, str, int]] = []


@step_function("tests.sweep.note")
def note(data: Any, ctx: Any) -> Any:
    _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))
    return data["n"]


@step_function("tests.sweep.tx", transactional=True)
def tx(data: Any, ctx: Any) -> Any:
    _executions.append((str(ctx.run_id), ctx.step_name, ctx.attempt))
    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    return data["n"]


@workflow("tests.sweep")
def sweep(run: Any, input: Any) -> Any:
    first = run.step("a", "tests.sweep.note", {"n": 1})
    both = run.parallel([("b", "tests.sweep.note", {"n": 2}), ("c", "tests.sweep.note", {"n": 3})])
    last = run.step("d", "tests.sweep.tx", {"n": 4})
    return [first, *both, last]


OUTPUT = [1, 2, 3, 4]


def _kill(wrapper: Any) -> None:
    """End the session of Django connection ``wrapper`` from the server's side, as a
    dropped connection ends it (a transaction it had open is rolled back): PostgreSQL's
    ``pg_terminate_backend``, MariaDB's ``KILL CONNECTION``, from a connection of its own."""
    raw = wrapper.connection
    if wrapper.vendor == "postgresql":
        info = getattr(raw, "info", None)
        pid = info.backend_pid if info is not None else raw.get_backend_pid()
        kill = "SELECT pg_terminate_backend(%s)"
    else:
        pid, kill = raw.thread_id(), "KILL CONNECTION %s"
    other = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        cursor = other.cursor()
        cursor.execute(kill, [pid])
        cursor.close()
        if wrapper.vendor == "postgresql":
            other.commit()
    finally:
        other.close()


class Fault:
    """An ``execute_wrapper`` that fails statement number ``at`` (1-based; 0: none) as a
    dropped connection does — its session ended on the server, before the statement is
    sent or (``after``) once it ran — and counts the statements. SQLite has no server to
    lose: there the statement fails as a busy database refuses it (before it runs; the
    connection and its transaction stay)."""

    def __init__(self, at: int = 0, *, after: bool = False) -> None:
        self.at, self.after = at, after
        self.seen = 0
        self.failed: str | None = None
        #: Per statement seen, whether it ran inside a transaction.
        self.in_transaction: list[bool] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.seen += 1
        self.in_transaction.append(context["connection"].in_atomic_block)
        if self.seen != self.at:
            return execute(sql, params, many, context)
        self.failed = sql
        wrapper = context["connection"]
        if wrapper.vendor == "sqlite":
            raise OperationalError("database is locked (injected)")
        if self.after:
            execute(sql, params, many, context)
        _kill(wrapper)
        return execute(sql, params, many, context)  # fails: the session is gone


def _run(fault: Fault) -> tuple[str, WorkflowRun]:
    """A fresh run of the sweep, worked on this thread as the worker's loop works (a unit
    that raised a database error ends, its connection closed), under ``fault``; then what
    it left held is lapsed and the run settled."""
    run_id = str(start_workflow("tests.sweep", {}))
    with connection.execute_wrapper(fault):
        work_until_idle(Worker(1, step_lease_ttl=60.0, poll_interval=3600))
    settle(run_id)
    return run_id, WorkflowRun.objects.get(pk=run_id)


#: Where a fault may come: before the statement runs, and (a server to lose) after.
MOMENTS = [False] if connection.vendor == "sqlite" else [False, True]


@pytest.mark.parametrize("after", MOMENTS, ids=["before", "after"][: len(MOMENTS)])
def test_every_statement_of_a_run_failing_in_turn_loses_nothing_and_runs_nothing_twice(
    sql_path: str, after: bool
) -> None:
    counted = Fault()
    _, clean = _run(counted)
    assert (clean.status, clean.output) == (RunStatus.COMPLETED, OUTPUT)
    assert counted.seen > 10, counted.seen
    # After a statement inside a transaction, the lost session rolls it back: that is the
    # fault before it, swept already. After an autocommit one, it has landed.
    statements = [
        at for at, inside in enumerate(counted.in_transaction, start=1) if not (after and inside)
    ]
    wrong: list[tuple[int, str, Any]] = []
    for at in statements:
        _executions.clear()
        fault = Fault(at, after=after)
        run_id, run = _run(fault)
        mine = [execution for execution in _executions if execution[0] == run_id]
        twice = len(mine) - len(set(mine))
        ledger = LedgerEntry.objects.filter(run_id=run_id).count()
        if (run.status, run.output) != (RunStatus.COMPLETED, OUTPUT) or twice or ledger != 1:
            wrong.append((at, (fault.failed or "")[:120], (run.status, run.error, twice, ledger)))
    assert wrong == [], f"{len(wrong)} of {len(statements)} statements: {wrong}"
