"""What operators do to runs (:class:`RunOperations`, a layer of ``WorkflowRun.objects``):
resume, cancel (with the run's live descendants), retry a failed step or every one, find
runs by tag or key, apply an operation to many runs, prune finished runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, TypeVar

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.functions import Substr
from django.utils.translation import gettext

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowRunStateError
from django_leases.frozen import frozen
from django_leases.models.lease import Lease
from django_leases.models.passes import RunPasses
from django_leases.models.queue import WorkflowQueueKey
from django_leases.models.workflow_base import (
    lock_runs,
    refused_in_state,
    run_model,
    run_reached,
    step_model,
    tag_model,
    wait_model,
    wake_parent,
    wake_workers,
)
from django_leases.validation import (
    check_identifier,
    check_run_key,
    check_tags,
    parse_run_id,
    seconds,
)
from django_leases.workflows.values import (
    FINISHED_RUN_STATUSES,
    RUN_CANCELLED,
    STEP_FUNCTION_NOT_FOUND,
    RunChange,
    RunStatus,
    StepStatus,
    WaitStatus,
    exhausted_q,
    failed_for_good_q,
    run_lease_key,
    status_said,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRun


#: The operations :meth:`RunOperations.operate_each` applies to many runs.
BULK_OPERATIONS = ("resume", "cancel", "retry")


@frozen
class RunOutcome:
    """What an operation on many runs (:meth:`RunOperations.operate_each`) did to one.

    Attributes:
        run_id: the run's ``uuid.UUID``.
        change: the :class:`RunChange`, or ``None`` when the run refused the operation.
        refusal: why it refused (the error's message), or ``None``.
        with_run: for a cancel, the selected run whose cancel already cancelled this one (its
            parent, or an ancestor): not a refusal; ``None`` otherwise.
    """

    run_id: uuid.UUID
    change: RunChange | None
    refusal: str | None
    with_run: uuid.UUID | None = None

    @property
    def refused(self) -> bool:
        """Whether the run refused the operation (nothing changed, and not because an
        earlier run of the selection already took it along)."""
        return self.change is None and self.with_run is None

    def __str__(self) -> str:
        if self.change is not None:
            return str(self.change)
        if self.with_run is not None:
            return f"Run {self.run_id}: cancelled with run {self.with_run}"
        return f"Run {self.run_id}: nothing changed: {self.refusal}"


#: How many times :meth:`WorkflowRunQuerySet.cancel` starts over when a child appeared
#: between its scan for children and its lock on the parent.
_CANCEL_ROUNDS = 5


class _StartOver(Exception):
    """Internal: roll the cancel's transaction back and scan for children again."""


_T = TypeVar("_T")


def _reopen_missing_function_steps(alias: str, run_id: uuid.UUID) -> list[str]:
    """Make the run's steps suspended for a missing step function due again, each granted one
    extra attempt (the attempt that found no function never ran it). Returns their names."""
    steps = (
        step_model()
        ._default_manager.using(alias)
        .filter(run_id=run_id, status=StepStatus.FAILED, error__code=STEP_FUNCTION_NOT_FOUND)
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("retries") + 1, available_at=DbNow(), updated_at=DbNow())
    return names


#: A failed step a pass may have read: out of attempts, and not failed for a missing step
#: function (that failure suspends the run; no pass reads it). Negated, a step whose error
#: has no code counts as read (SQL's unknown): never retried in a live run.
_READ_FAILURE = exhausted_q() & ~Q(error__code=STEP_FUNCTION_NOT_FOUND)


def _grant_last_attempts(alias: str, where: Q) -> list[str]:
    """Give each failed step matching ``where`` that is out of attempts one more, due now.
    Returns their names."""
    steps = step_model()._default_manager.using(alias).filter(where, failed_for_good_q())
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("attempt"), available_at=DbNow(), updated_at=DbNow())
    return names


#: A parent in one of these is over for good: nothing will read a child's outcome again.
_FINAL_PARENT_STATUSES = (RunStatus.COMPLETED, RunStatus.CANCELLED)
#: A fork in one of these may replay its copied child waits at any moment.
_REPLAYING_STATUSES = (RunStatus.RUNNING, RunStatus.SUSPENDED)


