"""Transactional steps: a ``@step_function(..., transactional=True)`` runs inside one
transaction on its run's database, and its result is recorded **in that same transaction**,
fenced to its attempt, with what its workflow does next (DESIGN §5c, "Exactly once").

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
  checked on the database clock (:meth:`~django_leases.models.exactly.StepTransactions.
  lock_for_result`), the result written with what goes with it, then everything commits
  together (:meth:`OpenTransaction.commit`);
* it **raises**: the transaction rolls back, and the failure is recorded as any step's
  (retried if attempts remain) — nothing the attempt wrote is kept;
* it was **superseded** meanwhile (its step lease lapsed and another worker took the next
  attempt, or its run was cancelled, or a worker failed it for its timeout): the fenced
  lock finds the attempt gone and raises, the transaction rolls back, and the dispatch ends
  quietly, as a superseded attempt's does;
* it ran **past its timeout** (``run.step(..., timeout=)``), even if nobody noticed yet: it
  rolls back and fails with :class:`~django_leases.exceptions.WorkflowStepTimedOutError`
  (code ``STEP_TIMED_OUT``).

**The next action joins the transaction** (the rule, precisely). A pass runs a step inline
and keeps its workflow function's frame (:mod:`~django_leases.workflows.driver`); a plain
step's result is carried, unwritten, to the pass's next write. A transactional step that a
pass runs inline, called at the depth of atomic blocks the pass began at (not inside a
``transaction.atomic()`` of the workflow code's own), is carried the same way **with its
transaction open** (:func:`begin`): the workflow function goes on inside it up to its next
action — ``run.step`` (the next step created and claimed for this worker, in one write with
the result), ``run.sleep``, ``run.wait_for_event``, ``run.child``, ``run.parallel``,
``run.patched``, its return (the run's completion) or an exception (the run's failure) —
and that action's write is made inside the transaction, which then commits. So the step's
writes, its result and the next claim land together or not at all:

* the timeout, or an exception the write raised that is not a database error, rolls it all
  back and is the attempt's failure (written on its own, fenced; retried if attempts
  remain);
* a database error of the library's own statements there — the lock, the write, the
  commit — rolls back and ends the unit of work (:func:`cut_short`; see "Whose error it
  is" below);
* a fence refusal rolls back and ends the pass quietly;
* a pass that ends without that write (its run lease lost, a read failing, an interrupt)
  rolls back and writes nothing: the step lease lapses and another attempt runs the step;
* a **lost commit reply** (the connection fails as the commit is sent, so it may have
  landed) ends the unit of work too; on a fresh connection the worker finds out what
  landed: not landed, the attempt is given back; landed, a next step that commit claimed
  for this worker is handed back unclaimed (its attempt 1 never ran) and the run lease
  released, so the run goes on at once. No attempt runs twice (``tests/test_lost_replies.
  py``, ``tests/test_pass_faults.py``; fault point ``"workflow.step-transaction-committed"``).

**Whose error it is** (the line). The attempt's failure: whatever the step function raises
while it runs — a ``DatabaseError`` of its own queries (an ``IntegrityError``, say)
included — and a transaction it returns unusable (it caught a database error without a
savepoint: :func:`~django_leases.db.transaction_failed`, told as a
``TransactionManagementError``), the attempt's ``timeout``, and a
``TransactionManagementError`` of the workflow code's own. The library's: a
``DatabaseError`` (or ``InterfaceError``) raised by its own statements after the function
returned — :meth:`~django_leases.models.exactly.StepTransactions.lock_for_result`, the
result write with the next action, the commit. Those are transient: the transaction rolls
back (or its outcome is looked up), the unit of work ends, and the attempt is given back
(:meth:`~django_leases.models.exactly.StepTransactions.give_back`: code
``STEP_TRANSACTION_CUT_SHORT``, not counted against ``retries``) so its next attempt runs at
once. A run never fails for them.

The workflow code between the step and its next action runs inside the transaction: it is
orchestration, deterministic and free of side effects outside ``run.*``, so it is short (on
SQLite it holds the write lock as the step did). A workflow that opens a transaction of its
own around that action is told (``TransactionManagementError``; its run fails). Not carried,
written at the end of the step's own transaction (:func:`run_in_transaction`) and the pass
going on from the state that write left: a step run from its queue (``drive()``, a
``run.parallel`` branch, a step another worker's pass left due) or called inside a
transaction of the workflow's own.

Cost (``bench/exactly_once.py``, PostgreSQL, tuned path, three-step runs inserting one row
per step, 2 cores at load 2.8–3.3): 3.6 statements and 2.1–2.5 ms of worker CPU per
transactional step (its insert, the lock, one statement for the result with the next step's
claim) against 2.5 statements and 0.8–1.1 ms per plain step; 5.6 statements and 3.7–4.1 ms
when the next step was claimed in a write of its own.

Writes to *other* databases, files or HTTP services are outside the transaction: use
``ctx.idempotency_key`` (:class:`~django_leases.workflows.engine.StepContext`) for those.

Backends: on PostgreSQL and MariaDB / MySQL the transaction holds only the row locks the
function takes (plus the step row's, for the instant of the result write). On **SQLite** the
transaction holds the database's single write lock from its first statement until it commits
(``transaction_mode`` ``IMMEDIATE``: from its start): every other writer — other workers'
claims, lease renewals, web requests — waits meanwhile, and gives up with "database is
locked" after the busy timeout. Keep transactional steps on SQLite shorter than that timeout
(system check ``django_leases.W036``).

A connection error inside the transaction (the commit's reply lost, say) ends the unit of
work: what the attempt wrote is either all committed with its result, or none of it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from django_leases import db, faults
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import WorkflowStep
from django_leases.validation import check_json
from django_leases.workflows.values import Claim, StepWrite

_T = TypeVar("_T")

logger = logging.getLogger("django_leases.workflows")


class _RollBack(Exception):
    """Rolls the step's transaction back without recording anything (a result that is not
    JSON: the ordinary write records it as the attempt's failure; or a transaction the pass
    could not carry to its next write)."""


class OpenTransaction:
    """A transactional attempt that returned JSON, its transaction still open on
    ``claim.using`` (:func:`begin`): nothing of it is written yet. :meth:`commit` writes its
    result — with whatever the caller writes with it — and commits; :meth:`roll_back`
    drops it all.

    Attributes:
        claim: the attempt's :class:`~django_leases.workflows.values.Claim`.
        open: ``True`` until it was committed or rolled back.
    """

    def __init__(self, claim: Claim, atomic: transaction.Atomic) -> None:
        self.claim = claim
        self.open = True
        #: The commit was sent: a failure since leaves its outcome unknown (it may have
        #: landed, its reply lost).
        self.commit_sent = False
        self._atomic = atomic

    def innermost(self) -> bool:
        """Whether this transaction is the innermost atomic block open on its connection
        (the code that ran since opened none of its own that is still open): only then can
        it be committed or rolled back."""
        blocks = connections[self.claim.using].atomic_blocks
        return bool(blocks) and blocks[-1] is self._atomic

    def commit(self, write: Callable[[], _T]) -> _T:
        """Inside the transaction, lock the step row through the attempt's fence and judge
        its ``timeout`` (:meth:`~django_leases.models.exactly.StepTransactions.
        lock_for_result`), call ``write`` — which writes the attempt's result, fenced, with
        what goes with it — and commit. Returns what ``write`` returned.

        Raises:
            WorkflowStepSupersededError: the attempt was superseded (rolled back).
            WorkflowStepTimedOutError: the attempt ran past its ``timeout`` (rolled back).
            TransactionManagementError: not the innermost atomic block (nothing done), or
                the transaction was marked for rollback (rolled back).
            DatabaseError: a statement failed (rolled back), or the commit did (its
                outcome unknown: its reply may be lost after it landed).
            BaseException: what ``write`` raised (rolled back).
        """
        claim = self.claim
        if not self.open or not self.innermost():
            raise TransactionManagementError(
                f"The transaction of step {claim.step_name!r} (attempt {claim.attempt}) "
                "cannot be committed: a transaction opened since is still open"
            )
        try:
            WorkflowStep.objects.db_manager(claim.using).lock_for_result(
                claim.step_id, claim.attempt, floor=claim.fence_floor
            )
            done = write()
            if connections[claim.using].needs_rollback:
                raise TransactionManagementError("the transaction was marked for rollback")
        except BaseException as exc:
            self.roll_back(exc)
            raise
        self.open = False
        self.commit_sent = True
        self._atomic.__exit__(None, None, None)
        faults.reached(
            "workflow.step-transaction-committed", run_id=claim.run_id, step_name=claim.step_name
        )
        return done

    def roll_back(self, error: BaseException | None = None) -> None:
        """Roll the transaction back (once; later calls do nothing). ``error``: why, as the
        atomic block is told."""
        if not self.open:
            return
        self.open = False
        why = error if error is not None else _RollBack()
        blocks = connections[self.claim.using].atomic_blocks
        if any(block is self._atomic for block in blocks):
            # Blocks the step function entered and never exited go first, as failed: each
            # rolls back to its savepoint, then this one rolls the whole attempt back.
            while blocks[-1] is not self._atomic:
                blocks[-1].__exit__(type(why), why, why.__traceback__)
        self._atomic.__exit__(type(why), why, why.__traceback__)


def begin(claim: Claim, call: Callable[[], Any]) -> tuple[Any, OpenTransaction | None]:
    """Open a transaction on ``claim.using`` and call ``call`` (the step function, bound to
    its data and context) inside it. Returns what it returned and, when that is JSON, the
    transaction, still open (:class:`OpenTransaction`): the caller commits it with the
    result or rolls it back, on this thread. A result that is not JSON is rolled back and
    returned with ``None`` (the ordinary write records it as the attempt's failure).

    Raises:
        BaseException: what ``call`` raised, after the rollback (atomic blocks it entered
            and left open rolled back first).
        TransactionManagementError: ``call`` returned inside an atomic block of its own,
            or with its transaction failed (rolled back).
    """
    atomic = transaction.atomic(using=claim.using)
    atomic.__enter__()
    opened = OpenTransaction(claim, atomic)
    try:
        result = call()
        if inspect.iscoroutine(result):
            result.close()  # never awaited: a transactional step runs on its worker thread
            raise TypeError(
                f"Step function {claim.function_name!r} returned a coroutine: a transactional "
                "step is a plain (synchronous) function"
            )
        if not opened.innermost():
            raise TransactionManagementError(
                f"Step function {claim.function_name!r} returned inside a transaction.atomic() "
                "block of its own that it never left: its attempt's writes are rolled back "
                "(use atomic() as a context manager)"
            )
        if db.transaction_failed(connections[claim.using]):
            raise TransactionManagementError(
                f"Step function {claim.function_name!r} returned with its transaction failed "
                "or marked for rollback: it caught a database error without rolling back to a "
                "savepoint (wrap the statement in transaction.atomic() to go on after it), or "
                "called transaction.set_rollback(True)"
            )
    except BaseException as exc:
        opened.roll_back(exc)
        raise
    try:
        check_json(result, "Step result", using=claim.using)
    except ValueError as exc:
        opened.roll_back(exc)
        return result, None
    return result, opened


class CutShort(BaseException):
    """A database error of the library's own statements ended a transactional attempt's
    transaction (:func:`run_in_transaction`), which was then handled by :func:`cut_short`:
    not the attempt's failure. A ``BaseException``, so that the step's ``except`` clauses
    cannot take it for the function's error; ``error`` is the database error, raised again
    by :func:`~django_leases.workflows.engine.run_step_function` to end the unit of work."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def cut_short(claim: Claim, error: BaseException, *, claimant: str | None = None) -> None:
    """A database error of the library's own (``error``) ended the transaction of attempt
    ``claim`` — its lock, its result write or its commit, whose reply may be lost after it
    landed. Best effort, on a fresh connection when the database answers (else the leases
    lapse): where the attempt is still running (the transaction did not land) it is given
    back (:meth:`~django_leases.models.exactly.StepTransactions.give_back`: due again at
    once, not counted against ``retries``); where it landed, the steps that commit claimed
    under ``claimant`` (when given) for a worker that will not run them are handed back
    unclaimed (:meth:`~django_leases.models.scheduling.StepScheduling.unclaim_created`).
    Never runs anything; never raises a database error."""
    logger.warning(
        "Run %s: the transaction of step %r attempt %d was cut short (%s); the unit of work ends",
        claim.run_id,
        claim.step_name,
        claim.attempt,
        error,
    )
    store = WorkflowStep.objects.db_manager(claim.using)
    connection = connections[claim.using]
    try:
        if db.outside_transactions(connection):
            connection.close()  # the next statement reconnects: the old one may be dead
        why = f"Its transaction was cut short by a database error: {error}"
        if not store.give_back(claim.step_id, claim.attempt, why[:1000]) and claimant:
            store.unclaim_created(claim.run_id, claimant)
    except db.DATABASE_FAULTS:
        logger.warning("Run %s: could not give back step %r", claim.run_id, claim.step_name)


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
    transaction, fenced (:func:`begin`, then :meth:`OpenTransaction.commit` with
    :meth:`~django_leases.models.results.StepResults.set_result`; ``hold_pass_seconds``: as
    that takes it). Returns a :class:`Transacted`.

    Raises:
        BaseException: what ``call`` raised, after the rollback (the attempt's failure, to
            be recorded on its own).
        WorkflowStepTimedOutError: the attempt ran past its ``timeout`` (rolled back).
        TransactionManagementError: ``call`` left its transaction unusable (rolled back;
            the attempt's failure).
        CutShort: a statement of the library's own, or the commit, failed (rolled back, or
            the commit's outcome unknown), handled by :func:`cut_short`.
    """
    store = WorkflowStep.objects.db_manager(claim.using)
    done = Transacted()
    done.result, opened = begin(claim, call)
    if opened is None:
        return done
    try:
        done.written = opened.commit(
            lambda: store.set_result(
                claim.step_id, done.result, claim.attempt, hold_pass_seconds=hold_pass_seconds
            )
        )
    except WorkflowStepSupersededError as exc:
        done.superseded = exc
    except TransactionManagementError:
        raise  # the function left its transaction unusable: the attempt's failure
    except db.DATABASE_FAULTS as exc:
        cut_short(claim, exc)
        raise CutShort(exc) from exc
    return done


__all__ = ["CutShort", "OpenTransaction", "Transacted", "begin", "cut_short", "run_in_transaction"]
