"""The claim of a due step from the queue, on both paths of the SQL switch, where no queue has
limits: PostgreSQL's one-statement claim (function ``claim_step``) and the portable ORM path
must decide alike.

The suite's own ``DJANGO_LEASES["QUEUES"]`` has limited queues (for the queue tests), and a
worker that may take a limited queue claims the portable way, so these tests set queues
without limits: only then does PostgreSQL's tuned claim run.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, transaction

from django_leases import signals
from django_leases.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
    claims,
)
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from tests.helpers import (
    closing_connections,
    lapse_step_lease,
    no_queue_limits,
    race,
    tuned_sql,
)

LEASE = 30.0


@step_function("tests.claims.plain")
def plain(data: Any, ctx: Any) -> Any:
    return data


@workflow("tests.claims.idle")
def idle(run: Any, input: Any) -> Any:
    """A run whose steps the tests schedule by hand (its passes wait on them)."""
    return run.step("never", "tests.claims.plain", {})


@pytest.fixture(params=[True, False], ids=["tuned", "portable"])
def sql_switch(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Each path in turn, with queues that have no limits."""
    with no_queue_limits(), tuned_sql(request.param):
        yield bool(request.param)


def _run() -> uuid.UUID:
    return start_workflow("tests.claims.idle", {})


def _schedule(run_id: uuid.UUID, name: str, **extra: Any) -> WorkflowStep:
    return WorkflowStep.objects.schedule(run_id, name, "tests.claims.plain", {"n": name}, **extra)


def _names() -> list[str]:
    found = []
    while (claim := WorkflowStep.objects.claim_due(LEASE)) is not None:
        found.append(claim.step_name)
    return found


pytestmark = pytest.mark.django_db(transaction=True)