def _require_reopenable(alias: str, run: WorkflowRun, verb: str) -> None:
    """:class:`WorkflowRunStateError` when setting ``run`` running again would strand a run
    that reads a child's outcome (a fork reads the child runs its original read, through
    copied ``run.child`` waits, and no end of such a child wakes it: only its parent):

    * ``run`` is a child whose parent is completed or cancelled: it would be an orphan
      nobody waits for, which no cancel of its parent reaches any more (a failed parent may
      be resumed, and read it again);
    * ``run`` is a child whose running or suspended parent read its outcome (a pass of the
      parent settled its wait) and went on from it: the parent's replays would meet another
      outcome than its history was made of (a failed parent is the operator's to repair:
      resume the child, then it — or fork it, if it went on from the child's failure);
    * ``run`` is a child a running or suspended fork of its parent read: the fork's replays
      would meet another outcome than its history was made of (a failed fork is like the
      failed parent: resume the child first, then it);
    * ``run`` is such a fork and a child it read is running again: it would wait for an end
      that never wakes it (resume it once that child finished).
    """
    runs = run_model()._default_manager.using(alias)
    waits = wait_model()._default_manager.using(alias)
    if run.parent_id is not None:
        status = runs.filter(pk=run.parent_id).values_list("status", flat=True).first()
        if status in _FINAL_PARENT_STATUSES:
            raise refused_in_state(
                run.pk,
                run.status,
                verb,
                gettext(
                    "its parent run %(parent)s is %(status)s; a child of a finished parent "
                    "cannot be"
                )
                % {"parent": run.parent_id, "status": status_said(status)},
            )
        read = waits.filter(run_id=run.parent_id, child_id=run.pk, status=WaitStatus.DONE)
        if status in _REPLAYING_STATUSES and read.exists():
            raise refused_in_state(
                run.pk,
                run.status,
                verb,
                gettext(
                    "its parent run %(parent)s is %(status)s and went on from its outcome "
                    "(run.child); cancel the parent first, or fork it from before run.child; a "
                    "child whose live parent read it cannot be"
                )
                % {"parent": run.parent_id, "status": status_said(status)},
            )
    # Its forks (any run's wait on it but its parent's; also once the parent was pruned).
    # The caller holds the run's lock, which a fork takes too before it reads the child.
    readers = waits.filter(child_id=run.pk, run__status__in=_REPLAYING_STATUSES)
    if run.parent_id is not None:
        readers = readers.exclude(run_id=run.parent_id)
    fork = readers.values_list("run_id", flat=True).first()
    if fork is not None:
        raise refused_in_state(
            run.pk,
            run.status,
            verb,
            gettext(
                "run %(fork)s, a fork of its parent, read its outcome as its own child and is "
                "not finished (cancel it first); a child a fork reads cannot be"
            )
            % {"fork": fork},
        )
    # The children it reads through copied waits, locked: a resume of one racing this one
    # waits for it and then finds this run reading it, or set it running first.
    copied = waits.filter(run_id=run.pk, child_id__isnull=False).exclude(child__parent_id=run.pk)
    children = lock_runs(alias, runs.filter(pk__in=copied.values("child_id")), "pk", "status")
    unfinished = next((pk for pk, status in children if status not in FINISHED_RUN_STATUSES), None)
    if unfinished is not None:
        raise refused_in_state(
            run.pk,
            run.status,
            verb,
            gettext(
                "it reads child run %(child)s (copied when it was forked), which runs again; "
                "until that child finished it cannot be"
            )
            % {"child": unfinished},
        )


def _reopen_run(alias: str, run_id: uuid.UUID) -> None:
    """Set the run ``running``, its error, output and end cleared, due for a pass now."""
    run_model()._default_manager.using(alias).filter(pk=run_id).update(
        status=RunStatus.RUNNING,
        error=None,
        output=None,
        finished_at=None,
        pass_due_at=DbNow(),
        pass_requests=F("pass_requests") + 1,
        branches_left=0,
        updated_at=DbNow(),
    )


