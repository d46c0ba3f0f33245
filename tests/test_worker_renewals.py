"""The workflow worker's run and step leases on the process's one renewer (issue 31, items 1
and 3): several slow steps renewed in one statement per tick on the renewer's connection, a
lost step lease told to its own step only (its late result refused), a briefly broken
renewer connection costing no step lease, and nothing left registered or queued after the
runs end. The rules themselves (L9–L18, the step fence) are the conformance suites'."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import pytest
from django.db import DatabaseError, connection, connections

from django_leases import clock, db, renewal
from django_leases.models import StepStatus, WorkflowStep, WorkflowStepAttempt
from django_leases.models.outcomes import StepOutcomes
from django_leases.process import TIMERS
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import (
    drain,
    end_renewers,
    lapse_step_lease,
    renewal_threads,
    start_thread,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: How long a wait for a step, a tick or a loss may take: generous, never a timing claim.
PATIENCE = 60.0
#: The step lease of the slow steps, seconds (renewed every second).
STEP_TTL = 3.0
#: Slow steps running at once.
SLOW = 4

_release = threading.Event()
_lock = threading.Lock()
#: The context of each slow step running, by its run's ``key`` input.
_contexts: dict[str, Any] = {}


@step_function("tests.renewals-slow")
def slow(data: Any, ctx: Any) -> str:
    with _lock:
        _contexts[data["key"]] = ctx
    _release.wait(PATIENCE)
    return f"done {data['key']}"


@workflow("tests.renewals-slow")
def slow_workflow(run: Any, input: Any) -> Any:
    return run.step("slow", "tests.renewals-slow", {"key": input["key"]})


@step_function("tests.renewals-quick")
def quick(data: Any, ctx: Any) -> int:
    return int(data["n"]) + 1


@workflow("tests.renewals-quick")
def quick_workflow(run: Any, input: Any) -> Any:
    first = run.step("one", "tests.renewals-quick", {"n": input["n"]})
    return run.step("two", "tests.renewals-quick", {"n": first})


@pytest.fixture(autouse=True)
def renewers_ended(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test, the renewers' threads end and close their connection (none may be
    left on the test database when it is dropped)."""
    yield
    end_renewers(monkeypatch)


