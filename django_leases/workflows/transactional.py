"""Transactional steps: a ``@step_function(..., transactional=True)`` runs inside one
transaction on its run's database, and its result is recorded **in that same transaction**,
fenced to its attempt (DESIGN §5c, "Exactly once").

::

    @step_function("shop.reserve", transactional=True)
    def reserve(data, ctx):
        item = Item.objects.select_for_update().get(pk=data["item"])
        item.stock -= 1
        item.save()
        Reservation.objects.create(order=data["order"], item=item)
        return {"reserved": item.pk}

What a transactional attempt writes to the run's database lands exactly when its result does:

* it **returns**: the step row is locked through the attempt fence, the attempt's ``timeout``
  checked on the database clock, the result written (:meth:`~django_leases.models.exactly.
  StepTransactions.record_in_transaction`), then everything commits together;
* it **raises**: the transaction rolls back, and the failure is recorded as any step's
  (retried if attempts remain) — nothing the attempt wrote is kept;
* it was **superseded** meanwhile (its step lease lapsed and another worker took the next
  attempt, or its run was cancelled, or a worker failed it for its timeout): the fenced
  result write finds the attempt gone and raises, the transaction rolls back, and the
  dispatch ends quietly, as a superseded attempt's does;
* it ran **past its timeout** (``run.step(..., timeout=)``), even if nobody noticed yet: it
  rolls back and fails with :class:`~django_leases.exceptions.WorkflowStepTimedOutError`
  (code ``STEP_TIMED_OUT``).

Unlike a plain step, whose result is carried and written with whatever the workflow does
next, a transactional step's result is written at the end of its own transaction, and the
pass goes on from the run as that write left it.

Writes to *other* databases, files or HTTP services are outside the transaction: use
``ctx.idempotency_key`` (:class:`~django_leases.workflows.engine.StepContext`) for those.

Backends: on PostgreSQL and MariaDB / MySQL the transaction holds only the row locks the
function takes (plus the step row's, for the instant of the result write). On **SQLite** the
transaction holds the database's single write lock from its first statement until it commits
(``transaction_mode`` ``IMMEDIATE``: from its start): every other writer — other workers'
claims, lease renewals, web requests — waits meanwhile, and gives up with "database is
locked" after the busy timeout. Keep transactional steps on SQLite shorter than that timeout
(system check ``django_leases.W036``).

A connection error inside the transaction (the commit's reply lost, say) is the attempt's
failure: what it wrote is either all committed with its result, or none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import WorkflowStep
from django_leases.validation import check_json
from django_leases.workflows.values import Claim, StepWrite


class _RollBack(Exception):
    """Rolls the step's transaction back without recording anything (a result that is not
    JSON: the ordinary write records it as the attempt's failure)."""


@dataclass
class Transacted:
    """What a transactional attempt came to (:func:`run_in_transaction`).

    Attributes:
        result: what the function returned.
        written: the result's write, committed with the function's writes; ``None`` when
            nothing was committed (see ``superseded``; or a result that is not JSON, to be
            recorded as the attempt's failure by the ordinary write).
        superseded: the fenced write's refusal, when the attempt was superseded (its
            transaction was rolled back), else ``None``.
    """

    result: Any = None
    written: StepWrite | None = None
    superseded: WorkflowStepSupersededError | None = None


def run_in_transaction(
    claim: Claim, call: Callable[[], Any], *, hold_pass_seconds: float | None = None
) -> Transacted:
    """Call ``call`` (the step function, bound to its data and context) inside one
    transaction on ``claim.using`` and write its result for ``claim.attempt`` in that same
    transaction, fenced (:meth:`~django_leases.models.exactly.StepTransactions.
    record_in_transaction`; ``hold_pass_seconds``: as :meth:`~django_leases.models.results.
    StepResults.set_result` takes it). Returns a :class:`Transacted`.

    Raises:
        BaseException: what ``call`` raised, after the rollback (the attempt's failure, to
            be recorded on its own).
        WorkflowStepTimedOutError: the attempt ran past its ``timeout`` (rolled back).
        DatabaseError: the transaction failed (rolled back, or the commit's outcome unknown).
    """
    store = WorkflowStep.objects.db_manager(claim.using)
    done = Transacted()
    try:
        with transaction.atomic(using=claim.using):
            done.result = call()
            try:
                check_json(done.result, "Step result", using=claim.using)
            except ValueError:
                raise _RollBack from None
            done.written = store.record_in_transaction(
                claim.step_id, done.result, claim.attempt, hold_pass_seconds=hold_pass_seconds
            )
    except _RollBack:
        done.written = None
    except WorkflowStepSupersededError as exc:
        done.written, done.superseded = None, exc
    return done


__all__ = ["Transacted", "run_in_transaction"]
