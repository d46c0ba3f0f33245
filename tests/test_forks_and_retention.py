"""Forks and retention together: a fork reads the child runs its original read, so a prune
keeps a child while any run that reads it is kept (its parent, or a fork that copied the
parent's wait), a fork is refused when such a child is gone or running again, and such a
child is not set running again while a fork that read it may still replay.

The races order threads with barriers and the database's lock waits (``pg_blocking_pids()``
on PostgreSQL, InnoDB's lock waits on MariaDB); SQLite writes one at a time, so a prune
cannot run inside a fork's transaction there."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.models import DateTimeField, Value

from django_leases.clock import db_now_plus
from django_leases.exceptions import WorkflowChildFailedError, WorkflowRunStateError
from django_leases.models import Lease, RunStatus, WorkflowRun, WorkflowWait, operations
from django_leases.models import forks as forks_module
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.values import run_lease_key
from tests.helpers import backend_pid, drain, run_of, start_thread, wait_until, wait_until_blocked

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 24 * 3600.0
TIMEOUT = 60.0

#: What fails now (a deploy "fixes" a step by flipping its flag).
FAILS = {"kid": False, "compensate": False}


@pytest.fixture(autouse=True)
def _flags() -> Any:
    FAILS.update(kid=False, compensate=False)
    yield
    FAILS.update(kid=False, compensate=False)


@step_function("tests.forks-retention.work")
def work(data: dict[str, Any], ctx: Any) -> Any:
    if data.get("fail") and FAILS[data["fail"]]:
        raise RuntimeError(f"{data['fail']} fails")
    return data.get("n", 0)


@workflow("tests.forks-retention.kid")
def kid_workflow(run: Any, input: Any) -> Any:
    return run.step("k", "tests.forks-retention.work", {"fail": "kid", "n": 7}, retries=0)


@workflow("tests.forks-retention.parent")
def parent_workflow(run: Any, input: Any) -> Any:
    try:
        got = run.child("kid", "tests.forks-retention.kid", {})
    except WorkflowChildFailedError:
        got = run.step(
            "compensate", "tests.forks-retention.work", {"fail": "compensate", "n": -1}, retries=0
        )
    after = run.step("after", "tests.forks-retention.work", {"n": 1}, retries=0)
    return {"got": got, "after": after}


def _completed_family() -> tuple[WorkflowRun, WorkflowRun]:
    """A completed parent that read its completed child (then ran step ``after``)."""
    run_id = start_workflow("tests.forks-retention.parent", {})
    drain()
    parent = run_of(run_id)
    assert parent.status == RunStatus.COMPLETED, (parent.status, parent.error)
    assert parent.output == {"got": 7, "after": 1}
    return parent, WorkflowRun.objects.get(parent_id=run_id)


def _failed_family() -> tuple[WorkflowRun, WorkflowRun]:
    """The parent caught its child's failure; its compensation failed too: parent failed."""
    FAILS.update(kid=True, compensate=True)
    run_id = start_workflow("tests.forks-retention.parent", {})
    drain()
    parent = run_of(run_id)
    assert parent.status == RunStatus.FAILED
    kid = WorkflowRun.objects.get(parent_id=run_id)
    assert kid.status == RunStatus.FAILED
    return parent, kid


def _age(run: WorkflowRun, days: float) -> None:
    WorkflowRun.objects.filter(pk=run.pk).update(finished_at=db_now_plus(-days * DAY))


def _assert_fork_replays_the_original(fork_id: Any, parent: WorkflowRun, kid: WorkflowRun) -> None:
    """The fork's copied child wait still points at the child, and the fork ends as the
    original did (it read the child's outcome, started no new child)."""
    wait = WorkflowWait.objects.get(run_id=fork_id, name="kid")
    assert wait.child_id == kid.pk, "the fork's child wait lost its child"
    drain()
    fork = run_of(fork_id)
    assert fork.status == RunStatus.COMPLETED, (fork.status, fork.error)
    assert fork.output == parent.output
    assert WorkflowRun.objects.filter(parent_id=fork_id).count() == 0


