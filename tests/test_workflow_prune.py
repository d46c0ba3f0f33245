"""Retention: ``WorkflowRun.objects.prune`` and ``manage.py workflow_runs prune`` delete runs
that finished long ago, with their steps, attempts and run leases, and nothing else."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_leases.clock import db_now_plus
from django_leases.models import (
    Lease,
    RunStatus,
    TriggerEvent,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
    WorkflowWait,
)
from django_leases.models.operations import RunOperations
from django_leases.workflows.values import WaitKind, run_lease_key

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 24 * 3600.0


def _run(status: str, finished_days_ago: float | None) -> Any:
    """A run with one succeeded step (and its attempt) and a released run lease, in
    ``status``, finished ``finished_days_ago`` days ago on the database clock."""
    run = WorkflowRun.objects.start("tests.prune", {})
    step = WorkflowStep.objects.schedule(run.id, "only", "tests.prune-step")
    claim = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.prune-step", 60)
    assert claim is not None
    WorkflowStep.objects.set_result(step.pk, {"ok": True}, claim.attempt)
    lease = Lease.objects.acquire(run_lease_key(run.id), "test-holder", 60)
    assert lease is not None
    Lease.objects.release(lease)
    finished_at = None if finished_days_ago is None else db_now_plus(-finished_days_ago * DAY)
    WorkflowRun.objects.filter(pk=run.id).update(status=status, finished_at=finished_at)
    return run


def _left(run: Any) -> tuple[bool, bool, bool, bool]:
    """What of ``run`` is left: the run, its steps, its attempts, its run lease."""
    return (
        WorkflowRun.objects.filter(pk=run.id).exists(),
        WorkflowStep.objects.filter(run_id=run.id).exists(),
        WorkflowStepAttempt.objects.filter(step__run_id=run.id).exists(),
        Lease.objects.filter(key=run_lease_key(run.id)).exists(),
    )


def test_prune_deletes_runs_finished_long_ago_with_their_steps_attempts_and_leases() -> None:
    old = [_run(status, 40) for status in ("completed", "failed", "cancelled")]
    recent = _run(RunStatus.COMPLETED, 10)
    running = _run(RunStatus.RUNNING, None)
    suspended = _run(RunStatus.SUSPENDED, 40)  # suspended runs wait for an operator
    delivery = TriggerEvent.objects.create(
        source_name="src", delivery_id="d1", event="push", payload={}, run_id=old[0].id
    )
    assert WorkflowRun.objects.prune(timedelta(days=30), batch_size=2) == 3
    for run in old:
        assert _left(run) == (False, False, False, False)
    for run in (recent, running, suspended):
        assert _left(run) == (True, True, True, True)
    delivery.refresh_from_db()
    assert delivery.run_id is None, "the delivery stays, so a redelivery is still known"
    assert WorkflowRun.objects.prune(30 * DAY) == 0


def test_prune_leaves_a_run_whose_lease_is_live() -> None:
    run = _run(RunStatus.COMPLETED, 40)
    other = _run(RunStatus.COMPLETED, 40)
    assert Lease.objects.acquire(run_lease_key(run.id), "a-worker-still-there", 60)
    assert WorkflowRun.objects.prune(30 * DAY, batch_size=1) == 1
    assert _left(run) == (True, True, True, True)
    assert _left(other) == (False, False, False, False)


@pytest.mark.parametrize(
    ("older_than", "batch_size"),
    [(-1, 500), (float("nan"), 500), ("30", 500), (True, 500), (DAY, 0), (DAY, 2.5)],
)
def test_prune_refuses_bad_arguments_and_deletes_nothing(older_than: Any, batch_size: Any) -> None:
    run = _run(RunStatus.COMPLETED, 40)
    with pytest.raises(ValueError):
        WorkflowRun.objects.prune(older_than, batch_size=batch_size)
    assert _left(run) == (True, True, True, True)


def test_the_command_prunes_and_says_how_many() -> None:
    _run(RunStatus.COMPLETED, 3)
    kept = _run(RunStatus.COMPLETED, 1)
    out = StringIO()
    call_command("workflow_runs", "prune", "--older-than", "2", stdout=out, stderr=StringIO())
    assert out.getvalue().strip() == "Deleted 1 run(s) finished more than 2 day(s) ago."
    assert _left(kept)[0]
    with pytest.raises(CommandError) as refused:
        call_command("workflow_runs", "prune", "--older-than", "-1", stderr=StringIO())
    assert refused.value.returncode == 1
    assert _left(kept)[0]


@pytest.mark.parametrize("child_status", [RunStatus.RUNNING, RunStatus.SUSPENDED])
def test_prune_keeps_a_finished_parent_while_a_child_of_it_is_live(child_status: str) -> None:
    # A failed parent may be repaired: the operator resumes its child, then it. Pruning the
    # parent meanwhile would leave the child an orphan whose end wakes nobody.
    parent = _run(RunStatus.FAILED, 40)
    child = WorkflowRun.objects.start("tests.prune", {}, parent=parent.id)
    WorkflowRun.objects.filter(pk=child.id).update(status=child_status)
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    assert _left(parent) == (True, True, True, True)
    assert WorkflowRun.objects.get(pk=child.id).parent_id == parent.id
    # The child completed just now: the parent, resumed next by the repair, stays.
    WorkflowRun.objects.filter(pk=child.id).update(
        status=RunStatus.COMPLETED, finished_at=db_now_plus(0)
    )
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    assert _left(parent) == (True, True, True, True)
    # Once the child, too, finished long ago, both go (the child a sweep after its parent).
    WorkflowRun.objects.filter(pk=child.id).update(finished_at=db_now_plus(-40 * DAY))
    assert WorkflowRun.objects.prune(30 * DAY) == 2
    assert _left(parent) == (False, False, False, False)
    assert not WorkflowRun.objects.filter(pk=child.id).exists()


def _child(parent_id: object, status: str, finished_days_ago: float | None) -> WorkflowRun:
    """A child run of ``parent_id`` in ``status``, finished ``finished_days_ago`` days ago."""
    child = WorkflowRun.objects.start("tests.prune", {}, parent=parent_id)
    finished_at = None if finished_days_ago is None else db_now_plus(-finished_days_ago * DAY)
    WorkflowRun.objects.filter(pk=child.id).update(status=status, finished_at=finished_at)
    return child


@pytest.mark.parametrize("grandchild_status", [RunStatus.RUNNING, RunStatus.COMPLETED])
def test_prune_keeps_every_run_above_a_run_that_is_not_old(grandchild_status: str) -> None:
    # The repair of a run that failed with its child, which failed with its own: resume the
    # grandchild, then the child, then the top-level run.
    top = _run(RunStatus.FAILED, 40)
    child = _child(top.id, RunStatus.FAILED, 40)
    _child(child.id, grandchild_status, None if grandchild_status == RunStatus.RUNNING else 1)
    other = _run(RunStatus.FAILED, 40)
    assert WorkflowRun.objects.prune(30 * DAY) == 1
    assert _left(other)[0] is False
    assert _left(top) == (True, True, True, True)
    assert WorkflowRun.objects.get(pk=child.id).parent_id == top.id


def test_prune_keeps_a_fork_while_the_child_its_copied_wait_reads_is_live() -> None:
    # A fork reads its original's child through a copied run.child wait, and is repaired
    # the same way: resume the child, then the fork.
    parent = _run(RunStatus.FAILED, 40)
    child = _child(parent.id, RunStatus.RUNNING, None)
    fork = _run(RunStatus.FAILED, 40)
    WorkflowRun.objects.filter(pk=fork.id).update(forked_from=parent.id)
    WorkflowWait.objects.create(run_id=fork.id, name="kid", kind=WaitKind.CHILD, child_id=child.id)
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    assert _left(parent)[0] and _left(fork)[0]


def _resume_before_the_batch(monkeypatch: pytest.MonkeyPatch, run_id: Any) -> None:
    """An operator resumes ``run_id`` (and it commits) after the prune chose its batch and
    before the batch's transaction: the window a long prune keeps open between choices."""
    original = RunOperations._prune_batch
    done: list[bool] = []

    def batch(self: Any, *args: Any) -> int:
        if not done:
            done.append(True)
            WorkflowRun.objects.resume(run_id)
        return original(self, *args)

    monkeypatch.setattr(RunOperations, "_prune_batch", batch)


def test_a_grandchild_resumed_while_a_prune_runs_keeps_the_top_level_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    top = _run(RunStatus.FAILED, 40)
    child = _child(top.id, RunStatus.FAILED, 40)
    grandchild = _child(child.id, RunStatus.FAILED, 40)
    _resume_before_the_batch(monkeypatch, grandchild.id)
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    assert WorkflowRun.objects.get(pk=grandchild.id).status == RunStatus.RUNNING
    assert _left(top)[0] and WorkflowRun.objects.get(pk=child.id).parent_id == top.id


def test_a_child_resumed_while_a_prune_runs_keeps_the_fork_reading_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = _run(RunStatus.FAILED, 40)
    child = _child(parent.id, RunStatus.FAILED, 40)
    fork = _run(RunStatus.FAILED, 40)
    WorkflowRun.objects.filter(pk=fork.id).update(forked_from=parent.id)
    WorkflowWait.objects.create(run_id=fork.id, name="kid", kind=WaitKind.CHILD, child_id=child.id)
    _resume_before_the_batch(monkeypatch, child.id)
    assert WorkflowRun.objects.prune(30 * DAY) == 0
    assert _left(parent)[0] and _left(fork)[0]
