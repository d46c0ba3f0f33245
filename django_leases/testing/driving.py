"""Drive workflow runs to the end inside your own tests: :func:`drive`.

A worker (``run_workflow_worker``, :class:`~django_leases.workflows.worker.Worker`) runs its
passes and steps on threads with connections of their own, which cannot see the rows of a
test's transaction — Django's ``TestCase`` wraps each test in one — so it refuses to start
there. :func:`drive` does the same work **on the calling thread and its connection**: every
due pass and step, one after another, until nothing is due. Leases (the run lease of each
pass, each step's lease) are taken in the test's transaction like any other row, and rolled
back with it. It works the same in a ``TransactionTestCase``. ::

    from django.test import TestCase

    from django_leases.testing import drive
    from django_leases.workflows import send_event, start_workflow


    class RefundTests(TestCase):
        def test_an_approved_refund_is_paid_back(self):
            run_id = start_workflow("refund", {"order": 17})
            run = drive(run_id)                       # runs until the run waits for approval
            self.assertEqual(run.status, "running")
            send_event(run_id, "approval", {"approved": True})
            run = drive(run_id)
            self.assertEqual(run.output, {"refunded": True})

Sleeps (``run.sleep``) and retry delays are jumped forward by default (``skip_sleeps``): the
test does not wait for them. So is the window of a queue's ``rate``
(``DJANGO_LEASES["QUEUES"]``): when the only due steps left wait for their queue's rate, the
queue's recorded starts are moved one window back, as if the window had passed, and the
drive goes on — a test of a workflow whose steps are rate-limited to ``"1/m"`` finishes at
once. With ``skip_sleeps=False`` the drive stops there instead, as at a sleep, leaving those
steps waiting (``display.queue_overview()`` counts them): that is how a test sees the
rate hold steps back. Delayed starts (``run_after``) and debounce windows are jumped too. An
event's timeout is not jumped: send the event, or call :func:`time_out` to make it pass now;
nor is a run's deadline: a run past it on the database clock is failed before
any other work is done, so move its ``deadline_at`` into the past to test it.

``duplicate_steps=True`` checks that the steps are idempotent: every step function runs
twice, as when an attempt is superseded after its writes and the next one runs it again, and
the drive raises :class:`~django_leases.exceptions.StepNotIdempotentError` naming each step
whose second run changed the database (:mod:`django_leases.testing.duplicates`)::

    def test_the_refund_steps_are_idempotent(self):
        drive(start_workflow("refund", {"order": 17}), duplicate_steps=True)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from django.db import router
from django.db.models import F

from django_leases.clock import DbNow
from django_leases.conf import queue_limits
from django_leases.exceptions import MisuseError, StepNotIdempotentError
from django_leases.leases import new_holder
from django_leases.models.queue import WorkflowQueue, WorkflowQueueKey
from django_leases.models.wait import WorkflowWait
from django_leases.models.workflow import WorkflowRun, WorkflowStep
from django_leases.testing.duplicates import duplicated_steps
from django_leases.workflows.display import queue_overview
from django_leases.workflows.driver import RunDriver, run_lease_ttl
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import (
    RunStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
    attempts_left_q,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRun

#: The step lease :func:`drive` claims steps under, seconds: long enough that no renewal
#: thread (which would use a connection of its own) starts during a test's step.
STEP_LEASE = 600.0

#: How many passes and steps one :func:`drive` runs at most before it gives up.
MAX_UNITS = 100_000
#: Passes in a row that leave more of a run's recorded steps unmet before :func:`drive`
#: calls the workflow not deterministic.
UNREPLAYED_PASSES = 3


def drive(
    run_id: uuid.UUID | str | None = None,
    *,
    until: Callable[[], bool] | None = None,
    skip_sleeps: bool = True,
    using: str | None = None,
    max_units: int = MAX_UNITS,
    duplicate_steps: bool = False,
) -> WorkflowRun | None:
    """Run every due orchestration pass and step on the calling thread until nothing is due.

    Args:
        run_id: a run to report on (``uuid.UUID`` or its text): the drive also stops once
            that run is no longer running, and returns it. ``None``: drive every run.
        until: a callable checked before each pass or step; the drive stops as soon as it
            returns true.
        skip_sleeps: jump ``run.sleep`` waits, steps' retry delays, delayed starts
            (``run_after``), debounce windows (``debounce``) and the rate windows of
            queues (``DJANGO_LEASES["QUEUES"][name]["rate"]``, and each key's ``key_rate``) that
            hold back a due step
            forward to database now when nothing else is due (a sleep's or a delay's
            recorded end is moved; a queue's recorded starts are moved one window back),
            instead of stopping. Event timeouts and run deadlines are never jumped: a run
            whose deadline has passed on the database clock is failed
            (``WorkflowDeadlineExceeded``) before any other work.
        using: database alias (default: the router's choice for ``WorkflowRun``).
        max_units: passes and steps run at most (int ≥ 1).
        duplicate_steps: run every step function twice, the first run's result discarded
            (a transactional step's first run rolled back), and raise
            :class:`StepNotIdempotentError` at the end when any second run changed the
            database (compared row by row over the project's tables, django-leases' own
            aside). Not with workers running in the same process meanwhile.

    Returns the run ``run_id`` as it now is (a fresh ``WorkflowRun``), or ``None`` without
    one. Works inside ``transaction.atomic()`` (a ``TestCase``) on every database.

    Raises:
        WorkflowRun.DoesNotExist: no run ``run_id``.
        MisuseError: ``max_units`` passes and steps ran and work was still due (a workflow
            that never settles); or a run's passes left more of its recorded steps unmet
            each time, :data:`UNREPLAYED_PASSES` passes in a row (a workflow that is not
            deterministic — a step named from the clock, say — meets a new step on every
            replay and would run until ``max_units``).
        StepNotIdempotentError: with ``duplicate_steps``, steps whose second run changed
            the database (the drive itself finished).
        QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable (as for a worker).
    """
    if isinstance(max_units, bool) or not isinstance(max_units, int) or max_units < 1:
        raise ValueError(f"max_units must be an int ≥ 1, not {max_units!r}")
    alias = using or router.db_for_write(WorkflowRun)
    if duplicate_steps:
        with duplicated_steps(alias) as found:
            run = drive(
                run_id, until=until, skip_sleeps=skip_sleeps, using=alias, max_units=max_units
            )
        if found:
            raise StepNotIdempotentError(list(found))
        return run
    runs = WorkflowRun.objects.db_manager(alias)
    steps = WorkflowStep.objects.db_manager(alias)
    if run_id is not None:
        runs.get(pk=run_id)  # DoesNotExist for an unknown run, before any work

    def finished() -> bool:
        if until is not None and until():
            return True
        return run_id is not None and not runs.filter(pk=run_id, status=RunStatus.RUNNING).exists()

    units = 0
    unmet: dict[str, tuple[frozenset[str], int]] = {}
    while not finished():
        if units >= max_units:
            raise MisuseError(f"drive(): {max_units} passes and steps ran and work is still due")
        if runs.expire_deadlines():  # a deadline passed on the database clock: never jumped
            units += 1
            continue
        claim = steps.claim_due(STEP_LEASE)
        if claim is not None:
            execute_step(claim)
            units += 1
            continue
        picked = runs.claim_due_pass(run_lease_ttl(), lease_holder=new_holder())
        if picked is not None:
            driver = RunDriver(picked.run_id, using=alias, picked=picked)
            driver.drive()
            _check_replayed(str(picked.run_id), driver.unmet_steps(), unmet)
            units += 1
            continue
        if skip_sleeps and _jump_forward(alias):
            continue
        break
    return None if run_id is None else runs.get(pk=run_id)


def _check_replayed(
    run_id: str, now: frozenset[str], unmet: dict[str, tuple[frozenset[str], int]]
) -> None:
    """Note the steps run ``run_id`` recorded that its last pass did not meet (``now``);
    raise :class:`MisuseError` once more of them were left unmet after each of
    :data:`UNREPLAYED_PASSES` passes in a row. A step removed from the code (a deploy a
    test simulates) stays unmet, the same set every pass: that is allowed."""
    before, growing = unmet.get(run_id, (frozenset(), 0))
    growing = growing + 1 if now > before else 0
    unmet[run_id] = (now, growing)
    if growing >= UNREPLAYED_PASSES:
        names = ", ".join(repr(name) for name in sorted(now)[:5])
        raise MisuseError(
            f"drive(): run {run_id} does not replay: {growing} passes in a row met new steps "
            f"and left recorded ones unmet ({names}{', …' if len(now) > 5 else ''}). Workflow "
            "code must make the same calls on every replay: no step or wait names from the "
            "clock, random numbers or reads outside a step"
        )


def _jump_forward(alias: str) -> bool:
    """Make every waiting sleep of a running run, every step waiting out a retry delay, and
    every delayed or debounced start's first pass due now on the database clock (their
    runs due for a pass). ``True`` if any was."""
    sleeps = WorkflowWait.objects.db_manager(alias).filter(
        kind=WaitKind.SLEEP,
        status=WaitStatus.WAITING,
        due_at__gt=DbNow(),
        run__status=RunStatus.RUNNING,
    )
    sleeping = list(sleeps.values_list("run_id", flat=True))
    jumped = sleeps.update(due_at=DbNow())
    if sleeping:
        WorkflowRun.objects.db_manager(alias).filter(pk__in=sleeping).update(
            pass_due_at=DbNow(), pass_requests=F("pass_requests") + 1
        )
    jumped += (
        WorkflowStep.objects.db_manager(alias)
        .filter(
            attempts_left_q(),
            status=StepStatus.FAILED,
            available_at__gt=DbNow(),
            run__status=RunStatus.RUNNING,
        )
        .update(available_at=DbNow())
    )
    # Delayed starts (run_after) and debounce windows whose first pass is not due yet.
    jumped += WorkflowRun.objects.db_manager(alias).start_pending_now()
    return bool(jumped) | _jump_rate_windows(alias) | _jump_key_rate_windows(alias)


def _jump_rate_windows(alias: str) -> bool:
    """Move the recorded starts of each rate-limited queue that holds back a due step one
    window back (on the database clock they then lie outside the window the claim reads), so
    its next claim is admitted. ``True`` if any queue was.

    Raises:
        QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
    """
    # The rate alone: a queue at its concurrency limit has steps running, nothing to jump.
    rated = {
        name: replace(limits, concurrency=None)
        for name, limits in queue_limits().items()
        if limits.rate is not None
    }
    if not rated:
        return False
    queues = WorkflowQueue.objects.db_manager(alias)
    waiting = {row.name for row in queue_overview(alias) if row.waiting and row.name in rated}
    held = queues.rate_used_up(alias, {name: rated[name] for name in waiting})
    for name in sorted(held):
        row = queues.get(name=name)
        window = rated[name].rate_window
        queues.filter(pk=row.pk).update(starts=[float(t) - window for t in row.starts or []])
    return bool(held)


def _jump_key_rate_windows(alias: str) -> bool:
    """As :func:`_jump_rate_windows`, for the keys of queues with a ``key_rate``: each key
    whose rate for the current window is used up, in a queue with due steps waiting, has its
    recorded starts moved one window back. ``True`` if any key was."""
    rated = {name: limits for name, limits in queue_limits().items() if limits.key_rate}
    if not rated:
        return False
    waiting = [row.name for row in queue_overview(alias) if row.waiting and row.name in rated]
    keys = WorkflowQueueKey.objects.using(alias)
    held = keys.rate_used_up({name: rated[name] for name in waiting})
    for row in held:
        window = rated[row.queue].key_rate_window
        keys.filter(pk=row.pk).update(starts=[float(t) - window for t in row.starts or []])
    return bool(held)


def time_out(run_id: uuid.UUID | str, name: str, *, using: str | None = None) -> WorkflowWait:
    """Make the timeout of run ``run_id``'s wait ``name`` pass now, on the database clock.

    For a test of what a workflow does when ``run.wait_for_event(name, timeout=...)`` gets
    no event: the wait's timeout is moved to database now and the run asked for a pass; the
    next :func:`drive` raises ``WorkflowEventTimeout`` at the wait, as a worker would once
    the timeout passed. A ``run.sleep`` is ended the same way. Works inside a ``TestCase``.

    Args:
        run_id: the run (``uuid.UUID`` or its text); it must have reached the wait.
        name: the wait's name, as given to ``run.wait_for_event`` (or ``run.sleep``).
        using: database alias (default: the router's choice for ``WorkflowWait``).

    Returns the ``WorkflowWait`` row as it now is (still ``waiting``: the pass decides it).

    Raises (nothing written):
        ValueError: a bad run id or name; the run has not reached that wait; it waits for a
            child run, or for an event without a timeout; or it is no longer waiting (its
            event was sent, or its outcome is decided, or the run has finished:
            ``WorkflowRunStateError``, a ``ValueError``).
    """
    alias = using or router.db_for_write(WorkflowWait)
    return WorkflowWait.objects.db_manager(alias).make_due(run_id, name)


__all__ = ["MAX_UNITS", "STEP_LEASE", "drive", "time_out"]