def _held_while_contending(
    first: Any, second: Any, paused: tuple[Any, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``first()`` on a thread until it first calls ``paused`` (``(owner, name)``: the
    attribute held there), then ``second()`` on another until it waits on a lock (or
    finishes without waiting), then let ``first`` go; both outcomes (``value`` or
    ``error``)."""
    reached, go = threading.Barrier(2), threading.Barrier(2)
    module, name = paused
    original = getattr(module, name)
    once: list[bool] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        if not once:
            once.append(True)
            reached.wait(TIMEOUT)
            go.wait(TIMEOUT)
        return original(*args, **kwargs)

    outcomes: tuple[dict[str, Any], dict[str, Any]] = ({}, {})

    def call(body: Any, outcome: dict[str, Any]) -> Any:
        def run() -> None:
            outcome["pid"] = backend_pid()
            try:
                outcome["value"] = body()
            except BaseException as exc:  # reported by the assertions below
                outcome["error"] = exc

        return run

    with mock.patch.object(module, name, held):
        one = start_thread(call(first, outcomes[0]))
        reached.wait(TIMEOUT)
        two = start_thread(call(second, outcomes[1]))
        wait_until(lambda: "pid" in outcomes[1] or not two.is_alive(), TIMEOUT, what="a pid")
        wait_until_blocked(outcomes[1]["pid"], TIMEOUT, unless=lambda: not two.is_alive())
        go.wait(TIMEOUT)
        one.join(TIMEOUT)
        two.join(TIMEOUT)
    assert not one.is_alive() and not two.is_alive()
    return outcomes


def _needs_row_locks() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: a prune cannot run inside a fork")


# -- a prune keeps a child while a run that reads it is kept --------------------------------------


def test_a_prune_keeps_a_child_while_its_finished_parent_is_kept() -> None:
    """The child finished 40 days ago, its parent (a long run) a day ago: a 30-day prune
    keeps the child, so a fork of the parent still reads it; the parent's prune takes both."""
    parent, kid = _completed_family()
    _age(kid, 40)
    _age(parent, 1)
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    fork = WorkflowRun.objects.fork(parent.pk, "after")
    _assert_fork_replays_the_original(fork.pk, parent, kid)
    WorkflowRun.objects.filter(pk=fork.pk).delete()
    _age(parent, 40)
    assert WorkflowRun.objects.prune(30 * DAY, batch_size=1) == 2


def test_a_prune_keeps_a_child_a_finished_fork_reads_once_its_parent_is_gone() -> None:
    """The original and its child go; a fork that copied the child wait is kept (finished a
    day ago), so the child stays: the fork may itself be forked again and read it."""
    parent, kid = _completed_family()
    fork = WorkflowRun.objects.fork(parent.pk, "after")
    drain()
    _age(kid, 41)
    _age(parent, 40)
    _age(run_of(fork.pk), 1)
    assert WorkflowRun.objects.prune(30 * DAY) == 1  # the original only
    again = WorkflowRun.objects.fork(fork.pk, "after")
    _assert_fork_replays_the_original(again.pk, parent, kid)


def test_a_prune_of_a_forked_original_keeps_the_child_its_running_fork_reads() -> None:
    parent, kid = _completed_family()
    _age(kid, 40)
    _age(parent, 40)
    fork = WorkflowRun.objects.fork(parent.pk, "after")
    assert WorkflowRun.objects.prune(30 * DAY) == 1  # the original only: the fork reads the kid
    assert not WorkflowRun.objects.filter(pk=parent.pk).exists()
    assert run_of(fork.pk).forked_from_id is None
    _assert_fork_replays_the_original(fork.pk, parent, kid)


def test_a_prune_in_batches_of_one_takes_parents_then_their_children() -> None:
    parent, kid = _completed_family()
    failed, failed_kid = _failed_family()
    for run in (parent, kid, failed, failed_kid):
        _age(run, 40)
    assert WorkflowRun.objects.prune(30 * DAY, batch_size=1) == 4
    assert not WorkflowRun.objects.exists()


def test_a_prune_skips_a_run_whose_lease_is_live_and_keeps_its_child_with_it() -> None:
    parent, kid = _completed_family()
    _age(parent, 40)
    _age(kid, 40)
    lease = Lease.objects.acquire(run_lease_key(parent.pk), "finishing-worker", 60)
    assert lease is not None
    assert WorkflowRun.objects.prune(30 * DAY, batch_size=1) == 0
    assert WorkflowRun.objects.filter(pk__in=[parent.pk, kid.pk]).count() == 2
    Lease.objects.release(lease)
    assert WorkflowRun.objects.prune(30 * DAY, batch_size=1) == 2


def test_the_prune_cutoff_includes_a_run_finished_exactly_older_than_ago() -> None:
    """``older_than`` or more: a run finished exactly ``older_than`` before DB now goes."""
    parent, kid = _completed_family()
    fixed = run_of(parent.pk).finished_at + timedelta(seconds=10)

    def frozen(seconds: float) -> Any:
        return Value(fixed + timedelta(seconds=seconds), output_field=DateTimeField())

    WorkflowRun.objects.filter(pk=kid.pk).update(finished_at=fixed - timedelta(seconds=20))
    with mock.patch("django_leases.models.operations.clock.db_now_plus", frozen):
        assert WorkflowRun.objects.prune(10) == 2  # the parent (exactly 10 s), then its child


# -- a fork racing a prune ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parent_age", "paused", "pruned_count"),
    [
        # The fork has written its copy, not committed; the prune waits for the children's
        # lock, then deletes the original only: the committed fork reads the child.
        (40, (forks_module, "wake_workers"), 1),
        # The original finished a day ago (kept): the fork has read the child wait when
        # the prune runs, which takes nothing (the child is the kept original's).
        (1, (forks_module.RunForks, "_create_tagged"), 0),
    ],
)
def test_a_prune_racing_a_fork_deletes_no_child_the_fork_reads(
    parent_age: float, paused: tuple[Any, str], pruned_count: int
) -> None:
    """The child finished 41 days ago; a 30-day prune runs while a fork of its parent is
    inside its transaction: the fork commits whole and still reads the child."""
    _needs_row_locks()
    parent, kid = _completed_family()
    _age(kid, 41)
    _age(parent, parent_age)
    forked, pruned = _held_while_contending(
        lambda: WorkflowRun.objects.fork(parent.pk, "after"),
        lambda: WorkflowRun.objects.prune(30 * DAY),
        paused,
    )
    assert "error" not in forked and "error" not in pruned, (forked, pruned)
    assert pruned["value"] == pruned_count
    assert WorkflowRun.objects.filter(pk=parent.pk).exists() == (pruned_count == 0)
    _assert_fork_replays_the_original(forked["value"].pk, parent, kid)


def test_a_fork_while_a_prune_holds_the_original_finds_no_run() -> None:
    """A prune (batch of one) has locked the original to delete it; a fork of it waits for
    the lock, then finds no run: refused cleanly, nothing written (its child goes next)."""
    _needs_row_locks()
    parent, kid = _completed_family()
    _age(kid, 41)
    _age(parent, 40)
    pruned, forked = _held_while_contending(
        lambda: WorkflowRun.objects.prune(30 * DAY, batch_size=1),
        lambda: WorkflowRun.objects.fork(parent.pk, "after"),
        (operations, "run_lease_key"),
    )
    assert "error" not in pruned, pruned
    assert pruned["value"] == 2
    assert isinstance(forked.get("error"), WorkflowRun.DoesNotExist), forked
    assert not WorkflowRun.objects.exists()


# -- a fork reads the outcome its original read ---------------------------------------------------


def test_a_fork_is_refused_when_the_child_it_would_read_was_pruned() -> None:
    """A database pruned before a child was kept with its parent: the child is gone, the
    copied wait would point at nothing. The fork is refused, naming the wait; nothing is
    written."""
    parent, kid = _completed_family()
    WorkflowRun.objects.filter(pk=kid.pk).delete()  # as an earlier prune did
    with pytest.raises(ValueError, match="'kid' was pruned"):
        WorkflowRun.objects.fork(parent.pk, "after")
    assert WorkflowRun.objects.count() == 1


def test_a_fork_is_refused_while_the_child_it_would_read_runs_again() -> None:
    """The failed parent's failed child was resumed (after a fix): a fork of the parent
    would wait for an end that wakes only the child's parent. Refused until it finished."""
    parent, kid = _failed_family()
    FAILS.update(kid=False, compensate=False)  # the deploy
    WorkflowRun.objects.resume(kid.pk)
    with pytest.raises(WorkflowRunStateError, match="once it finished") as refused:
        WorkflowRun.objects.fork_from_failed(parent.pk)
    assert refused.value.run_id == kid.pk
    assert not WorkflowRun.objects.filter(forked_from_id=parent.pk).exists()
    drain()
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)  # from "compensate": reads 7
    drain()
    assert run_of(fork.pk).output == {"got": 7, "after": 1}


