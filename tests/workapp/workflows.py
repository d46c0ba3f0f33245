"""``tests.sub.two-steps``: two steps of ``tests.sub.echo``, which returns its data; and
``tests.idle``, a workflow that does nothing (tests that schedule steps by hand start it)."""

from __future__ import annotations

from typing import Any

from django_leases.workflows import step_function, workflow


@step_function("tests.sub.echo")
def echo(data: Any, ctx: Any) -> Any:
    """Return the step's data (and the attempt that ran it)."""
    return {"data": data, "attempt": ctx.attempt}


@workflow("tests.sub.two-steps")
def two_steps(run: Any, input: Any) -> Any:
    """Two steps in a row; the output is both results."""
    first = run.step("first", "tests.sub.echo", {"n": 1})
    return [first, run.step("second", "tests.sub.echo", {"n": 2})]


@workflow("tests.idle")
def idle(run: Any, input: Any) -> None:
    """Nothing: a run for steps a test schedules and claims by hand."""
    return None


# -- exactly once (tests/test_transactional_steps.py, tests/test_fencing.py) --------------------

#: A barrier (multiprocessing) every attempt of ``tests.tx.append`` waits at after its write,
#: inside its transaction: set in forked processes by the racing test; ``None`` elsewhere.
RACE_BARRIER: Any = None


def _hold_here(data: Any, ctx: Any) -> None:
    """With ``data["hold"]`` (a path) on attempt 1: say so in ``<hold>.inside`` (the pid),
    then wait for ``<hold>.go`` to exist (the test's go-ahead, at most two minutes)."""
    import os
    import time
    from pathlib import Path

    hold = data.get("hold") if isinstance(data, dict) else None
    if hold and ctx.attempt == 1:
        # Written aside, then renamed: the test reads the pid as soon as the file exists.
        Path(f"{hold}.inside.tmp").write_text(str(os.getpid()))
        os.replace(f"{hold}.inside.tmp", f"{hold}.inside")
        deadline = time.monotonic() + 120
        while not Path(f"{hold}.go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)


@step_function("tests.tx.append", transactional=True)
def tx_append(data: Any, ctx: Any) -> Any:
    """Transactional: append a ledger row for this attempt, then (``data["fail"]``: on
    attempts up to that number) raise; ``data["hold"]``: wait inside the transaction."""
    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    _hold_here(data, ctx)
    if RACE_BARRIER is not None:
        RACE_BARRIER.wait(60)
    if isinstance(data, dict) and ctx.attempt <= data.get("fail", 0):
        raise RuntimeError(f"attempt {ctx.attempt} fails after its write")
    return {"attempt": ctx.attempt, "transactional": ctx.transactional}


@step_function("tests.tx.overrun", transactional=True)
def tx_overrun(data: Any, ctx: Any) -> Any:
    """Transactional: append a ledger row, then (attempt 1) move this attempt's deadline a
    second into the past on the database clock, as if it had run past its timeout."""
    from django_leases import clock
    from django_leases.models import WorkflowStep
    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    if ctx.attempt == 1:
        WorkflowStep.objects.filter(run_id=ctx.run_id, step_name=ctx.step_name).update(
            deadline_at=clock.db_now_plus(-1.0)
        )
    return {"attempt": ctx.attempt}


@step_function("tests.tx.leave-open", transactional=True)
def tx_leave_open(data: Any, ctx: Any) -> Any:
    """Transactional: append a ledger row, enter an atomic block and never leave it, append
    another; on attempt 1 then raise (``data["raise"]``) or return. Later attempts append
    one row and return."""
    from django.db import transaction

    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    if ctx.attempt == 1:
        transaction.atomic().__enter__()
        LedgerEntry.objects.create(run_id=ctx.run_id, step="inner", attempt=ctx.attempt)
        if data.get("raise"):
            raise RuntimeError("attempt 1 fails inside a block it never left")
    return {"attempt": ctx.attempt}


@step_function("tests.tx.returns-coroutine", transactional=True)
def tx_returns_coroutine(data: Any, ctx: Any) -> Any:
    """Transactional, a plain function that returns a coroutine (as an unmarked decorator
    around an ``async def`` would)."""
    import asyncio

    return asyncio.sleep(0, result={"never": "awaited"})


@step_function("tests.tx.plain-append")
def plain_append(data: Any, ctx: Any) -> Any:
    """As ``tests.tx.append``, not transactional: its row stays when it raises."""
    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    if isinstance(data, dict) and ctx.attempt <= data.get("fail", 0):
        raise RuntimeError(f"attempt {ctx.attempt} fails after its write")
    return {"attempt": ctx.attempt, "transactional": ctx.transactional}


@workflow("tests.tx.one")
def tx_one(run: Any, input: Any) -> Any:
    """One step of ``input["function"]`` (default ``tests.tx.append``) on ``input``."""
    function = input.get("function", "tests.tx.append")
    return run.step(
        "only", function, input, retries=input.get("retries", 3), timeout=input.get("timeout")
    )


@workflow("tests.tx.three")
def tx_three(run: Any, input: Any) -> Any:
    """Three transactional steps in a row (the last one plain)."""
    first = run.step("first", "tests.tx.append", {})
    second = run.step("second", "tests.tx.append", {})
    third = run.step("third", "tests.tx.plain-append", {})
    return [first, second, third]


@workflow("tests.tx.own-transaction")
def tx_own_transaction(run: Any, input: Any) -> Any:
    """A transactional step, then (against the rules) the next step inside a transaction
    the workflow opens itself."""
    from django.db import transaction

    first = run.step("first", "tests.tx.append", {})
    with transaction.atomic():
        second = run.step("second", "tests.tx.append", {})
    return [first, second]


@step_function("tests.dup.upsert")
def dup_upsert(data: Any, ctx: Any) -> Any:
    """Idempotent: one ledger row per step, however often it runs."""
    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.get_or_create(run_id=ctx.run_id, step=ctx.step_name, attempt=0)
    return "ok"


@step_function("tests.dup.insert")
def dup_insert(data: Any, ctx: Any) -> Any:
    """Not idempotent: a ledger row more on every run."""
    from tests.workapp.models import LedgerEntry

    LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
    return "ok"


@workflow("tests.dup.steps")
def dup_steps(run: Any, input: Any) -> Any:
    """The step functions ``input`` names, one step each (``s0``, ``s1``…)."""
    return [run.step(f"s{n}", name, {}) for n, name in enumerate(input)]
