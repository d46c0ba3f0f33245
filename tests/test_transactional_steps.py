"""Transactional steps (``@step_function(..., transactional=True)``, DESIGN §5c): the step's
writes and its result commit together, or not at all.

* a step that writes and then raises commits nothing; its retry's write lands once;
* the step's writes, its result and the workflow's next action (the next step created and
  claimed, the run's completion) commit in one transaction; a failure after the next
  step's claim rolls the claim back too; a workflow that opens a transaction of its own
  around its next action gets a clear error;
* a plain step that does the same keeps the failed attempt's row (the contrast);
* a superseded attempt's transaction rolls back, in-process and with real worker processes
  (SIGSTOPped inside its transaction, superseded, SIGCONTed: PostgreSQL and MariaDB);
* an attempt past its timeout rolls back and fails with ``STEP_TIMED_OUT``;
* 8 processes racing one step, each superseding the last, write its row exactly once;
* ``ctx.transactional`` and ``ctx.idempotency_key``; system check W036 on SQLite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_leases import faults
from django_leases.checks import check_transactional_steps
from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import start_workflow, step_function
from django_leases.workflows.engine import StepContext, execute_step
from django_leases.workflows.registry import step_declaration
from tests import helpers
from tests.helpers import (
    MANAGE_PY,
    drain,
    lapse_lease,
    lapse_step_lease,
    process_stopped,
    race_in_processes,
    start_process,
    wait_until,
)
from tests.workapp import workflows as workapp
from tests.workapp.models import LedgerEntry

needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite's transaction holds the whole database's write lock: no other attempt "
    "can run meanwhile (run with DATABASE_URL=postgres://... or mysql://...)",
)


def rows(run_id: Any) -> list[tuple[str, int]]:
    return list(
        LedgerEntry.objects.filter(run_id=run_id).order_by("id").values_list("step", "attempt")
    )


# -- in the test's transaction --------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_writes_then_raises_commits_nothing_and_its_retry_lands_once() -> None:
    run_id = start_workflow("tests.tx.one", {"fail": 2})
    run = drive(run_id)
    assert run is not None and run.status == "completed"
    assert run.output == {"attempt": 3, "transactional": True}
    # Attempts 1 and 2 wrote their row and raised: both rolled back.
    assert rows(run_id) == [("only", 3)]
    history = WorkflowStep.objects.history(run_id)
    assert [entry.status for entry in history] == ["failed", "failed", "succeeded"]


@pytest.mark.django_db
def test_a_plain_step_that_writes_then_raises_keeps_its_row() -> None:
    run_id = start_workflow("tests.tx.one", {"fail": 1, "function": "tests.tx.plain-append"})
    run = drive(run_id)
    assert run is not None and run.status == "completed"
    assert run.output == {"attempt": 2, "transactional": False}
    assert rows(run_id) == [("only", 1), ("only", 2)]


@pytest.mark.django_db
def test_an_exhausted_transactional_step_fails_the_run_with_nothing_written() -> None:
    run_id = start_workflow("tests.tx.one", {"fail": 9, "retries": 1})
    run = drive(run_id)
    assert run is not None and run.status == "failed"
    assert rows(run_id) == []


@pytest.mark.django_db
def test_transactional_steps_in_a_row_each_land_once() -> None:
    run_id = start_workflow("tests.tx.three", {})
    run = drive(run_id)
    assert run is not None and run.status == "completed"
    assert [r["attempt"] for r in run.output] == [1, 1, 1]
    assert rows(run_id) == [("first", 1), ("second", 1), ("third", 1)]


def worked(run_id: Any) -> WorkflowRun:
    """Run ``run_id`` to its end with a worker on this thread (its passes run their steps
    inline, as workers do; ``drive()`` runs each step on its own)."""
    drain()
    return WorkflowRun.objects.get(pk=run_id)


def statuses(run_id: Any) -> dict[str, str]:
    steps = WorkflowStep.objects.filter(run_id=run_id).order_by("id")
    return dict(steps.values_list("step_name", "status"))


@pytest.mark.django_db(transaction=True)
def test_the_next_step_is_created_and_claimed_in_the_step_s_own_transaction(sql_path: str) -> None:
    """At each commit of a transactional step, the step the workflow asks for next is there
    already, claimed (``running``) for the worker: one transaction, not two writes; the last
    transactional step's commit is followed by the plain step's, and its commit completes
    the run."""
    run_id = start_workflow("tests.tx.three", {})
    seen: list[tuple[str, dict[str, str]]] = []

    def at_commit(**context: Any) -> None:
        seen.append((context["step_name"], statuses(context["run_id"])))

    with faults.injected("workflow.step-transaction-committed", at_commit):
        run = worked(run_id)
    assert run is not None and run.status == "completed"
    assert seen == [
        ("first", {"first": "succeeded", "second": "running"}),
        ("second", {"first": "succeeded", "second": "succeeded", "third": "running"}),
    ]
    assert rows(run_id) == [("first", 1), ("second", 1), ("third", 1)]


@pytest.mark.django_db(transaction=True)
def test_the_run_s_completion_commits_with_the_last_transactional_step(sql_path: str) -> None:
    run_id = start_workflow("tests.tx.one", {})
    seen: list[str] = []

    def at_commit(**context: Any) -> None:
        seen.append(WorkflowRun.objects.get(pk=context["run_id"]).status)

    with faults.injected("workflow.step-transaction-committed", at_commit):
        run = worked(run_id)
    assert run is not None and run.status == "completed"
    assert seen == ["completed"]


@pytest.mark.django_db(transaction=True)
def test_a_failure_after_the_next_step_s_claim_rolls_the_claim_back_too(sql_path: str) -> None:
    """The write of ``first``'s result with ``second``'s creation and claim fails inside
    ``first``'s transaction (once): ``first``'s row, its result and ``second``'s claim all
    roll back, the unit of work ends (a database error of the library's own), attempt 1 of
    ``first`` is given back (``STEP_TRANSACTION_CUT_SHORT``), and attempt 2 does it all
    again — so ``second`` has one attempt, and every row was written once."""
    run_id = start_workflow("tests.tx.three", {})
    fired: list[str] = []

    def fail_once(**context: Any) -> None:
        if context["step_name"] == "second" and not fired:
            fired.append(context["step_name"])
            raise OperationalError("server closed the connection unexpectedly")

    with faults.injected("workflow.next-step-written", fail_once):
        with pytest.raises(OperationalError):
            drain()  # the unit of work the error ends
        run = worked(run_id)
    assert fired == ["second"], "the fault point was not reached: the test proves nothing"
    assert run is not None and run.status == "completed"
    assert rows(run_id) == [("first", 2), ("second", 1), ("third", 1)]
    history = WorkflowStep.objects.history(run_id)
    assert [(entry.step.step_name, entry.attempt, entry.status) for entry in history] == [
        ("first", 1, "failed"),
        ("first", 2, "succeeded"),
        ("second", 1, "succeeded"),
        ("third", 1, "succeeded"),
    ]
    assert history[0].error["code"] == "STEP_TRANSACTION_CUT_SHORT"
    assert "server closed the connection" in history[0].error["message"]


@pytest.mark.django_db(transaction=True)
def test_a_workflow_that_opens_a_transaction_around_its_next_step_is_told() -> None:
    """Workflow code must not open transactions; one that does around the action after a
    transactional step gets a clear error (its run fails), and the step's writes commit
    with that failure, once."""
    run_id = start_workflow("tests.tx.own-transaction", {})
    run = worked(run_id)
    assert run is not None and run.status == "failed"
    assert run.error["type"] == "TransactionManagementError"
    assert "workflow code must not open transactions" in run.error["message"]
    assert rows(run_id) == [("first", 1)]
    assert statuses(run_id) == {"first": "succeeded"}


@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
@pytest.mark.parametrize("runner", ["worker", "drive"])
@pytest.mark.django_db(transaction=True)
def test_a_step_that_leaves_an_atomic_block_open_commits_nothing_and_the_thread_goes_on(
    runner: str, raises: bool
) -> None:
    """A transactional step that enters ``transaction.atomic()`` and never leaves it: its
    attempt's writes (in that block and before it) roll back and the attempt fails with a
    clear error; attempt 2's row lands once; the thread's connection is usable after, so
    the next run completes on it."""
    run_id = start_workflow(
        "tests.tx.one", {"function": "tests.tx.leave-open", "raise": raises, "retries": 1}
    )
    run = worked(run_id) if runner == "worker" else drive(run_id)
    assert run is not None and run.status == "completed"
    assert rows(run_id) == [("only", 2)]
    first = WorkflowStep.objects.history(run_id)[0]
    assert first.status == "failed"
    if raises:
        assert "fails inside a block it never left" in first.error["message"]
    else:
        assert "block of its own that it never left" in first.error["message"]
    assert not connection.in_atomic_block
    again = start_workflow("tests.tx.one", {})
    assert (worked(again) if runner == "worker" else drive(again)).status == "completed"
    assert rows(again) == [("only", 1)]


@pytest.mark.django_db
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_transactional_step_returning_a_coroutine_fails_clearly_and_awaits_nothing() -> None:
    run_id = start_workflow(
        "tests.tx.one", {"function": "tests.tx.returns-coroutine", "retries": 0}
    )
    run = drive(run_id)
    assert run is not None and run.status == "failed"
    error = WorkflowStep.objects.history(run_id)[0].error
    assert error["type"] == "TypeError"
    assert "returned a coroutine: a transactional step is a plain" in error["message"]


@pytest.mark.django_db
def test_an_attempt_past_its_timeout_rolls_back_and_fails_with_step_timed_out() -> None:
    run_id = start_workflow(
        "tests.tx.one", {"function": "tests.tx.overrun", "timeout": 60, "retries": 1}
    )
    run = drive(run_id)
    assert run is not None and run.status == "completed"
    assert run.output == {"attempt": 2}
    assert rows(run_id) == [("only", 2)]
    first = WorkflowStep.objects.history(run_id)[0]
    assert first.status == "failed"
    assert first.error["code"] == "STEP_TIMED_OUT"
    assert first.error["type"] == "WorkflowStepTimedOutError"


@pytest.mark.django_db
def test_a_superseded_attempt_rolls_back_its_writes() -> None:
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append")
    stale = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
    assert stale is not None

    def superseding(data: Any, ctx: StepContext) -> Any:
        # Inside attempt 1's transaction, a takeover: its lease lapses, attempt 2 is claimed.
        LedgerEntry.objects.create(run_id=ctx.run_id, step=ctx.step_name, attempt=ctx.attempt)
        lapse_step_lease(stale.step_id)
        newer = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
        assert newer is not None and newer.attempt == 2
        return {"attempt": ctx.attempt}

    original = workapp.tx_append
    try:
        from django_leases.workflows import registry

        registry._step_functions["tests.tx.append"] = superseding
        assert execute_step(stale) == "superseded"
    finally:
        registry._step_functions["tests.tx.append"] = original
    # The row and the claim of attempt 2 were in the same (rolled back) transaction: the
    # step is as attempt 1 left it before it ran, and nothing of attempt 1 landed.
    assert rows(run.id) == []
    step = WorkflowStep.objects.get(run_id=run.id, step_name="only")
    assert step.result is None


@pytest.mark.django_db
def test_the_context_says_transactional_and_gives_a_stable_idempotency_key() -> None:
    run_id = start_workflow("tests.tx.one", {"fail": 1})
    keys: list[tuple[int, str, bool]] = []

    def spy(data: Any, ctx: StepContext) -> Any:
        keys.append((ctx.attempt, ctx.idempotency_key, ctx.transactional))
        return original(data, ctx)

    from django_leases.workflows import registry

    original = workapp.tx_append
    registry._step_functions["tests.tx.append"] = spy
    try:
        drive(run_id)
        other = start_workflow("tests.tx.one", {})
        drive(other)
    finally:
        registry._step_functions["tests.tx.append"] = original
    (a1, k1, t1), (a2, k2, _), (_, k3, _) = keys
    assert (a1, a2) == (1, 2) and t1 is True
    assert k1 == k2, "the key is the same for every attempt of one step"
    assert k3 != k1, "and differs between runs"
    assert str(uuid.UUID(k1)) == k1
    steps = {
        s.step_name: StepContext(_claim_of(s), threading.Event()).idempotency_key
        for s in WorkflowStep.objects.filter(run_id=other)
    }
    assert k3 == steps["only"]


def _claim_of(step: WorkflowStep) -> Any:
    from django_leases.workflows.values import Claim

    return Claim(
        step.pk, step.run_id, step.step_name, step.function_name, 1, None, 60, 0, "default"
    )


@pytest.mark.django_db
def test_idempotency_keys_differ_between_the_steps_of_a_run() -> None:
    run_id = start_workflow("tests.tx.three", {})
    drive(run_id)
    keys = {
        StepContext(_claim_of(step), threading.Event()).idempotency_key
        for step in WorkflowStep.objects.filter(run_id=run_id)
    }
    assert len(keys) == 3


def test_step_function_refuses_a_transactional_that_is_not_a_bool() -> None:
    with pytest.raises(ValueError, match="transactional"):
        step_function("tests.tx.bad", transactional="yes")  # type: ignore[arg-type]
    assert step_declaration("tests.tx.append").transactional is True
    assert step_declaration("tests.tx.plain-append").transactional is False


def test_a_transactional_step_function_is_a_plain_function() -> None:
    async def coroutine(data: Any, ctx: Any) -> Any:
        return data

    with pytest.raises(TypeError, match="transactional step runs in a transaction"):
        step_function("tests.tx.async", transactional=True)(coroutine)
    from django_leases.workflows.registry import get_step_function

    assert get_step_function("tests.tx.async") is None


def test_w036_warns_about_transactional_steps_on_sqlite_only() -> None:
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"timeout": 20}}
    found = check_transactional_steps(["tests.tx.append"], {"default": ("sqlite", sqlite)})
    assert [m.id for m in found] == ["django_leases.W036"]
    assert "tests.tx.append" in found[0].msg and "20 s" in found[0].msg
    assert check_transactional_steps([], {"default": ("sqlite", sqlite)}) == []
    pg = {"ENGINE": "django.db.backends.postgresql"}
    assert check_transactional_steps(["tests.tx.append"], {"default": ("postgresql", pg)}) == []


# -- real processes -------------------------------------------------------------------------


@needs_row_locks
@pytest.mark.django_db(transaction=True)
def test_eight_processes_racing_one_step_write_its_row_exactly_once() -> None:
    """Each process claims the step (lapsing the previous attempt's lease on the database
    clock to take it over), writes its row and waits at a barrier inside its transaction,
    so 8 attempts are in flight at once; then all try to commit."""
    racers = 8
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append", retries=racers)
    barrier = helpers._fork.Barrier(racers)
    workapp.RACE_BARRIER = barrier

    def racer() -> tuple[int, str]:
        while True:
            claim = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 600)
            if claim is not None:
                return claim.attempt, execute_step(claim)
            assert WorkflowStep.objects.filter(run_id=run.id, status="running").exists()
            lapse_step_lease(run_id=run.id, step_name="only")

    try:
        outcomes = race_in_processes(*[racer for _ in range(racers)])
    finally:
        workapp.RACE_BARRIER = None
    assert all(error == "" for _, error in outcomes), outcomes
    results = sorted(value for value, _ in outcomes)
    assert [attempt for attempt, _ in results] == list(range(1, racers + 1))
    assert [outcome for _, outcome in results] == ["superseded"] * (racers - 1) + ["succeeded"]
    assert rows(run.id) == [("only", racers)]
    step = WorkflowStep.objects.get(run_id=run.id, step_name="only")
    assert (step.status, step.attempt, step.result["attempt"]) == ("succeeded", racers, racers)


_ONE_WORKER = ["run_workflow_worker", "--concurrency", "1"]


def _worker_inside_attempt_1(hold: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A worker process whose attempt 1 of the run's step is inside its transaction (it
    wrote its row and waits for ``hold``.go)."""
    first = start_process([*MANAGE_PY, *_ONE_WORKER], env=env)
    wait_until(lambda: Path(f"{hold}.inside").exists(), 60, what="attempt 1 inside its step")
    assert int(Path(f"{hold}.inside").read_text()) == first.pid
    return first


def _attempt_2_completes(run_id: Any, env: dict[str, str]) -> subprocess.Popen[str]:
    """Lapse the run's step and run leases on the database clock and start a second worker;
    return it once its attempt 2 completed the run."""
    lapse_step_lease(run_id=run_id, step_name="only")
    lapse_lease(f"workflow-run:{run_id}")
    second = start_process([*MANAGE_PY, *_ONE_WORKER], env=env)
    wait_until(
        lambda: WorkflowRun.objects.filter(pk=run_id, status="completed").exists(),
        120,
        what="attempt 2 to complete the run",
    )
    return second


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_inside_its_transaction_lands_nothing(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL between the step's write and its commit: nothing of attempt 1 lands; attempt
    2 (another worker) lands once, and the run completes with it."""
    hold = tmp_path / "hold"
    run_id = start_workflow("tests.tx.one", {"hold": str(hold)})
    first = _worker_inside_attempt_1(hold, subprocess_env)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    connections.close_all()
    second = _attempt_2_completes(run_id, subprocess_env)
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=120)
    assert rows(run_id) == [("only", 2)]
    assert WorkflowRun.objects.get(pk=run_id).output == {"attempt": 2, "transactional": True}


@needs_row_locks
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_stopped_inside_its_transaction_and_superseded_lands_nothing(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """A real worker runs the step, is SIGSTOPped inside its transaction (after its write),
    superseded by a second worker's attempt 2 (its leases lapsed on the database clock), then
    SIGCONTed: its write never lands; attempt 2's does, and the run completes with it."""
    hold = tmp_path / "hold"
    run_id = start_workflow("tests.tx.one", {"hold": str(hold)})
    first = _worker_inside_attempt_1(hold, subprocess_env)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: process_stopped(first.pid), 10, what="the worker stopped")
        second = _attempt_2_completes(run_id, subprocess_env)
        assert rows(run_id) == [("only", 2)]
    finally:
        Path(f"{hold}.go").touch()
        os.kill(first.pid, signal.SIGCONT)
    # Attempt 1 resumes, finds itself superseded at its result write and rolls back; asked
    # to stop, its worker finishes that attempt first and says what became of it.
    first.send_signal(signal.SIGTERM)
    _, said = first.communicate(timeout=120)
    assert first.returncode == 0, said
    assert "attempt 1 was superseded (current attempt 2)" in said, said
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=120)
    assert rows(run_id) == [("only", 2)]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.output == {"attempt": 2, "transactional": True}
    history = WorkflowStep.objects.history(run_id)
    assert [(e.attempt, e.status) for e in history] == [(1, "running"), (2, "succeeded")]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="W036 is about SQLite")