def test_a_child_a_running_fork_read_is_not_resumed_until_the_fork_is_cancelled() -> None:
    """The fork (due for its first pass) reads the child's failure; resuming the child
    would change the outcome the fork's replays meet. Refused, naming the fork; allowed once
    the fork is cancelled."""
    parent, kid = _failed_family()
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)
    assert run_of(fork.pk).status == RunStatus.RUNNING
    for operation in (WorkflowRun.objects.resume, WorkflowRun.objects.retry):
        with pytest.raises(WorkflowRunStateError, match=str(fork.pk)):
            operation(kid.pk)
    assert run_of(kid.pk).status == RunStatus.FAILED
    WorkflowRun.objects.cancel(fork.pk)
    FAILS.update(kid=False)
    WorkflowRun.objects.resume(kid.pk)
    drain()
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    assert run_of(fork.pk).status == RunStatus.CANCELLED
    assert run_of(parent.pk).status == RunStatus.FAILED  # not woken: it is failed


def test_a_failed_fork_is_resumed_once_the_child_it_read_finished_again() -> None:
    """A failed fork is like the failed parent: the child may be resumed first; the fork
    is not resumed while that child runs (nothing would wake it), and once the child
    finished the resumed fork reads its new outcome."""
    parent, kid = _failed_family()
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)
    drain()
    assert run_of(fork.pk).status == RunStatus.FAILED  # the compensation still fails
    FAILS.update(kid=False, compensate=False)  # the deploy
    WorkflowRun.objects.resume(kid.pk)
    for operation in (WorkflowRun.objects.resume, WorkflowRun.objects.retry):
        with pytest.raises(WorkflowRunStateError, match=f"child run {kid.pk}"):
            operation(fork.pk)
    drain()
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    WorkflowRun.objects.resume(fork.pk)
    drain()
    assert run_of(fork.pk).status == RunStatus.COMPLETED
    assert run_of(fork.pk).output == {"got": 7, "after": 1}