class Ticks:
    """Each ``refresh_leases`` call: its thread, how many step leases it renewed, and how
    many statements it sent (counted on the calling thread's connection)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.fail_next = 0
        self.backend_pids: list[int] = []

    def full(self, count: int) -> list[tuple[str, int, int]]:
        """The calls that renewed ``count`` step leases at once."""
        return [call for call in list(self.calls) if call[1] == count]


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ticks]:
    # Every lease due within a whole interval joins the tick: the slow steps, claimed at
    # slightly different moments, share their ticks from the first one on.
    monkeypatch.setattr(renewal, "COALESCE", 1.0)
    seen = Ticks()
    real = StepOutcomes.refresh_leases

    def counting(queryset: StepOutcomes, held: Sequence[tuple[int, int, float]]) -> Any:
        if seen.fail_next:
            seen.fail_next -= 1
            raise DatabaseError("the renewer's connection broke (test)")
        statements: list[str] = []

        def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
            statements.append(sql)
            return execute(sql, *args)

        conn = connections[queryset.write_alias()]
        with conn.execute_wrapper(count):
            answer = real(queryset, held)
        if conn.vendor == "postgresql":
            seen.backend_pids.append(conn.connection.info.backend_pid)
        seen.calls.append((threading.current_thread().name, len(held), len(statements)))
        return answer

    with mock.patch.object(StepOutcomes, "refresh_leases", counting):
        yield seen


@pytest.fixture
def slow_steps(ticks: Ticks) -> Iterator[tuple[Worker, list[Any]]]:
    """:data:`SLOW` runs whose one step blocks until released, running on an in-process
    worker of as many threads (step lease :data:`STEP_TTL`); yields the worker and the run
    ids. At the end the steps are released and the worker stopped. (Ask for ``sql_path``
    before it: the worker then runs on that path.)"""
    _release.clear()
    _contexts.clear()
    run_ids = [start_workflow("tests.renewals-slow", {"key": f"k{n}"}) for n in range(SLOW)]
    worker = Worker(concurrency=SLOW, poll_interval=0.05, step_lease_ttl=STEP_TTL)
    runner = start_thread(lambda: worker.run(handle_signals=False))
    try:
        wait_until(lambda: len(_contexts) == SLOW, PATIENCE, what="every slow step to start")
        yield worker, run_ids
    finally:
        _release.set()
        worker.stop()
        runner.join(PATIENCE)


def _step(run_id: Any) -> WorkflowStep:
    return WorkflowStep.objects.get(run_id=run_id, step_name="slow")


def _held_for(run_id: Any, seconds: float) -> bool:
    """Whether the slow step of ``run_id`` is running at attempt 1 with its lease good for
    more than ``seconds`` on the database clock."""
    return WorkflowStep.objects.filter(
        run_id=run_id,
        step_name="slow",
        status=StepStatus.RUNNING,
        attempt=1,
        lease_expires_at__gt=clock.db_now_plus(seconds),
    ).exists()


def test_concurrent_slow_steps_are_renewed_in_one_statement_per_tick(
    ticks: Ticks, slow_steps: tuple[Worker, list[Any]]
) -> None:
    _worker, run_ids = slow_steps
    wait_until(lambda: len(ticks.full(SLOW)) >= 3, PATIENCE, what="three ticks of every step")
    # Every renewal of a step lease was made by the renewer's one thread; none of the steps
    # has a renewal thread of its own.
    assert {name for name, _, _ in ticks.calls} == {"lease-renewer:default"}
    assert not [t.name for t in renewal_threads() if t.name.startswith("lease-renewal:")]
    if db.tuned(connection, "postgresql", "sqlite"):
        assert {statements for _, _, statements in ticks.calls} == {1}, ticks.calls
    if connection.vendor == "postgresql":
        assert len(set(ticks.backend_pids)) == 1  # on one connection
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            others = cursor.fetchone()[0]
        # The worker's threads' own connections, and at most two beside them (the renewer's,
        # the main loop's): no connection per step lease.
        print(f"connections beside the test's: {others}")
        assert others <= SLOW + 2, others
    # Each renewed a moment ago: good for more than the two renewals to come.
    assert all(_held_for(run_id, STEP_TTL / 3) for run_id in run_ids)
    assert not any(ctx.lease_lost.is_set() for ctx in _contexts.values())


def test_a_step_lease_taken_over_is_told_to_that_step_alone_and_its_result_refused(
    sql_path: str, ticks: Ticks, slow_steps: tuple[Worker, list[Any]]
) -> None:
    _worker, run_ids = slow_steps
    wait_until(lambda: ticks.full(SLOW), PATIENCE, what="a tick of every step")
    victim, others = run_ids[1], run_ids[:1] + run_ids[2:]
    # Lapse the victim's lease on the database clock, and let another worker claim the next
    # attempt (the takeover a dead worker's steps get).
    lapse_step_lease(run_id=victim, step_name="slow")
    taken = WorkflowStep.objects.claim_for_execution(
        victim, "slow", "tests.renewals-slow", 600, claimant="thief"
    )
    assert taken is not None and taken.attempt == 2
    assert _contexts["k1"].lease_lost.wait(PATIENCE), "the superseded step was never told"
    calls = len(ticks.calls)
    wait_until(lambda: len(ticks.calls) > calls + 1, PATIENCE, what="two more ticks")
    assert not any(_contexts[f"k{n}"].lease_lost.is_set() for n in (0, 2, 3))
    _release.set()
    # The others' results land; the victim's late result does not: its step is the thief's
    # attempt 2, and its own attempt 1 keeps ``running`` in the history.
    for run_id in others:
        wait_until(
            lambda run_id=run_id: _step(run_id).status == StepStatus.SUCCEEDED,
            PATIENCE,
            what="the other steps' results",
        )
    step = _step(victim)
    assert (step.status, step.attempt, step.result) == (StepStatus.RUNNING, 2, None)
    first = WorkflowStepAttempt.objects.get(step=step, attempt=1)
    assert first.status == "running" and first.result is None


def test_a_briefly_broken_renewer_connection_costs_no_step_lease(
    ticks: Ticks, slow_steps: tuple[Worker, list[Any]]
) -> None:
    _worker, run_ids = slow_steps
    wait_until(lambda: ticks.full(SLOW), PATIENCE, what="a tick of every step")
    if connection.vendor == "postgresql":
        # The renewer's own session dies under it: its next tick fails, the one after
        # reconnects.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [ticks.backend_pids[-1]])
    else:
        ticks.fail_next = 1
    failed = renewal.renewer("default").ticks
    wait_until(
        lambda: renewal.renewer("default").ticks > failed + 1 and ticks.fail_next == 0,
        PATIENCE,
        what="the failed tick",
    )
    renewed = len(ticks.full(SLOW))
    wait_until(lambda: len(ticks.full(SLOW)) >= renewed + 2, PATIENCE, what="two good ticks")
    assert not any(ctx.lease_lost.is_set() for ctx in _contexts.values())
    assert all(_held_for(run_id, 0) for run_id in run_ids)


def test_finished_runs_leave_no_lease_registered_nor_timer_queued() -> None:
    run_ids = [start_workflow("tests.renewals-quick", {"n": n}) for n in range(20)]
    queued = TIMERS.queued()
    drain(Worker(step_lease_ttl=60.0))
    assert {str(r) for r in run_ids} == {
        str(r)
        for r in WorkflowStep.objects.filter(
            step_name="two", status=StepStatus.SUCCEEDED
        ).values_list("run_id", flat=True)
    }
    held = renewal.renewer("default").held()
    assert not [name for name in held if name.startswith(("workflow-step:", "workflow-run:"))]
    # Neither renewal timers (none is made any more) nor statement bounds stay queued.
    assert TIMERS.queued() <= queued
    assert not [t.name for t in renewal_threads() if t.name.startswith("lease-renewal:")]