def test_the_registered_checks_say_w036_for_this_suites_transactional_steps() -> None:
    from django.core import checks

    said = [m for m in checks.run_checks(tags=["django_leases"]) if m.id == "django_leases.W036"]
    assert len(said) == 1
    assert "tests.tx.append" in said[0].msg and "tests.dup.upsert" not in said[0].msg


seen_while_running: list[Any] = []


@step_function("tests.tx.progress", transactional=True)
def reports_progress(data: Any, ctx: StepContext) -> Any:
    """Reports progress (``data["in_block"]``: inside an ``atomic()`` block of its own, a
    savepoint, as a step saving its work in chunks does), then looks at its step from
    another connection while its own transaction is still open: the progress is there, and
    renewing the step lease (which updates the same row) does not wait for this
    transaction."""
    if data.get("in_block"):
        with transaction.atomic(using=ctx.using):
            ctx.set_progress({"done": 1, "of": 2})
    else:
        ctx.set_progress({"done": 1, "of": 2})

    def from_outside() -> tuple[Any, bool]:
        step = WorkflowStep.objects.get(pk=ctx._claim.step_id)
        renewed = WorkflowStep.objects.refresh_lease(step.pk, 600, ctx.attempt)
        return step.progress, renewed

    seen_while_running.append(helpers.on_another_thread(from_outside, timeout=30))
    return "done"


@needs_row_locks
@pytest.mark.parametrize("in_block", [False, True], ids=["in-its-transaction", "in-a-savepoint"])
@pytest.mark.django_db(transaction=True)
def test_progress_of_a_transactional_step_is_seen_at_once_and_blocks_no_renewal(
    in_block: bool,
) -> None:
    seen_while_running.clear()
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.progress", {"in_block": in_block})
    claim = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.progress", 600)
    assert claim is not None
    assert execute_step(claim) == "succeeded"
    assert seen_while_running == [({"done": 1, "of": 2}, True)]
    assert WorkflowStep.objects.get(pk=claim.step_id).progress == {"done": 1, "of": 2}