def test_a_child_a_running_fork_reads_is_not_resumed_once_its_parent_was_pruned() -> None:
    """The failed original is pruned (its fork reads the failed child, so the child stays,
    its parent emptied); the child is still not set running while the fork runs, and the
    fork ends as a run that read that failure."""
    parent, kid = _failed_family()
    FAILS.update(compensate=False)
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)
    _age(parent, 40)
    _age(kid, 40)
    assert WorkflowRun.objects.prune(30 * DAY) == 1  # the original only
    assert run_of(kid.pk).parent_id is None
    FAILS.update(kid=False)
    for operation in (WorkflowRun.objects.resume, WorkflowRun.objects.retry):
        with pytest.raises(WorkflowRunStateError, match=str(fork.pk)):
            operation(kid.pk)
    drain()
    assert run_of(fork.pk).output == {"got": -1, "after": 1}


def test_a_resume_of_the_child_racing_a_fork_that_reads_it_is_ordered_by_the_childs_lock() -> None:
    """A fork locks the children it reads before it reads them: a resume of one of them
    waits for the fork, then meets its wait and is refused (or, first, sets the child
    running and the fork is refused). Never both."""
    _needs_row_locks()
    parent, kid = _failed_family()
    FAILS.update(kid=False, compensate=False)
    forked, resumed = _held_while_contending(
        lambda: WorkflowRun.objects.fork_from_failed(parent.pk),
        lambda: WorkflowRun.objects.resume(kid.pk),
        (forks_module.RunForks, "_create_tagged"),
    )
    assert "error" not in forked, forked
    assert isinstance(resumed.get("error"), WorkflowRunStateError), resumed
    assert run_of(kid.pk).status == RunStatus.FAILED
    drain()
    assert run_of(forked["value"].pk).output == {"got": -1, "after": 1}


def test_a_resume_of_a_failed_fork_racing_a_resume_of_its_child_is_ordered_too() -> None:
    """A failed fork and the failed child it read, resumed at once by two operators: the
    fork's resume locks the child it reads, so one of the two is refused — never a fork
    running while its child runs again (no end of the child would wake it)."""
    _needs_row_locks()
    parent, kid = _failed_family()
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)
    drain()
    assert run_of(fork.pk).status == RunStatus.FAILED
    FAILS.update(kid=False, compensate=False)
    resumed_fork, resumed_kid = _held_while_contending(
        lambda: WorkflowRun.objects.resume(fork.pk),
        lambda: WorkflowRun.objects.resume(kid.pk),
        (operations, "_reopen_missing_function_steps"),
    )
    assert "error" not in resumed_fork, resumed_fork
    assert isinstance(resumed_kid.get("error"), WorkflowRunStateError), resumed_kid
    drain()
    assert run_of(fork.pk).output == {"got": -1, "after": 1}


def test_a_finished_fork_keeps_the_outcome_it_read_when_the_child_is_resumed_later() -> None:
    parent, kid = _failed_family()
    FAILS.update(kid=False, compensate=False)
    fork = WorkflowRun.objects.fork_from_failed(parent.pk)
    drain()
    assert run_of(fork.pk).output == {"got": -1, "after": 1}
    WorkflowRun.objects.resume(kid.pk)
    drain()
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    assert run_of(fork.pk).output == {"got": -1, "after": 1}
    assert run_of(parent.pk).status == RunStatus.FAILED