def test_the_claim_is_by_priority_then_first_due(sql_switch: bool) -> None:
    run_id = _run()
    for name, priority in (("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -3)):
        _schedule(run_id, name, priority=priority)
    assert _names() == ["b", "d", "a", "c", "e"]


def test_a_claim_starts_the_attempt_with_its_lease_and_attempt_row(sql_switch: bool) -> None:
    run_id = _run()
    step = _schedule(run_id, "one", timeout=60.0)
    started: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        started.append(kwargs)

    signals.step_attempt_started.connect(receive)
    try:
        claim = WorkflowStep.objects.claim_due(LEASE)
    finally:
        signals.step_attempt_started.disconnect(receive)
    assert claim is not None
    assert (claim.step_id, claim.run_id, claim.step_name, claim.attempt) == (
        step.pk,
        run_id,
        "one",
        1,
    )
    assert claim.function_name == "tests.claims.plain" and claim.data == {"n": "one"}
    row = WorkflowStep.objects.get(pk=step.pk)
    assert row.status == StepStatus.RUNNING and row.attempt == 1
    assert row.lease_expires_at is not None and row.deadline_at is not None
    history = WorkflowStepAttempt.objects.get(step=step, attempt=1)
    assert history.status == "running" and history.finished_at is None
    run = WorkflowRun.objects.get(pk=run_id)
    if sql_switch and connection.vendor == "postgresql":
        # The tuned claim reads back the times a task's started result needs.
        assert claim.started_at == history.started_at and claim.run_created_at == run.created_at
    [event] = started
    assert event["step_id"] == step.pk and event["attempt"] == 1
    assert event["waited"] is not None and event["waited"] >= 0
    assert WorkflowStep.objects.claim_due(LEASE) is None, "a running step is not claimed again"


def test_a_failed_step_is_claimed_again_at_the_next_attempt_until_none_is_left(
    sql_switch: bool,
) -> None:
    run_id = _run()
    step = _schedule(run_id, "flaky", retries=1)
    first = WorkflowStep.objects.claim_due(LEASE)
    assert first is not None and first.attempt == 1
    WorkflowStep.objects.set_error(step.pk, "boom", 1)
    second = WorkflowStep.objects.claim_due(LEASE)
    assert second is not None and second.attempt == 2
    row = WorkflowStep.objects.get(pk=step.pk)
    assert (row.status, row.attempt, row.result, row.error) == (StepStatus.RUNNING, 2, None, None)
    WorkflowStep.objects.set_error(step.pk, "boom again", 2)
    assert WorkflowStep.objects.claim_due(LEASE) is None, "no attempt is left"
    assert [
        a.status for a in WorkflowStepAttempt.objects.filter(step=step).order_by("attempt")
    ] == [
        "failed",
        "failed",
    ]


def test_a_retry_waits_for_its_delay(sql_switch: bool) -> None:
    run_id = _run()
    step = _schedule(run_id, "delayed", retries=2, retry_delay=3600)
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    WorkflowStep.objects.set_error(step.pk, "boom", 1)
    assert WorkflowStep.objects.claim_due(LEASE) is None, "its retry is an hour away"
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.FAILED


def test_a_lapsed_step_is_taken_over_first_at_the_next_attempt(sql_switch: bool) -> None:
    run_id = _run()
    lost = _schedule(run_id, "lost")
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    _schedule(run_id, "waiting", priority=100)
    lapse_step_lease(lost.pk)
    taken = WorkflowStep.objects.claim_due(LEASE)
    assert taken is not None and (taken.step_name, taken.attempt) == ("lost", 2)
    following = WorkflowStep.objects.claim_due(LEASE)
    assert following is not None and following.step_name == "waiting"


def test_a_lapsed_step_out_of_attempts_fails_and_the_next_is_claimed(sql_switch: bool) -> None:
    run_id = _run()
    lost = _schedule(run_id, "lost", retries=0)
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    _schedule(run_id, "next")
    lapse_step_lease(lost.pk)
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and claim.step_name == "next"
    assert WorkflowStep.objects.get(pk=lost.pk).status == StepStatus.FAILED


def test_no_step_of_a_run_that_is_not_running_is_claimed(sql_switch: bool) -> None:
    cancelled, suspended = _run(), _run()
    _schedule(cancelled, "c")
    _schedule(suspended, "s")
    WorkflowRun.objects.cancel(cancelled)
    WorkflowRun.objects.suspend(suspended, "held")
    assert WorkflowRun.objects.get(pk=suspended).status == RunStatus.SUSPENDED
    assert WorkflowStep.objects.claim_due(LEASE) is None


def test_a_worker_takes_only_its_queues(sql_switch: bool) -> None:
    run_id = _run()
    _schedule(run_id, "mail", queue="tests-mail")
    _schedule(run_id, "other", queue="tests-other")
    _schedule(run_id, "plain")
    claim = WorkflowStep.objects.claim_due(LEASE, queues=["tests-other"])
    assert claim is not None and claim.step_name == "other"
    assert WorkflowStep.objects.claim_due(LEASE, queues=["tests-other"]) is None
    assert sorted(_names()) == ["mail", "plain"]


def test_racing_claims_take_each_step_once(sql_switch: bool) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: there is no race to lose")
    run_id = _run()
    for n in range(12):
        _schedule(run_id, f"s{n}")
    gate = threading.Barrier(4)

    @closing_connections
    def claimer() -> list[str]:
        gate.wait()
        return _names()

    found = race([claimer] * 4)
    names = [name for names in found for name in names]
    assert sorted(names) == sorted(f"s{n}" for n in range(12)), "each step claimed exactly once"


def _claim_beside_an_open_claim() -> tuple[str | None, str | None]:
    """Claim a step of ``default`` while another thread's claim of one sits in its open
    transaction; the names of both steps claimed (``None``: none)."""
    claimed, done = threading.Event(), threading.Event()

    @closing_connections
    def holder() -> str | None:
        with transaction.atomic():
            claim = WorkflowStep.objects.claim_due(LEASE, queues=["default"])
            claimed.set()
            assert done.wait(60), "the other claim did not finish"
        return None if claim is None else claim.step_name

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(holder)
        try:
            assert claimed.wait(60), "the first claim did not finish"
            other = WorkflowStep.objects.claim_due(LEASE, queues=["default"])
        finally:
            done.set()
        first = held.result(60)
    return first, None if other is None else other.step_name


def test_a_claim_in_its_transaction_hides_only_its_own_step(sql_switch: bool) -> None:
    """A claim whose transaction is still open locks its step, not the rows its search read:
    another claim meanwhile takes another run's step. (InnoDB locks every row a locking
    read reads through a secondary index, and a claim's read of a queue's lapsed steps
    reads all of the queue's steps: claims racing it skipped every step and found none
    due.)"""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: a second claim waits for the first")
    for n in range(24):
        _schedule(_run(), f"s{n}")
    first, other = _claim_beside_an_open_claim()
    assert first is not None and other is not None, (first, other)
    assert first != other


@pytest.mark.parametrize("rounds", [2, 1], ids=["next-round", "locking-read"])
def test_a_claim_whose_candidates_are_taken_reads_on(
    sql_switch: bool, rounds: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB / MySQL read a claim's candidates without a lock, then lock them one at a
    time: when every candidate read is taken meanwhile, the claim reads the next ones, and
    after its last round of reads one locking read decides."""
    if connection.vendor != "mysql":
        pytest.skip("Elsewhere a claim locks what it finds in one read")
    monkeypatch.setattr(claims, "LOCK_CANDIDATES", 1)
    monkeypatch.setattr(claims, "LOCK_ROUNDS", rounds)
    for n in range(3):
        _schedule(_run(), f"s{n}")
    first, other = _claim_beside_an_open_claim()
    # The open claim took s0, which the second still reads as pending and finds locked.
    assert (first, other) == ("s0", "s1")


@pytest.mark.parametrize("candidates", [16, 1], ids=["candidates", "locking-read"])
def test_eight_racing_claimers_take_each_of_200_steps_once(
    candidates: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB / MySQL: eight claimers, each claiming until it finds nothing, take each of
    200 steps of 20 runs exactly once and leave none due, by the candidates path and (one
    candidate, one round) mostly by the locking read after it."""
    if connection.vendor != "mysql":
        pytest.skip("The MariaDB / MySQL claim's paths (elsewhere: the racing test above)")
    if candidates == 1:
        monkeypatch.setattr(claims, "LOCK_CANDIDATES", 1)
        monkeypatch.setattr(claims, "LOCK_ROUNDS", 1)
    runs = [_run() for _ in range(20)]
    ids = [_schedule(runs[n % 20], f"s{n}", priority=n % 3).pk for n in range(200)]

    @closing_connections
    def claimer() -> list[int]:
        taken = []
        while (claim := WorkflowStep.objects.claim_due(LEASE)) is not None:
            taken.append(claim.step_id)
        return taken

    with no_queue_limits():
        found = race([claimer] * 8, timeout=180)
    assert all(isinstance(taken, list) for taken in found), found
    assert sorted(step for taken in found for step in taken) == sorted(ids)
    assert not WorkflowStepAttempt.objects.filter(step_id__in=ids).exclude(attempt=1).exists()
