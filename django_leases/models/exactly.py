"""A step result written inside the step's own transaction (:class:`StepTransactions`, the
top layer of ``WorkflowStep.objects``): what a ``@step_function(..., transactional=True)``
needs so that its database writes and its result commit together, or not at all.

The result goes through the same fenced write as any step's
(:meth:`~django_leases.models.results.StepResults.set_result`, or, carried by the pass that
ran the step, the write of the workflow's next action:
:mod:`django_leases.workflows.transactional`);
this layer adds only what a transaction that ran user code needs first: the step row locked
through the fence (so no takeover or timeout can interleave before the commit) and the
attempt's ``timeout`` judged on the database clock (an attempt past it must not commit).
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models, transaction
from django.db.models import BooleanField, Case, F, Value, When

from django_leases import db
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowStepSupersededError, WorkflowStepTimedOutError
from django_leases.models.patches import StepPatches
from django_leases.models.workflow_base import fence_q, wake_workers
from django_leases.validation import check_attempt
from django_leases.workflows.values import (
    STEP_TRANSACTION_CUT_SHORT,
    AttemptStatus,
    StepStatus,
    StepWrite,
)

#: Attempts of one step that :meth:`StepTransactions.give_back` gives back without counting
#: them against the step's ``retries`` (``WorkflowStep.given_back``, set to 0 again by an
#: operator's retry); from the next one on, a cut-short attempt is recorded as any failed
#: attempt is (:meth:`~django_leases.models.outcomes.StepOutcomes.set_error`: the retry
#: delay, and the run's pass once no attempt is left), so a library error that recurs on
#: every attempt ends in the step's failure rather than in attempts for ever.
MAX_GIVE_BACKS = 10


class StepTransactions(StepPatches):
    """Results written in the transaction of the step function that produced them."""

    def attempt_running(
        self, step_id: int, attempt: int, floor: int | None = None
    ) -> models.QuerySet[Any]:
        """The step's row while ``attempt`` is its running attempt (the fence rule,
        :func:`~django_leases.models.workflow_base.fence_q`) **under the claim that ran it**,
        else no row: for ``Exists()`` in a write of the application's own rows
        (:mod:`django_leases.fencing`) and for :meth:`lock_for_result`.

        ``floor``: the epoch floor of the claim (``Claim.fence_floor``), which each claim
        stores on the step row (``fence_floor``). After an asynchronous promotion lost a
        claim, the promoted server hands the same attempt out again under a higher floor;
        the first claim's worker, still running, then matches no row, however its writes
        reach the new primary. ``None``: the attempt alone decides (a caller that does not
        know the claim's floor)."""
        rows = self.rows().filter(fence_q(step_id, attempt))
        return rows if floor is None else rows.filter(fence_floor=floor)

    def lock_for_result(self, step_id: int, attempt: int, *, floor: int | None = None) -> None:
        """Inside the caller's open transaction, the one a transactional step function's
        writes were made in: lock the step's row through the fence (so no takeover, cancel
        or timeout can interleave before the commit) and judge the attempt's ``timeout`` on
        the database clock. What the caller writes next with the attempt's result commits
        with them; on any exception it must roll back, so that nothing of the attempt lands.

        Args:
            step_id: the step (``int``).
            attempt: the attempt that ran (``int`` ≥ 1), the fence.
            floor: the epoch floor of the attempt's claim (``int``; ``None``: not compared),
                see :meth:`attempt_running`.

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt
                under the claim that ran it (superseded, cancelled, claimed again after a
                promotion lost that claim, or already failed for its timeout): roll back.
            WorkflowStepTimedOutError: the attempt ran past its ``timeout``: roll back.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` is not an int ≥ 1, or no transaction is open on the
                step's database (nothing written).
        """
        check_attempt(attempt)
        alias = self.write_alias()
        if db.outside_transactions(connections[alias]):
            raise ValueError(f"lock_for_result() needs an open transaction on database {alias!r}")
        past = Case(
            When(deadline_at__lte=DbNow(), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        row = (
            db.for_update(self.attempt_running(step_id, attempt, floor), alias)
            .annotate(past_deadline=past)
            .values_list("past_deadline", "timeout")
            .first()
        )
        if row is None:
            self._refuse(alias, step_id, attempt)
        elif row[0]:
            raise WorkflowStepTimedOutError(step_id, attempt, row[1])

    def record_in_transaction(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        hold_pass_seconds: float | None = None,
        floor: int | None = None,
    ) -> StepWrite:
        """Record ``result`` (JSON) for ``attempt`` of the step inside the caller's open
        transaction, the one its step function's writes were made in: the step row locked
        and the timeout judged (:meth:`lock_for_result`), then the result written as
        :meth:`set_result` writes it (``hold_pass_seconds``: as there). The caller commits;
        on any exception it must roll back, so that nothing of the attempt lands.

        Args:
            step_id: the step (``int``).
            result: its JSON result (checked by the caller: a result that is not JSON is
                written by :meth:`set_result` as the attempt's failure).
            attempt: the attempt that ran (``int`` ≥ 1), the fence.
            hold_pass_seconds: seconds the run's pass is taken for the caller, or ``None``.
            floor: the epoch floor of the attempt's claim, as for :meth:`lock_for_result`.

        Returns:
            The :class:`~django_leases.workflows.values.StepWrite` of :meth:`set_result`.

        Raises:
            WorkflowStepSupersededError: as :meth:`lock_for_result` (roll back).
            WorkflowStepTimedOutError: as :meth:`lock_for_result` (roll back).
            WorkflowStep.DoesNotExist: no such step.
            ValueError: a bad ``attempt``, or no transaction open (nothing written).
        """
        self.lock_for_result(step_id, attempt, floor=floor)
        return self.set_result(step_id, result, attempt, hold_pass_seconds=hold_pass_seconds)

    def give_back(self, step_id: int, attempt: int, why: str) -> bool:
        """Give back ``attempt`` of a transactional step whose transaction a database error of
        the library's own cut short, rolled back (nothing of it landed): the attempt is
        recorded failed with code ``STEP_TRANSACTION_CUT_SHORT`` and message ``why``, and the
        step is due again at once **without it counting against** ``retries`` (the step's
        ``retries`` grows by one): a transient error of the library's never fails a run, and
        the next execution is a new attempt (``attempt + 1``, fenced as any). A step given
        back :data:`MAX_GIVE_BACKS` times since an operator last retried it is not given
        more: its attempt is recorded failed as :meth:`set_error` records one (an error that
        recurs on every attempt is not transient). Fenced, one transaction; wakes waiting
        workers.

        Args:
            step_id: the step (``int``).
            attempt: the attempt that was cut short (``int`` ≥ 1), the fence.
            why: the message recorded (``str``).

        Returns:
            ``True`` when given back; ``False`` when ``attempt`` is not the step's running
            attempt (superseded, finished — its commit did land — or no such step).

        Raises:
            ValueError: ``attempt`` is not an int ≥ 1.
        """
        check_attempt(attempt)
        alias = self.write_alias()
        error = {"code": STEP_TRANSACTION_CUT_SHORT, "message": why}
        step = {
            "status": StepStatus.FAILED,
            "error": error,
            "result": None,
            "lease_expires_at": None,
            "deadline_at": None,
            "available_at": DbNow(),
            "retries": F("retries") + 1,
            "given_back": F("given_back") + 1,
        }
        history = {"status": AttemptStatus.FAILED, "error": error}
        given = self.rows().filter(pk=step_id).values_list("given_back", flat=True).first()
        try:
            if given is not None and given >= MAX_GIVE_BACKS:
                self.set_error(step_id, error, attempt)
                return True
            with transaction.atomic(using=alias):
                self._record_outcome(alias, step_id, attempt, step=step, history=history)
        except (WorkflowStepSupersededError, self.model.DoesNotExist):
            return False
        wake_workers(alias)
        return True


__all__ = ["StepTransactions"]