class RunOperations(RunPasses):
    """Operators' operations on runs: resume, cancel, retry a step, prune."""

    def resume(self, run_id: uuid.UUID | str) -> RunChange:
        """Set a ``suspended`` or ``failed`` run running again, due for a pass at once.

        * **suspended** (a step function or the workflow was missing from the deployed
          code): every step suspended for a missing step function (code
          ``STEP_FUNCTION_NOT_FOUND``) becomes due again as a **new attempt**, and is granted
          one extra attempt (``retries + 1``), since the attempt that found no function never
          ran it;
        * **failed**: the run is replayed; every step that failed on its last attempt (a
          raised error, or a lost worker) gets one more attempt and is due at once. A run that
          failed because its workflow function raised is simply replayed (after a deploy that
          fixed it). ``error``, ``output`` and ``finished_at`` are cleared.

        Returns a :class:`RunChange`. Raises ``WorkflowRun.DoesNotExist`` for an unknown id,
        ``ValueError`` for something that is not a run id, and :class:`WorkflowRunStateError`
        for a run that is ``running``, ``completed`` or ``cancelled``, or one whose resume
        would strand a run that reads a child's outcome (:func:`_require_reopenable`: a child
        of a finished parent, a child a running fork read, a fork whose child runs again;
        nothing written).
        """
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            run.require("resume")
            _require_reopenable(alias, run, gettext("resumed"))
            steps = _reopen_missing_function_steps(alias, run.pk)
            if run.status == RunStatus.FAILED:
                steps += _grant_last_attempts(alias, Q(run_id=run.pk))
            _reopen_run(alias, run.pk)
            wake_workers(alias)
        return RunChange(run.pk, run.status, RunStatus.RUNNING, tuple(steps))

    def cancel(self, run_id: uuid.UUID | str, *, message: str | None = None) -> RunChange:
        """Stop a ``running`` or ``suspended`` run for good: status ``cancelled``.

        No further pass runs and no step of it is claimed again. A step **running** at that
        moment is stopped: the step and its attempt are marked ``failed`` with code
        ``RUN_CANCELLED``, so the worker's renewals return ``False`` (its
        ``ctx.lease_lost`` is set) and its result or error is refused with
        :class:`WorkflowStepCancelledError` — which the engine, as for any superseded
        write, logs and drops. A worker's write that committed just before the cancel stays
        recorded on its step (the work was done) but starts no pass. Waiting steps are taken
        out of the due-work index (``available_at`` cleared). Cancelled is final: such a run
        cannot be resumed.

        Its child runs (``run.child``) that are running or suspended are cancelled with it,
        and theirs, in the same transaction (each child locked before its parent, the order
        in which a finishing child wakes its parent). A cancelled child's parent is asked
        for a pass (``run.child`` then raises ``WorkflowChildFailedError`` there).

        ``message`` (``str``) says who cancelled it in the run's error (default: an
        operator). Returns a :class:`RunChange` (``steps``: the running steps stopped). Raises
        ``WorkflowRun.DoesNotExist`` / ``ValueError`` for an unknown or malformed id and
        :class:`WorkflowRunStateError` for a ``completed``, ``failed`` or ``cancelled`` run.
        """
        alias = self.write_alias()
        pk = parse_run_id(run_id)
        error = {
            "code": RUN_CANCELLED,
            "message": message or "The run was cancelled by an operator",
        }
        cascaded = {
            "code": RUN_CANCELLED,
            "message": f"The run was cancelled with its parent run {pk}",
        }

        def lock() -> WorkflowRun:
            run = self._lock_for_operator(alias, pk)
            run.require("cancel")
            return run

        def end(run: WorkflowRun, late: list[uuid.UUID]) -> RunChange:
            running = self._cancel_locked(alias, run, error)
            # The last round only: lock them after all.
            self._cancel_children(alias, late, cascaded)
            return RunChange(run.pk, run.status, RunStatus.CANCELLED, tuple(running))

        change = self._end_with_descendants(alias, pk, cascaded, _CANCEL_ROUNDS, lock, end)
        assert change is not None  # lock() raises rather than find nothing to do
        return change

    def _end_with_descendants(
        self,
        alias: str,
        pk: uuid.UUID,
        cascaded: dict[str, Any],
        rounds: int,
        lock: Callable[[], WorkflowRun | None],
        end: Callable[[WorkflowRun, list[uuid.UUID]], _T],
    ) -> _T | None:
        """End run ``pk`` with its running or suspended descendants, in one transaction of
        its own (a savepoint in the caller's): the descendants are cancelled with error
        ``cascaded`` (a JSON ``dict``), then ``lock()`` locks and checks the run (``None``:
        nothing to do; all is rolled back and ``None`` returned), then ``end(run, late)``
        ends it, cancelling ``late`` too (children started after the scan, on the last of
        ``rounds`` tries only), and its parent is woken. Returns what ``end`` returned.

        Children are locked before their parent (the order in which a finishing child wakes
        its parent). A child that a pass started after the scan is only seen once the parent
        is locked: locking it then would invert that order (a deadlock with the child
        finishing), so the transaction is rolled back and it starts over, now finding it
        first. No child can be started once the parent is locked (start_child locks it and
        needs it running), so this ends."""
        for turn in range(rounds):
            last = turn == rounds - 1
            try:
                with transaction.atomic(using=alias):
                    locked = self._live_descendants(alias, pk)  # deepest first
                    self._cancel_children(alias, locked, cascaded)
                    run = lock()
                    if run is None:
                        transaction.set_rollback(True, using=alias)
                        return None
                    late = [c for c in self._live_descendants(alias, pk) if c not in locked]
                    if late and not last:
                        raise _StartOver
                    ended = end(run, late)
                    wake_parent(alias, pk)
            except _StartOver:
                continue
            return ended
        raise AssertionError("unreachable: the last round never starts over")

    def _live_descendants(self, alias: str, run_id: uuid.UUID) -> list[uuid.UUID]:
        """The running or suspended runs below ``run_id`` (children, their children…),
        deepest first."""
        found: list[uuid.UUID] = []
        level = [run_id]
        live = (RunStatus.RUNNING, RunStatus.SUSPENDED)
        while level:
            level = list(
                self.rows()
                .filter(parent_id__in=level, status__in=live)
                .order_by("created_at", "id")
                .values_list("pk", flat=True)
            )
            found = level + found
        return found

    def _cancel_children(
        self, alias: str, children: list[uuid.UUID], error: dict[str, Any]
    ) -> None:
        """Lock each of ``children`` (in that order, inside the caller's transaction) and
        cancel those still running or suspended with ``error``."""
        for child_id in children:
            child = self._lock_for_operator(alias, child_id)
            if child.status in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                self._cancel_locked(alias, child, error)

    def _cancel_locked(self, alias: str, run: WorkflowRun, error: dict[str, Any]) -> list[str]:
        """Cancel the locked ``run`` (inside the caller's transaction); the names of the
        running steps it stopped."""
        running = self._end_locked(alias, run, RunStatus.CANCELLED, error)
        run_reached(alias, run.pk, RunStatus.CANCELLED)
        return running

    def _end_locked(
        self, alias: str, run: WorkflowRun, status: str, error: dict[str, Any], **columns: Any
    ) -> list[str]:
        """Finish the locked ``run`` with ``status`` and ``error`` (a JSON ``dict``), and
        ``columns`` set on it too, inside the caller's transaction: its running attempts
        failed with ``error`` through their fence, its waiting steps out of the due-work
        index. Returns the names of the running steps it stopped."""
        stepping = step_model().objects.db_manager(alias)
        steps = stepping.filter(run_id=run.pk)
        running = list(
            steps.filter(status=StepStatus.RUNNING)
            .order_by("id")
            .values_list("pk", "attempt", "step_name")
        )
        for step_id, attempt, _name in running:  # locked: the fence matches
            stepping.all()._fail_attempt_for_good(alias, step_id, attempt, error)
        steps.exclude(available_at=None).update(available_at=None, updated_at=DbNow())
        self.rows().filter(pk=run.pk).update(
            status=status,
            error=error,
            pass_due_at=None,
            **columns,
            finished_at=DbNow(),
            updated_at=DbNow(),
        )
        return [name for _, _, name in running]

    def retry_step(self, run_id: uuid.UUID | str, step_name: str) -> RunChange:
        """Run the ``failed`` step ``step_name`` again as a new attempt, due at once.

        A step that failed on its last attempt is granted one more. A ``failed`` or
        ``suspended`` run is set running again as by :meth:`resume` (the other steps of a
        suspended run that miss their step function are made due too, or the run could
        never finish); a ``running`` run just gets its step due now (ahead of its retry
        delay), which it must still have attempts for: one that failed for good in a running
        or suspended run may have been caught by a pass that went on from it, whose replays
        would meet another outcome.

        Returns a :class:`RunChange`. Raises ``WorkflowRun.DoesNotExist`` / ``ValueError``
        for an unknown or malformed run id, ``WorkflowStep.DoesNotExist`` for an unknown
        step, and :class:`WorkflowRunStateError` when the step is not ``failed`` (or, in a
        ``running`` or ``suspended`` run, failed for good), the run is ``completed`` or
        ``cancelled``, or setting it running again would strand a run that reads a child's
        outcome (:func:`_require_reopenable`; nothing written).
        """
        check_identifier(step_name, "Step name")
        alias = self.write_alias()
        stepping = step_model().objects.db_manager(alias)
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            named = stepping.filter(run_id=run.pk, step_name=step_name)
            step = named.values("status").first()
            if step is None:
                raise step_model().DoesNotExist(f"Run {run.pk} has no step named {step_name!r}")
            run.require("retry")
            if step["status"] != StepStatus.FAILED:
                raise refused_in_state(
                    run.pk,
                    run.status,
                    gettext("retried"),
                    gettext("step %(step)r is %(status)s; only a failed step can be")
                    % {"step": step_name, "status": status_said(step["status"])},
                )
            if run.status in _REPLAYING_STATUSES and not named.exclude(_READ_FAILURE).exists():
                raise refused_in_state(
                    run.pk,
                    run.status,
                    gettext("retried"),
                    gettext(
                        "step %(step)r failed on its last attempt, and a pass of the run may "
                        "have gone on from that failure (caught it): retry it once the run has "
                        "failed, or fork the run; a step failed for good in a live run cannot be"
                    )
                    % {"step": step_name},
                )
            others = self._retry_locked(alias, run, Q(step_name=step_name))
        steps = (step_name, *(name for name in others if name != step_name))
        return RunChange(run.pk, run.status, RunStatus.RUNNING, steps)

    def retry(self, run_id: uuid.UUID | str) -> RunChange:
        """Run **every** ``failed`` step of the run again as a new attempt, due at once: what
        :meth:`retry_step` does for one step, for each of them, in one transaction (the
        admin's "Retry the selected runs"). A step out of attempts is granted one more; a
        ``failed`` or ``suspended`` run is set running again. Of a ``running`` or ``suspended``
        run only the failed steps with attempts left are made due (one failed for good may
        have been caught by a pass that went on); of a ``failed`` run, every one (including
        one the workflow caught and went past: fork a run that compensated for such a
        failure instead, :meth:`fork_from_failed`).

        Returns a :class:`RunChange` (``steps``: the steps made due). Raises
        ``WorkflowRun.DoesNotExist`` / ``ValueError`` for an unknown or malformed id and
        :class:`WorkflowRunStateError` when the run is ``completed`` or ``cancelled`` or has
        no such failed step, or setting it running again would strand a run that reads a
        child's outcome (:func:`_require_reopenable`; nothing written).
        """
        alias = self.write_alias()
        stepping = step_model().objects.db_manager(alias)
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            run.require("retry")
            failed_steps = stepping.filter(run_id=run.pk, status=StepStatus.FAILED)
            if run.status in _REPLAYING_STATUSES:
                failed_steps = failed_steps.exclude(_READ_FAILURE)
            failed = list(failed_steps.order_by("id").values_list("step_name", flat=True))
            if not failed:
                raise refused_in_state(
                    run.pk,
                    run.status,
                    gettext("retried"),
                    gettext(
                        "a run with no failed step (a live one: none with attempts left) cannot be"
                    ),
                )
            others = self._retry_locked(alias, run, Q())
        steps = (*failed, *(name for name in others if name not in failed))
        return RunChange(run.pk, run.status, RunStatus.RUNNING, steps)

    def _retry_locked(self, alias: str, run: WorkflowRun, which: Q) -> list[str]:
        """Make the locked run's failed steps matching ``which`` due now as new attempts
        (granted one more when out of them, their count of give-backs started again) and set
        a suspended or failed run running (inside the caller's transaction); the names of the
        other steps made due."""
        stepping = step_model().objects.db_manager(alias)
        if run.status in _REPLAYING_STATUSES:
            # A step failed for good there may have been read by a pass that went on from it
            # (caught it): only steps with attempts left are made due.
            which &= ~_READ_FAILURE
        if run.status != RunStatus.RUNNING:
            _require_reopenable(alias, run, gettext("retried"))
        others: list[str] = []
        if run.status == RunStatus.SUSPENDED:
            others = _reopen_missing_function_steps(alias, run.pk)
        _grant_last_attempts(alias, Q(which, run_id=run.pk))
        stepping.filter(which, run_id=run.pk, status=StepStatus.FAILED).update(
            available_at=DbNow(), given_back=0, updated_at=DbNow()
        )
        if run.status != RunStatus.RUNNING:
            _reopen_run(alias, run.pk)
        wake_workers(alias)
        return others

    # -- finding runs, and operating on many ---------------------------------------------------

    def tagged(self, tags: Mapping[str, str] | None = None, /, **named: str) -> Self:
        """The runs carrying every one of ``tags`` (a ``dict[str, str]``) and ``named``
        (``name=value``): all must match; none: every run. A tag whose name is not a
        Python keyword argument's (``self``, ``env-name``) goes in ``tags``. Served on every
        backend by the index of ``WorkflowRunTag`` (one ``IN (SELECT run_id …)`` per tag).
        Raises ``ValueError`` for a name or value ``start_workflow(..., tags=)`` would
        refuse."""
        checked = check_tags({**(tags or {}), **named}) or {}
        found = self
        tag_rows = tag_model().objects.db_manager(self.db)
        for name, value in checked.items():
            found = found.filter(pk__in=tag_rows.runs_with(name, value))
        return found

    def key_starts_with(self, text: str) -> Self:
        """The runs whose ``key`` is ``text`` or starts with it (case-sensitive), served by
        the ``dl_run_key`` index; ``ValueError`` for a text no key could be."""
        check_run_key(text)
        found = self.filter(key__startswith=text)
        if connections[self.db].vendor == "sqlite":
            # SQLite's LIKE ignores the case of ASCII letters: the head is compared as well.
            found = found.alias(key_head=Substr("key", 1, len(text))).filter(key_head=text)
        return found

    def operate_each(self, operation: str) -> list[RunOutcome]:
        """Apply ``operation`` — ``"resume"`` (:meth:`resume`), ``"cancel"``
        (:meth:`cancel`) or ``"retry"`` (:meth:`retry`) — to every run this QuerySet
        selects, oldest first, **each in a transaction of its own**: a run whose state
        refuses it is reported and the others go on. A child run that the cancel of a
        selected ancestor already cancelled is reported as such (``with_run``), not as a
        refusal. The selection is read once, before the first operation.

        Returns one :class:`RunOutcome` per selected run. Raises ``ValueError`` for another
        ``operation`` (nothing written).
        """
        if operation not in BULK_OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(BULK_OPERATIONS)}")
        ids = list(self.order_by("created_at", "id").values_list("pk", flat=True))
        runs = run_model().objects.db_manager(self.write_alias())
        method: Callable[[uuid.UUID], RunChange] = getattr(runs, operation)
        outcomes = []
        changed: set[uuid.UUID] = set()
        for run_id in ids:
            try:
                outcomes.append(RunOutcome(run_id, method(run_id), None))
                changed.add(run_id)
            except (WorkflowRunStateError, run_model().DoesNotExist) as exc:
                along = self._cancelled_along(run_id, changed) if operation == "cancel" else None
                outcomes.append(RunOutcome(run_id, None, str(exc), with_run=along))
        return outcomes

    def _cancelled_along(self, run_id: uuid.UUID, cancelled: set[uuid.UUID]) -> uuid.UUID | None:
        """The run of ``cancelled`` whose cancel took cancelled run ``run_id`` along (its
        nearest such ancestor), or ``None``."""
        runs = self.rows()
        row = runs.filter(pk=run_id).values_list("status", "parent_id").first()
        if row is None or row[0] != RunStatus.CANCELLED:
            return None
        parent: uuid.UUID | None = row[1]
        for _ in range(100):  # a bound on depth; run trees are shallow
            if parent is None:
                return None
            if parent in cancelled:
                return parent
            parent = runs.filter(pk=parent).values_list("parent_id", flat=True).first()
        return None

    def prune(self, older_than: float | timedelta, *, batch_size: int = 500) -> int:
        """Delete finished runs (``completed``, ``failed``, ``cancelled``) that finished
        ``older_than`` (seconds ≥ 0, or a ``timedelta``) or more before database now, with
        their steps, attempts and run leases (``workflow-run:<id>``). Returns how many runs.

        Retention, for an operator (``manage.py workflow_runs prune``): a run's lease keeps
        its row once released, so without pruning the lease table grows by one row per run.
        Running and suspended runs are never touched, nor a run whose lease is live (a
        worker still finishing with it; a later prune takes it), nor a child run
        (``run.child``) while its parent, or a fork that copied the parent's wait on it, is
        kept, whatever their status: they read its outcome when they replay, and a finished
        run may still be forked; it goes with or after every run that reads it (in the same
        call, a batch later). Nor a run that reads, at any depth (as its parent, or through
        a fork's copied wait), a run still running or suspended or that finished less than
        ``older_than`` ago: an operator repairing a failed parent resumes the child first,
        then the parent once the child completed. Webhook deliveries that
        started a pruned run stay, their ``run`` emptied, so a redelivery is still known.
        Works in transactions of ``batch_size`` runs (int ≥ 1): a failure keeps every batch
        before it done and leaves its own batch whole. Then the rows of queue keys left
        idle go (:meth:`WorkflowQueueKeyQuerySet.prune_idle`: nothing running or waiting, an
        empty rate window). Raises ``ValueError`` for a bad ``older_than`` or
        ``batch_size``.
        """
        cutoff = seconds(older_than, "older_than")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int ≥ 1, not {batch_size!r}")
        alias = self.write_alias()
        runs = self.rows()
        old = Q(status__in=FINISHED_RUN_STATUSES, finished_at__lte=clock.db_now_plus(-cutoff))
        finished = runs.filter(old).exclude(parent_id__isnull=False)
        read_as_child = wait_model()._default_manager.using(alias).filter(child_id=OuterRef("pk"))
        deleted = 0
        skipped: set[uuid.UUID] = set()
        while True:
            # Sweeps in creation order (run ids are time-ordered), each batch after the last
            # one's greatest id: the primary key's index is walked from there, never over
            # the rows already deleted nor sorting every candidate per batch. A run freed by
            # a batch (its parent deleted) that lies behind it waits for the next sweep; a
            # sweep that deletes nothing is the last.
            swept = 0
            after: uuid.UUID | None = None
            while True:
                # A run another run reads as its child goes with or after every such run:
                # its parent (``run.child``; above) and any fork that copied that wait
                # (whatever their status: a finished run may still be forked, and a fork
                # reads the same child). NOT EXISTS, not a join: the locking read locks run
                # rows only; bounded below by ``after`` as the runs are, so an anti-join
                # walking the waits' child index starts where the batch does. Serialised
                # with a fork by the locks on the children and the run it copies from.
                readers = (
                    read_as_child if after is None else read_as_child.filter(child_id__gt=after)
                )
                candidates = (
                    finished.exclude(pk__in=skipped).exclude(Exists(readers)).order_by("pk")
                )
                if after is not None:
                    candidates = candidates.filter(pk__gt=after)
                chosen = list(candidates.values_list("pk", flat=True)[:batch_size])
                if not chosen:
                    break
                after = chosen[-1]
                swept += self._prune_batch(alias, candidates, chosen, skipped, old)
            deleted += swept
            if not swept:
                break
        WorkflowQueueKey.objects.using(alias).prune_idle(batch_size=batch_size)
        return deleted

    def _reading_recent(self, alias: str, old: Q, roots: list[uuid.UUID]) -> set[uuid.UUID]:
        """Those of ``roots`` that read, at any depth, a run that is not ``old`` (running,
        suspended, or finished too recently): as its parent (``parent_id``) or through a
        ``run.child`` wait (a fork's copied one). Their repair resumes that run first, then
        each run above it, so they stay.

        Walked down from ``roots``, three statements a level (run trees are shallow), in the
        caller's transaction: a run resumed before it began is seen."""
        runs = self.rows()
        waits = wait_model()._default_manager.using(alias)
        # Which roots read each run met (a run may be read by several: a parent and forks).
        roots_of: dict[uuid.UUID, set[uuid.UUID]] = {pk: {pk} for pk in roots}
        reading: set[uuid.UUID] = set()
        level = list(roots)
        for _ in range(100):  # a bound on depth; run trees are shallow
            met: dict[uuid.UUID, set[uuid.UUID]] = {}
            for run_id, above in (
                *runs.filter(parent_id__in=level).values_list("pk", "parent_id"),
                *waits.filter(run_id__in=level, child_id__isnull=False).values_list(
                    "child_id", "run_id"
                ),
            ):
                met.setdefault(run_id, set()).update(roots_of[above])
            recent = set(runs.filter(pk__in=list(met)).exclude(old).values_list("pk", flat=True))
            level = []
            for run_id, readers in met.items():
                if run_id in recent:
                    reading |= readers
                elif not readers <= roots_of.setdefault(run_id, set()):
                    roots_of[run_id] |= readers  # new readers: walk on below it for them
                    level.append(run_id)
            if not level:
                break
        return reading

    def _prune_batch(
        self,
        alias: str,
        candidates: QuerySet[WorkflowRun],
        chosen: list[uuid.UUID],
        skipped: set[uuid.UUID],
        old: Q,
    ) -> int:
        """Delete the ``chosen`` runs that are still ``candidates``, whose lease is not live
        and that read no run that is not ``old`` (:meth:`_reading_recent`; those go into
        ``skipped``), with their leases, in one transaction; how many."""
        runs = self.rows()
        leases = Lease.objects.db_manager(alias)
        with transaction.atomic(using=alias):
            # Children before their parents, as a cancel and a fork lock them: deleting a
            # run empties its children's parent and its forks' origin (rows a fork or an
            # operator may hold), so those are locked first, then the batch, still as it
            # was chosen (another prune may have taken some meanwhile).
            bound = runs.filter(Q(parent_id__in=chosen) | Q(forked_from_id__in=chosen))
            lock_runs(alias, bound)
            ids = list(
                db.for_update(candidates.filter(pk__in=chosen), alias).values_list("pk", flat=True)
            )
            reading = self._reading_recent(alias, old, ids)
            skipped |= reading
            ids = [run_id for run_id in ids if run_id not in reading]
            keys = {run_lease_key(run_id): run_id for run_id in ids}
            live = set(
                leases.filter(
                    key__in=keys, released_at__isnull=True, expires_at__gt=DbNow()
                ).values_list("key", flat=True)
            )
            skipped.update(keys[key] for key in live)
            gone = [run_id for key, run_id in keys.items() if key not in live]
            leases.filter(key__in=[run_lease_key(run_id) for run_id in gone]).delete()
            runs.filter(pk__in=gone).delete()
        return len(gone)

    def _lock_for_operator(self, alias: str, run_id: uuid.UUID | str) -> WorkflowRun:
        """Lock the run's steps, then the run (inside the caller's transaction); the run."""
        pk = parse_run_id(run_id)
        steps = step_model()._default_manager.using(alias).filter(run_id=pk)
        list(db.for_update(steps, alias).order_by("id").values_list("pk", flat=True))
        run = db.for_update(self.rows().filter(pk=pk), alias).first()
        if run is None:
            raise run_model().DoesNotExist(f"No workflow run with id {pk}")
        return run
