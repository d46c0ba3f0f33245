"""Passes: a ``@workflow`` run through under its run lease, its steps run inline, each step's
result written with what the workflow does next (DESIGN §5, "How a pass runs").

A ``@workflow`` function is called **once per pass**::

    @workflow("build-preview")
    def build_preview(run, payload):
        source = run.step("checkout", "previews.checkout", {"ref": payload["ref"]})
        build = run.step("build", "previews.build", source, retries=3, retry_delay=5)
        return {"build": build["build_id"]}

A pass starts by replaying what the run recorded: ``run.step`` returns a succeeded step's
recorded result, ``run.sleep`` a sleep that ended, and so on, up to the first action the run
has not recorded. From there the pass runs **live**: at a new ``run.step`` it creates the step
claimed for its own thread (when this worker takes the step's queue and the queue admits it),
runs the ``@step_function`` inline under the step lease, and hands the result straight back
to the workflow function, whose frame stays alive. The result is not written on its own: it
is written together with whatever the workflow does next — the next step's creation and
claim, a wait, a child run, a fan-out, the run's completion or failure — in one fenced
statement (the tuned path) or one transaction. So a sequential k-step run costs k writes and
O(k) workflow-code work. Should the worker die before that write, the step's lease lapses and
another attempt produces the result again: a workflow function is deterministic and free of
side effects outside ``run.*``, and step functions should be idempotent.

The pass ends — and its thread goes back to claiming — at a durable wait that is not over, a
``run.parallel``, a child run, a step this worker does not run here (another queue, a queue at
its limit, a retry delay), or a lost run lease. Replays happen only when a pass starts: a new
worker, after a wait, after a takeover, or after a step's failure.

:class:`RunDriver` runs a run's passes on the calling thread; :func:`after_step` continues a
run from a step a worker claimed from its queue (its result carried into the run's pass).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, Protocol, TypeVar

from django.db import connections, router
from django.db.transaction import TransactionManagementError

from django_leases import db, tracing
from django_leases.conf import MAX_QUEUE_LENGTH, leases_settings, queue_limits
from django_leases.exceptions import (
    LeaseLostError,
    LeaseTakenError,
    UnknownWorkflowError,
    WorkflowChildFailedError,
    WorkflowEventTimeout,
    WorkflowStepFailedError,
    WorkflowStepSupersededError,
)
from django_leases.leases import HeldLease, new_holder
from django_leases.models import WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.timing import check_deadline
from django_leases.models.workflow import ResultWithNext, Scheduled
from django_leases.validation import (
    check_identifier,
    check_json,
    check_name,
    error_json,
    wait_seconds,
)
from django_leases.workflows.engine import (
    StepRecorded,
    StepRun,
    held_while,
    record_step,
    retrying,
    run_step_function,
    superseded,
)
from django_leases.workflows.registry import get_workflow, step_declaration
from django_leases.workflows.transactional import OpenTransaction, cut_short
from django_leases.workflows.values import (
    STEP_FAILED,
    WORKFLOW_ERROR,
    WORKFLOW_NOT_FOUND,
    Claim,
    NextStep,
    PassClaim,
    PassState,
    PendingResult,
    RunStatus,
    StepOptions,
    StepStatus,
    WaitKind,
    WaitStatus,
    claimant_name,
    exhausted,
    run_lease_key,
)

logger = logging.getLogger("django_leases.workflows")

_T = TypeVar("_T")

#: What a statement of the library's own raises when the database fails it.
_DATABASE_FAULTS = db.DATABASE_FAULTS


#: Seconds after which a pass that found the run lease taken is tried again.
PASS_RETRY_DELAY = 1.0


def run_lease_ttl() -> float:
    """TTL (seconds) of the run lease, and how long a picked pass waits before it is re-picked
    should its worker die: ``DJANGO_LEASES["DEFAULT_TTL"]``."""
    return float(leases_settings.DEFAULT_TTL)


# -- how a pass ends ----------------------------------------------------------------------------


class _PassEnded(BaseException):
    """Ends a pass where the run cannot go on now (a wait, a fan-out, a child run, a step not
    finished or not run here). A ``BaseException``, so that a workflow's ``except
    Exception:`` cannot swallow it.

    ``written``: the write that met the end also ended the pass (nothing more to write)."""

    def __init__(self, *, written: bool = False) -> None:
        super().__init__()
        self.written = written


class _StartOver(BaseException):
    """Ends this pass and starts the run's next one at once, from ``state`` (the run as a
    write left it: after a step's failure, say), under the same hold of the run lease."""

    def __init__(self, state: PassState) -> None:
        super().__init__()
        self.state = state


class _Quietly(BaseException):
    """Ends the pass with nothing more written: ``outcome`` says why (``"superseded"``: the
    fence refused the pass's write; ``"suspended"``, ``"not-running"``)."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class _Interrupted(BaseException):
    """A call of the library's own failed inside the workflow function (the database, or the
    run lease lost): it ends the unit of work, never the run. ``error`` is what it raised."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


# -- one pass -----------------------------------------------------------------------------------


class _Pass:
    """One pass of a run: the run and steps it read, the step result it has seen but not
    written yet (:attr:`pending`), and how it ends."""

    def __init__(self, driver: RunDriver, state: PassState, pending: StepRun | None) -> None:
        self.driver = driver
        self.run = state.run
        self.steps = state.steps
        self.using = driver.alias
        #: The step rows' manager on the pass's database, made once (``db_manager`` copies
        #: the manager each time it is asked, twice per step).
        self.store = WorkflowStep.objects.db_manager(self.using)
        #: A succeeded step whose result this pass carries, unwritten: written with the
        #: pass's next write.
        self.pending = pending
        #: ``pass_requests`` as this pass last wrote or read it (``None``: unknown — a pass
        #: was asked for meanwhile, which is then left due).
        self.requests: int | None = state.run.pass_requests
        self.seen: set[str] = set()
        #: Patch names the workflow asked ``run.patched`` about in this pass.
        self.patches: set[str] = set()
        #: When the wait the pass ended at needs the next pass (database clock).
        self.next_due: datetime | None = None
        #: Steps of the ``run.parallel`` the pass ended at that are not finished.
        self.branches = 0
        self._waits: dict[str, WorkflowWait] | None = None
        #: The run's ``queue_key`` once read (``None``: not read yet).
        self._queue_key: str | None = None
        #: Atomic blocks open on the run's database as the pass began (a test's, under
        #: ``drive()``): a transactional step called at this depth carries its transaction
        #: to the pass's next write.
        self.depth = len(connections[self.using].atomic_blocks)

    def keyed(self, options: StepOptions) -> StepOptions:
        """``options`` with the run's queue key where the step gave none and its queue has
        per-key limits (the key counts only there; read once per pass, only then)."""
        if options.queue_key is not None:
            return options
        limits = queue_limits().get(options.queue)
        if limits is None or not limits.keyed:
            return options
        if self._queue_key is None:
            runs = WorkflowRun.objects.db_manager(self.using).filter(pk=self.run.id)
            try:
                self._queue_key = runs.values_list("queue_key", flat=True).first() or ""
            except _DATABASE_FAULTS as exc:  # the library's read: ends the unit, not the run
                raise _Interrupted(exc) from exc
        return dataclasses.replace(options, queue_key=self._queue_key or None)

    # -- the pending result --------------------------------------------------------------------

    def pending_result(self) -> PendingResult | None:
        """The pending step result as the writes take it (``None`` when there is none)."""
        ran = self.pending
        if ran is None:
            return None
        return PendingResult(ran.claim.step_id, ran.claim.attempt, ran.result)

    def write(self, call: Callable[[PendingResult | None], _T]) -> _T:
        """Make one write of the pass: ``call(pending)`` writes whatever it writes together
        with the pending step result (if any), in one transaction. The pending result is
        written once that returns. A write carrying a pending result is tried again after a
        lost connection while that step's lease lasts (the fence makes it safe); a fence
        failure ends the pass quietly; any other database error, or the run lease lost, ends
        the unit of work (:class:`_Interrupted`). A transactional step's pending result is
        written inside that step's open transaction, which then commits
        (:meth:`_write_in_transaction`)."""
        if self.pending is not None and self.pending.transaction is not None:
            return self._write_in_transaction(self.pending, self.pending.transaction, call)
        self.driver.held_check()
        pending = self.pending_result()
        try:
            if self.pending is None:
                done = call(None)
            else:
                done = retrying(self.pending, lambda: call(pending))
        except WorkflowStepSupersededError as exc:
            if self.pending is not None:
                superseded(self.pending.claim, exc)
            raise _Quietly("superseded") from None
        except _DATABASE_FAULTS as exc:
            raise _Interrupted(exc) from exc
        self.pending = None
        return done

    def _write_in_transaction(
        self,
        ran: StepRun,
        opened: OpenTransaction,
        call: Callable[[PendingResult | None], _T],
    ) -> _T:
        """:meth:`write` for a carried transactional step ``ran``: inside its open
        transaction ``opened``, the step row locked through the fence and its timeout judged,
        ``call(pending)`` writes the result with the workflow's next action, and the
        transaction commits — the step function's writes, its result and that action land
        together or not at all. Nothing is tried again (the function's writes cannot be):
        a refusal of the fence ends the pass quietly; a lost run lease rolls back and ends
        the unit of work (the step lease lapses, another attempt runs the step); a database
        error of a statement of the library's own or of the commit (its reply lost: it may
        have landed) ends the unit of work too (:meth:`_transaction_lost`: the attempt given
        back, or what the commit claimed handed back); any other failure — the timeout, a
        ``TransactionManagementError`` — rolls back and is the attempt's failure, written
        on its own and fenced, and the run's next pass starts from there.

        Raises:
            TransactionManagementError: the workflow code opened a transaction of its own
                that is still open (nothing written; the step's transaction stays open).
        """
        if not opened.innermost():
            raise TransactionManagementError(
                f"Run {self.run.id}: the workflow reached its next action inside a "
                "transaction of its own while the transaction of its transactional step "
                f"{ran.claim.step_name!r} is open; workflow code must not open transactions"
            )
        try:
            self.driver.held_check()
        except _Interrupted:
            self.discard()
            raise
        pending = self.pending_result()
        try:
            done = opened.commit(lambda: call(pending))
        except WorkflowStepSupersededError as exc:
            self.pending = None
            superseded(ran.claim, exc)
            raise _Quietly("superseded") from None
        except (_StartOver, _PassEnded, _Quietly, _Interrupted, KeyboardInterrupt):
            self.pending = None
            raise
        except TransactionManagementError as exc:  # left failed, or its result refused
            self.pending = None
            self._transaction_failed(ran, exc)
        except _DATABASE_FAULTS as exc:  # the library's own statement, or the commit
            self.pending = None
            self._transaction_lost(ran, opened, exc)
        except BaseException as exc:  # the timeout, what the write raised: rolled back
            self.pending = None
            self._transaction_failed(ran, exc)
        self.pending = None
        return done

    def _transaction_lost(
        self, ran: StepRun, opened: OpenTransaction, error: BaseException
    ) -> NoReturn:
        """A statement of the library's own in the transaction of carried step ``ran``
        failed, or the commit did (``opened.commit_sent``: its reply lost, it may have
        landed): a transient database error, not the step's — the unit of work ends
        (:class:`_Interrupted`: the run lease released, the run's pass due now), and nothing
        the worker holds is left to lapse (:func:`~django_leases.workflows.transactional.
        cut_short`: the attempt given back, or a next step the commit claimed for this worker
        handed back unclaimed)."""
        lease = self.driver.held.lease
        claimant = None
        if opened.commit_sent and lease is not None:
            claim = ran.claim
            claimant = claimant_name(lease.holder, lease.token, claim.step_id, claim.attempt)
        cut_short(ran.claim, error, claimant=claimant)
        raise _Interrupted(error) from error

    def _transaction_failed(self, ran: StepRun, failure: BaseException) -> NoReturn:
        """The transaction of carried step ``ran`` failed with ``failure`` (rolled back, or
        its commit's outcome unknown): the attempt's failure, written on its own, fenced —
        refused where the commit did land — and the run's next pass starts from there."""
        claim = ran.claim
        logger.warning(
            "Run %s: the transaction of step %r attempt %d failed: %s",
            claim.run_id,
            claim.step_name,
            claim.attempt,
            failure,
        )
        self._write_alone(dataclasses.replace(ran, transaction=None, failure=failure))

    def _write_alone(self, ran: StepRun) -> NoReturn:
        """Write step ``ran``'s outcome on its own (fenced, the pass held), then end the pass
        from what that write left (:func:`_after_failure`); a database fault interrupts it."""
        try:
            recorded = _record(ran, hold_pass_seconds=self.driver.lease_ttl)
        except _DATABASE_FAULTS as exc:
            raise _Interrupted(exc) from exc
        _after_failure(recorded)

    def discard(self) -> None:
        """Roll back a carried transactional step's transaction that no write carried (the
        pass ended otherwise: its run lease lost, a read of its own failed, an interrupt):
        nothing of the attempt lands and nothing is written for it — its step lease lapses
        and another attempt runs the step."""
        ran = self.pending
        if ran is None or ran.transaction is None:
            return
        self.pending = None
        ran.transaction.roll_back()
        logger.warning(
            "Run %s: step %r attempt %d rolled back: its pass ended before its result "
            "could be written",
            ran.claim.run_id,
            ran.claim.step_name,
            ran.claim.attempt,
        )

    # -- what the workflow calls ---------------------------------------------------------------

    def see(self, name: str) -> None:
        """Note that the workflow used step or wait ``name`` in this pass (``ValueError``
        the second time: names are how a replay finds what it recorded)."""
        if name in self.seen:
            raise ValueError(f"Step or wait name {name!r} is used twice in run {self.run.id}")
        recorded = self.steps.get(name)
        if name in self.patches or (recorded is not None and recorded.status == StepStatus.PATCH):
            raise ValueError(
                f"{name!r} is the name of a patch (run.patched) in run {self.run.id}; a step "
                "or wait needs a name of its own"
            )
        self.seen.add(name)

    def patched(self, name: str) -> bool:
        """The run's answer to ``run.patched(name)``: the one it recorded, else decided and
        recorded now (with the pending result) — ``True`` unless the run recorded steps or
        waits that this pass has not replayed yet (it went past this point before the patch
        existed)."""
        if name in self.seen:
            raise ValueError(
                f"{name!r} is the name of a step or wait in run {self.run.id}; a patch needs "
                "a name of its own"
            )
        recorded = self.steps.get(name)
        if recorded is None:
            decided = not self.unreplayed()
            store = self.store
            recorded = self.steps[name] = self.write(
                lambda pending: store.record_patch(self.run.id, name, decided, pending=pending)
            )
        elif recorded.status != StepStatus.PATCH:
            raise ValueError(
                f"{name!r} is the name of a step of run {self.run.id}; a patch needs a name "
                "of its own"
            )
        self.patches.add(name)
        return bool(recorded.result)

    def unreplayed(self) -> bool:
        """Whether the run recorded a step or reached a wait that this pass has not met yet
        (patch decisions aside)."""
        if any(
            name not in self.seen and step.status != StepStatus.PATCH
            for name, step in self.steps.items()
        ):
            return True
        return any(
            wait.reached_at is not None and name not in self.seen
            for name, wait in self.waits().items()
        )

    def end(self, due_at: datetime | None = None, branches: int = 0) -> NoReturn:
        """End the pass here; its next pass is due at ``due_at`` (``None``: only when
        something asks for one — a step's result, an event, a child's end)."""
        self.next_due, self.branches = due_at, branches
        raise _PassEnded

    def waits(self) -> dict[str, WorkflowWait]:
        """The run's waits by name, read once per pass, on the first wait it reaches."""
        if self._waits is None:
            try:
                self._waits = WorkflowWait.objects.db_manager(self.using).for_pass(self.run.id)
            except _DATABASE_FAULTS as exc:
                raise _Interrupted(exc) from exc
        return self._waits

    def reach(self, name: str, kind: str, seconds: float | None = None) -> WorkflowWait:
        """The wait ``name`` as recorded; recorded now (with the pending result) if this is
        the first pass to reach it. ``ValueError`` where the run recorded a step of that
        name (the code changed under it: a wait cannot take the step's place)."""
        self.see(name)
        if name in self.steps:
            raise ValueError(
                f"{name!r} is the name of a step of run {self.run.id}; a wait needs a name "
                "of its own"
            )
        waits = self.waits()
        wait = waits.get(name)
        if wait is None or wait.kind != kind or wait.reached_at is None:
            store = WorkflowWait.objects.db_manager(self.using)
            wait = waits[name] = self.write(
                lambda pending: store.reach(
                    self.run.id, name, kind, seconds=seconds, pending=pending
                )
            )
        return wait

    def settled(self, wait: WorkflowWait) -> WorkflowWait:
        """``wait`` with its outcome decided if its time is over (a sleep ended, an event
        timed out), else as it is."""
        if wait.status != WaitStatus.WAITING or not wait.is_over():
            return wait
        store = WorkflowWait.objects.db_manager(self.using)
        return self.write(lambda pending: store.settle(wait, pending=pending))

    def sleep(self, name: str, seconds: float) -> None:
        wait = self.settled(self.reach(name, WaitKind.SLEEP, seconds))
        if wait.status != WaitStatus.DONE:
            self.end(wait.due_at)

    def wait_for_event(self, name: str, timeout: float | None) -> Any:
        wait = self.settled(self.reach(name, WaitKind.EVENT, timeout))
        if wait.status == WaitStatus.DONE:
            return wait.payload
        if wait.status == WaitStatus.TIMED_OUT:
            raise WorkflowEventTimeout(name, timeout)
        self.end(wait.due_at)

    def child(self, name: str, workflow: str, input: Any, deadline: float | None = None) -> Any:
        self.see(name)
        waits = self.waits()
        wait = waits.get(name)
        store = WorkflowWait.objects.db_manager(self.using)
        if wait is None or wait.kind != WaitKind.CHILD or wait.child_id is None:
            get_workflow(workflow)  # UnknownWorkflowError fails this run, starting nothing
            wait = waits[name] = self.write(
                lambda pending: store.start_child(
                    self.run.id, name, workflow, input, pending=pending, deadline=deadline
                )
            )
        elif wait.child is not None and wait.child.workflow != workflow:
            store.start_child(self.run.id, name, workflow, input)  # raises ValueError
        child = wait.child
        if child is None:  # pruned from under its parent
            raise WorkflowChildFailedError(name, None, "missing", "the child run was deleted")
        if child.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
            if wait.status == WaitStatus.WAITING:
                # Read again under the child's lock: an operator may have reopened it since.
                settled = self.write(lambda pending: store.settle_child(wait, pending=pending))
                if settled is None:
                    self.end()  # running again: its end asks for the next pass
                child = settled
            if child.status == RunStatus.COMPLETED:
                return child.output
            raise WorkflowChildFailedError(name, child.pk, child.status, child.error)
        self.end()  # the child's end asks for the next pass

    def parallel(
        self, calls: list[tuple[str, str, Any]], options: StepOptions, priority: int | None
    ) -> list[Any]:
        for step_name, _, _ in calls:
            self.see(step_name)
        missing = [call for call in calls if call[0] not in self.steps]
        if missing:
            store = self.store
            each = {
                name: self.keyed(_placed(function, options, priority))
                for name, function, _ in missing
            }
            self.steps.update(
                self.write(
                    lambda pending: store.schedule_many(
                        self.run.id, missing, options_of=each, pending=pending
                    )
                )
            )
        results = []
        unfinished = 0
        for step_name, function_name, _ in calls:
            step = self.steps[step_name]
            _same_function(step_name, step.function_name, function_name)
            if self._carried(step_name):
                results.append(self._carried_result())
            elif step.status == StepStatus.SUCCEEDED:
                results.append(step.result)
            elif step.status == StepStatus.FAILED and exhausted(step.attempt, step.retries):
                raise WorkflowStepFailedError(step_name, step.error)
            else:
                unfinished += 1  # pending, scheduled, running, or failed with attempts left
        if unfinished:
            self.end(branches=unfinished)
        return results

    def step(self, step_name: str, function_name: str, data: Any, options: StepOptions) -> Any:
        self.see(step_name)
        if self._carried(step_name):
            assert self.pending is not None
            _same_function(step_name, self.pending.claim.function_name, function_name)
            return self._carried_result()
        step = self.steps.get(step_name)
        if step is not None:
            _same_function(step_name, step.function_name, function_name)
            if step.status == StepStatus.SUCCEEDED:
                return step.result
            if step.status == StepStatus.FAILED and exhausted(step.attempt, step.retries):
                raise WorkflowStepFailedError(step_name, step.error)
            return self._run(self._reclaim(step))
        return self._run(
            self._create(NextStep(step_name, function_name, data, self.keyed(options)))
        )

    # -- steps ---------------------------------------------------------------------------------

    def _carried(self, step_name: str) -> bool:
        """Whether ``step_name`` is the step whose result this pass carries."""
        return self.pending is not None and self.pending.claim.step_name == step_name

    def _carried_result(self) -> Any:
        """The carried result as the database will give it back (a copy: the workflow may
        change what it is given, and the result is written later)."""
        assert self.pending is not None
        return self.store.stored_json(self.pending.result)

    def _create(self, wanted: NextStep) -> Claim | None:
        """Create step ``wanted`` with the pending result — claimed for this thread when it
        may run it here — and return its claim; ``None``: created for other workers."""
        store = self.store
        driver = self.driver
        ttl = driver.step_lease_ttl if driver.keep_going() else None
        if ttl is None:
            step = self.write(
                lambda pending: store.schedule_step(self.run.id, wanted, pending=pending)
            )
            self.steps[wanted.step_name] = step
            self.end()
        pending = self.pending
        if pending is None:
            first = self.write(
                lambda _: store.schedule_claimed(
                    self.run.id,
                    wanted,
                    lease_ttl_seconds=ttl,
                    finish_pass=self._requests(),
                    queues=driver.queues,
                )
            )
            self.steps[wanted.step_name] = first.step
            if first.claim is None:
                self.end()
            return first.claim
        lease = driver.held.lease
        claimant = claimant_name(
            lease.holder, lease.token, pending.claim.step_id, pending.claim.attempt
        )

        def write(_: PendingResult | None) -> tuple[ResultWithNext | None, Scheduled | None]:
            done = store.set_result_claiming_next(
                pending.claim.step_id,
                pending.result,
                pending.claim.attempt,
                next_step=wanted,
                finish_pass=self._requests(),
                lease_ttl_seconds=ttl,
                hold_pass_seconds=driver.lease_ttl,
                queues=driver.queues,
                claimant=claimant,
            )
            if done.next is None and not done.write.written:
                # A repeat: the first try committed and its reply was lost. The step it
                # created is this thread's only if that write claimed it for this writer.
                again = store.reclaim_created(
                    self.run.id,
                    wanted.step_name,
                    lease=lease,
                    lease_ttl_seconds=ttl,
                    claimant=claimant,
                )
                return None, again
            return done, done.next

        done, scheduled = self.write(write)
        if scheduled is None:
            if done is not None and done.write.state is not None:
                raise _StartOver(done.write.state)  # no step made: a fresh pass decides
            # The run ended meanwhile, waits on other steps, or (after a lost reply) its next
            # step is another worker's or will be taken over once its lease lapses.
            raise _Quietly("waiting")
        self.steps[wanted.step_name] = scheduled.step
        self.requests = None if done is None else done.pass_requests
        if scheduled.claim is None:  # for its queue's workers; the write ended the pass
            raise _PassEnded(written=True)
        return scheduled.claim

    def _reclaim(self, step: WorkflowStep) -> Claim | None:
        """A recorded step not finished (created for the queue, waiting out a retry delay,
        running elsewhere): claimed for this thread if it is due and this worker may run it
        here (and no result is pending: that is written first, as the pass ends)."""
        driver = self.driver
        ttl = driver.step_lease_ttl
        if (
            ttl is None
            or self.pending is not None
            or not driver.keep_going()
            or (driver.queues and step.queue not in driver.queues)
        ):
            self.end()
        store = self.store
        claim = self.write(
            lambda _: store.claim_for_execution(
                self.run.id, step.step_name, step.function_name, ttl
            )
        )
        if claim is None:
            self.end()
        return claim

    def _run(self, claim: Claim | None) -> Any:
        """Run the claimed step here and hand its result to the workflow (carried,
        unwritten, until the pass's next write); a failure is written at once and the run's
        next pass starts from what that write left."""
        if claim is None:
            self.end()
        logger.info(
            "Run %s: step %r attempt %d claimed", claim.run_id, claim.step_name, claim.attempt
        )
        # A transactional step called where the pass began (not inside a transaction the
        # workflow code opened) keeps its transaction open: its result is written in it with
        # the workflow's next action, as a plain step's is carried. Elsewhere it is written
        # in its own transaction at once, the pass held.
        carry = len(connections[self.using].atomic_blocks) == self.depth
        try:
            ran = run_step_function(claim, hold_pass_seconds=self.driver.lease_ttl, carry=carry)
        except _DATABASE_FAULTS as exc:  # a transactional step's transaction cut short
            raise _Interrupted(exc) from exc
        if _storable(ran):  # else recorded below: the attempt's failure, or written already
            logger.info(
                "Run %s: step %r attempt %d succeeded", claim.run_id, claim.step_name, claim.attempt
            )
            self.pending = ran
            return self._carried_result()
        self._write_alone(ran)

    def _requests(self) -> int:
        """``pass_requests`` as this pass knows it (``-1`` when unknown: nothing it writes
        then ends a pass another caller asked for)."""
        return -1 if self.requests is None else self.requests


def _record(ran: StepRun, *, hold_pass_seconds: float | None = None) -> StepRecorded:
    """:func:`record_step`, logged."""
    claim = ran.claim
    recorded = record_step(ran, hold_pass_seconds=hold_pass_seconds)
    logger.info(
        "Run %s: step %r attempt %d %s",
        claim.run_id,
        claim.step_name,
        claim.attempt,
        recorded.outcome,
    )
    return recorded


def _after_failure(recorded: StepRecorded) -> NoReturn:
    """End the pass after a step's outcome was written on its own: quietly where nothing is
    left to run (superseded, suspended, the run not running), else by starting the run's
    next pass from the state the write left."""
    if recorded.outcome in ("superseded", "suspended"):
        raise _Quietly(recorded.outcome)
    if recorded.state is None:
        raise _Quietly("not-running")
    raise _StartOver(recorded.state)


def _storable(ran: StepRun) -> bool:
    """Whether step ``ran`` returned a result that can be carried and stored (JSON); a
    failure, or a result that is not JSON, is written on its own (the attempt's error)."""
    if not ran.succeeded:
        return False
    try:
        check_json(ran.result, "Step result", using=ran.claim.using)
    except ValueError:
        return False
    return True


def _placed(function_name: str, options: StepOptions, priority: int | None) -> StepOptions:
    """``options`` for a step of ``function_name``: its step function's queue, and its
    declared priority where the call gave none (``priority``)."""
    declared = step_declaration(function_name)
    return options.placed(declared.queue, declared.priority if priority is None else priority)


def _same_function(step_name: str, recorded: str, asked: str) -> None:
    if recorded != asked:
        raise ValueError(
            f"Step {step_name!r} was recorded with step function {recorded!r}; "
            f"the workflow now asks for {asked!r}"
        )


# -- what the workflow function gets ------------------------------------------------------------


class PassCalls(Protocol):
    """What :class:`RunContext` calls with checked arguments: a pass of the run (the engine's,
    or a dry one that replays the run in memory and writes nothing,
    :mod:`django_leases.workflows.replay_check`)."""

    run: WorkflowRun

    def step(self, step_name: str, function_name: str, data: Any, options: StepOptions) -> Any:
        """:meth:`RunContext.step`, its arguments checked."""

    def parallel(
        self, calls: list[tuple[str, str, Any]], options: StepOptions, priority: int | None
    ) -> list[Any]:
        """:meth:`RunContext.parallel`, its arguments checked."""

    def child(self, name: str, workflow: str, input: Any, deadline: float | None = None) -> Any:
        """:meth:`RunContext.child`, its arguments checked (``deadline``: seconds)."""

    def sleep(self, name: str, seconds: float) -> None:
        """:meth:`RunContext.sleep`, its arguments checked (``seconds``: float)."""

    def wait_for_event(self, name: str, timeout: float | None) -> Any:
        """:meth:`RunContext.wait_for_event`, its arguments checked (``timeout``: seconds)."""

    def patched(self, name: str) -> bool:
        """:meth:`RunContext.patched`, its name checked."""


class RunContext:
    """What a ``@workflow`` function gets as ``run``.

    Attributes:
        id: the run id (``uuid.UUID``).
        workflow: the workflow name.
        input: the run's JSON input (also passed as the second argument).
    """

    def __init__(self, this: PassCalls) -> None:
        self.id: uuid.UUID = this.run.id
        self.workflow: str = this.run.workflow
        self.input: Any = this.run.input
        self._pass = this

    def step(
        self,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        queue_key: str | None = None,
    ) -> Any:
        """Run step ``step_name`` with step function ``function_name`` on JSON ``data`` and
        return its result.

        A step the run recorded as succeeded returns its recorded result. Otherwise the step
        is created (on the first pass that reaches it) and, where this worker takes its queue
        and the queue admits it, run here at once under its step lease; its result is
        returned straight away and written with whatever the workflow does next. A step
        another worker runs (another queue, a queue at its limit) ends the pass here; the run
        goes on once it finished. ``retries`` (int, 0 to 1000) allows ``retries + 1``
        attempts. After attempt *n* fails, the next is due ``min(retry_delay *
        retry_backoff ** (n - 1), retry_delay_max)`` seconds later on the database clock:
        ``retry_delay`` in seconds (float, 0 to 86 400), ``retry_backoff`` a factor (float
        ≥ 1; 1.0: every delay is ``retry_delay``), ``retry_delay_max`` in seconds (float, 0 to
        86 400; ``None``: one day). No jitter: the delays are the same on every run. These
        are recorded with the step on first reach. ``timeout`` (seconds > 0; ``None``: none)
        bounds each attempt on the database clock: one running longer is failed with code
        ``STEP_TIMED_OUT`` (and retried if attempts remain) by the next worker that looks
        for due work; whatever it returns later is refused by the attempt fence. The
        ``timeout`` is recorded with the step on first reach. ``priority`` (``int``; ``None``:
        the step function's declared default, else 0) orders due steps: higher is claimed
        first, first due first within a priority. The step is claimed from ``queue``
        (``None``: its step function's), under that queue's limits. ``queue_key`` (``str``
        of 1–255 characters; ``None``: the run's ``start_workflow(queue_key=)``) is the key
        it counts under for the queue's per-key limits (``key_concurrency``, ``key_rate``)
        and round-robin order; recorded with the step on first reach.

        Raises:
            WorkflowStepFailedError: the step failed on its last attempt.
            ValueError: bad arguments, a step name used twice in one run, or a step recorded
                with another step function (the workflow changed under a running run).
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        check_json(data, f"Data of step {step_name!r}", using=self._pass.run._state.db)
        if queue is not None:
            queue = check_name(queue, "A queue name", max_length=MAX_QUEUE_LENGTH)
        declared = step_declaration(function_name)
        options = StepOptions(
            retries=retries,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
            timeout=timeout,
            queue=declared.queue if queue is None else queue,
            priority=declared.priority if priority is None else priority,
            queue_key=queue_key,
        )
        return self._pass.step(step_name, function_name, data, options)

    def parallel(
        self,
        calls: Sequence[tuple[str, str, Any]],
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        priority: int | None = None,
    ) -> list[Any]:
        """Run several steps at once: ``calls`` is a sequence of ``(step_name, function_name,
        data)``; returns their results, in the order of ``calls``.

        The first pass that reaches it schedules every step of ``calls`` not recorded yet in
        one write (any number: an insert statement per 500 steps); any workers claim and run them
        concurrently, each under its own lease and attempt fence like any step. The pass
        ends here until all have finished. ``retries``, ``retry_delay`` (seconds),
        ``retry_backoff`` (a factor ≥ 1) and ``retry_delay_max`` (seconds or ``None``) apply
        to each step, as for :meth:`step`, and so do ``priority`` and each step function's
        queue.

        Raises:
            WorkflowStepFailedError: a step failed on its last attempt (the first in the
                order of ``calls``), as soon as a pass sees it.
            ValueError: bad arguments, a name used twice, or a step recorded with another
                step function.
        """
        checked = []
        for index, call in enumerate(calls):
            if not isinstance(call, tuple | list) or len(call) != 3:
                raise ValueError(
                    f"run.parallel: call {index} must be (step_name, function_name, data), "
                    f"not {call!r}"
                )
            step_name, function_name, data = call
            check_identifier(step_name, "Step name")
            check_identifier(function_name, "Step function name")
            check_json(data, f"Data of step {step_name!r}", using=self._pass.run._state.db)
            checked.append((step_name, function_name, data))
        options = StepOptions(
            retries=retries,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
            priority=0 if priority is None else priority,
        )
        return self._pass.parallel(checked, options, priority)

    def child(
        self,
        name: str,
        workflow: str,
        input: Any = None,
        *,
        deadline: float | timedelta | None = None,
    ) -> Any:
        """Start a child run of ``workflow`` with JSON ``input`` (on the first pass that
        reaches wait ``name``) and return its output once it completed.

        The child is an ordinary run (``parent`` is this run; it has its own passes, steps
        and waits, on any workers); the pass ends here until it finishes, and its end asks
        this run for a pass. Cancelling this run cancels the child (and its children).
        ``deadline`` (seconds > 0 or a ``timedelta``, from the child's start on the database
        clock): the child not finished by then fails with ``WorkflowDeadlineExceeded``
        (and this run's ``run.child`` raises ``WorkflowChildFailedError``). The child's
        deadline is the earlier of its own and this run's; without one of its own it has
        this run's.

        Raises:
            WorkflowChildFailedError: the child failed or was cancelled (catchable).
            UnknownWorkflowError: no workflow ``workflow`` is registered (nothing started).
            ValueError: bad arguments, a name used twice, a name recorded as another kind of
                wait, or a child recorded as a run of another workflow.
        """
        check_identifier(name, "Wait name")
        check_identifier(workflow, "Workflow name")
        check_json(input, f"Input of child run {name!r}", using=self._pass.run._state.db)
        limit = check_deadline(deadline, f"Deadline of child run {name!r}")
        return self._pass.child(name, workflow, input, limit)

    def sleep(self, name: str, seconds: float | timedelta) -> None:
        """A durable timer: the run sleeps ``seconds`` (a number ≥ 0 or a ``timedelta``)
        from the first pass that reaches wait ``name``, on the database clock.

        The end is recorded then (database now + ``seconds``) and never recomputed on
        replay; the pass ends here and the run's next pass is due at that time. No worker
        thread sleeps, and a long sleep costs one row. Returns ``None`` once the time has
        passed.

        Raises:
            ValueError: a bad name, negative or non-finite seconds, a name used twice in
                one run, or a name recorded as another kind of wait.
        """
        check_identifier(name, "Wait name")
        delay = wait_seconds(seconds, f"Seconds of sleep {name!r}")
        self._pass.sleep(name, delay)

    def patched(self, name: str) -> bool:
        """Whether this run takes the new path at patch ``name``: ``if run.patched("x"):``
        guards code changed under running runs (see "Changing workflows that are running"
        in the docs).

        ``True`` when the run reaches this point with the patch in its code: a run started
        on the new code, or an old run that had not got this far. ``False`` when the run had
        already gone past this point before the patch existed — it recorded steps or waits
        that this pass has not replayed yet — so it keeps the old path it recorded. The
        answer is recorded on first reach (a row of the run's steps, status ``patch``) and
        every later pass of the run gets the same answer, wherever it stands; asking again
        in the same pass (in a loop, say) returns it too. A patch ``name`` (``str``, 1–200
        characters) is not a step or wait name: those of the run must differ from it.

        Raises:
            ValueError: a bad name, or a name the run uses for a step or wait (nothing is
                written).
        """
        check_identifier(name, "Patch name")
        return self._pass.patched(name)

    def wait_for_event(self, name: str, *, timeout: float | timedelta | None = None) -> Any:
        """Wait for event ``name`` (sent with ``send_event(run_id, name, payload)``, the
        ``workflow_runs send-event`` command, the admin, or a ``SendEvent`` webhook
        handler); returns its JSON payload.

        An event sent before the run got here was kept and is returned at once. Otherwise
        the pass ends here; the event's arrival asks for the next pass. ``timeout`` (seconds
        ≥ 0 or a ``timedelta``; ``None``: wait for ever) is counted from the first pass
        that reaches the wait, on the database clock.

        Raises:
            WorkflowEventTimeout: ``timeout`` passed first (catchable; every later replay
                raises it again: the outcome is recorded).
            ValueError: a bad name or timeout, a name used twice in one run, or a name
                recorded as another kind of wait.
        """
        check_identifier(name, "Event name")
        limit = None if timeout is None else wait_seconds(timeout, f"Timeout of event {name!r}")
        return self._pass.wait_for_event(name, limit)


# -- the driver ---------------------------------------------------------------------------------


class RunDriver:
    """Runs one run's passes on the calling thread under one hold of its run lease: a pass,
    the steps it runs inline, and the next pass when one starts over (after a step failed).

    Args:
        run_id: the run (``uuid.UUID`` or its text).
        using: database alias (default: the router's choice for ``WorkflowRun``).
        step_lease_ttl: seconds of the step lease a step is claimed under to run inline;
            ``None``: steps are created for the queue and the pass ends at the first.
        keep_going: while it answers true, steps are claimed and run here; once false (the
            worker is stopping) a new step is created for the queue and the pass ends.
        picked: the pass claim that picked the run (its state spares the first pass a read;
            its run lease is held from there). ``None``: the lease is acquired here.
        chain: a completion also picks the next due run with its lease, for the caller to
            drive next (:attr:`next_pass`).
        queues: the queues whose steps this thread may claim (a worker's ``--queue``
            names; empty: every queue). A step of another queue is created for its workers.

    Should this thread die, nothing is lost: the step's lease lapses, the pass becomes due
    again, and other workers take them over by the ordinary rules.
    """

    def __init__(
        self,
        run_id: uuid.UUID | str,
        *,
        using: str | None = None,
        step_lease_ttl: float | None = None,
        keep_going: Callable[[], bool] = lambda: True,
        picked: PassClaim | None = None,
        chain: bool = False,
        queues: Sequence[str] = (),
    ) -> None:
        self.run_id = run_id
        self.queues = tuple(queues)
        self.alias = using or router.db_for_write(WorkflowRun)
        self.step_lease_ttl = step_lease_ttl
        self.keep_going = keep_going
        self.picked = picked
        self.chain = chain
        self.lease_ttl = run_lease_ttl()
        #: The next due run a completion picked with its lease (with ``chain``).
        self.next_pass: PassClaim | None = None
        self.held = HeldLease(
            run_lease_key(run_id),
            self.lease_ttl,
            holder=None if picked is None or picked.lease is None else picked.lease.holder,
            using=self.alias,
            release_vouches=True,
        )
        self._current: _Pass | None = None
        self._completions = 0

    def drive(self, carrying: StepRun | None = None) -> str:
        """Run the run's passes until it waits, ends, or the worker stops. ``carrying``: a
        step of the run this worker claimed from its queue and ran, whose result the first
        pass carries (written with its next write); without the run lease it is written on
        its own and the run asked for a pass.

        Returns the last pass's outcome (``"waiting"``, ``"completed"``, ``"failed"``,
        ``"suspended"``, ``"not-running"``, ``"superseded"``: a write's fence refused it), or
        ``"lease-taken"`` when the run lease was taken or lost (another pass is then asked
        for about a second later; the run never fails for it).

        Raises:
            DatabaseError: a statement of the library's own failed (the unit of work ends;
                the run lease is released and the run asked for a pass first, when the
                database still answers).
        """
        picked, held = self.picked, self.held
        if carrying is not None and (picked is None or picked.lease is None):
            return _record(carrying).outcome
        try:
            if picked is not None and picked.lease_refused:
                raise LeaseTakenError(held.key)
            if picked is not None and picked.lease is not None:
                held.adopt(picked.lease, picked.sent)
            else:
                held.acquire()
        except (LeaseTakenError, LeaseLostError) as exc:
            return self._pass_later(exc)
        try:
            outcome = self._passes(None if picked is None else picked.state, carrying)
        except _Interrupted as stop:
            return self._interrupted(stop)
        except BaseException:
            held.finish(vouch=False)
            raise
        try:
            held.finish(vouch=True)
        except LeaseLostError as exc:
            return self._pass_later(exc)
        return outcome

    def unmet_steps(self) -> frozenset[str]:
        """The names of the steps the run had recorded that its last pass did not meet (the
        workflow took another path: its code changed, or it is not deterministic); empty
        before a pass, or after one a fault interrupted."""
        this = self._current
        if this is None:
            return frozenset()
        return frozenset(
            name
            for name, step in this.steps.items()
            if name not in this.seen and step.status != StepStatus.PATCH
        )

    def _passes(self, state: PassState | None, carrying: StepRun | None) -> str:
        runs = WorkflowRun.objects.db_manager(self.alias)
        if carrying is not None and not _storable(carrying):
            # Not JSON: the attempt's failure, written now; the pass starts from there.
            recorded = _record(carrying, hold_pass_seconds=self.lease_ttl)
            if recorded.state is None:
                return recorded.outcome
            state, carrying = recorded.state, None
        if carrying is not None:
            # A step claimed from its queue (a parallel branch, a step another pass left due)
            # whose result this pass carries: said as an inline step's is, before its write.
            claim = carrying.claim
            logger.info(
                "Run %s: step %r attempt %d succeeded", claim.run_id, claim.step_name, claim.attempt
            )
        while True:
            self.held_check()
            if state is None:
                try:
                    state = runs.pass_state(self.run_id)
                except _DATABASE_FAULTS as exc:
                    raise _Interrupted(exc) from exc
            if state is None or state.run.status != RunStatus.RUNNING:
                if carrying is not None:
                    _record(carrying)
                return "not-running"
            try:
                func = get_workflow(state.run.workflow)
            except UnknownWorkflowError as exc:
                logger.error("Run %s suspended: %s", self.run_id, exc)
                if carrying is not None:
                    _record(carrying)
                runs.suspend(self.run_id, {"code": WORKFLOW_NOT_FOUND, "message": str(exc)})
                return "suspended"
            this = self._current = _Pass(self, state, carrying)
            carrying = None
            try:
                with tracing.span("django_leases.pass", **{"workflow.run_id": self.run_id}) as span:
                    span.set("workflow.name", state.run.workflow)
                    outcome = self._one(this, func)
                    span.set("workflow.outcome", outcome)
                return outcome
            except _StartOver as over:
                state = over.state

    def _one(self, this: _Pass, func: Callable[..., Any]) -> str:
        """Call the workflow function once, as pass ``this``, and write how it ended."""
        runs = WorkflowRun.objects.db_manager(self.alias)
        run_id = this.run.id
        try:
            try:
                output = func(RunContext(this), this.run.input)
            except _PassEnded as ended:
                if not ended.written:
                    this.write(
                        lambda pending: runs.finish_pass(
                            run_id, this._requests(), this.next_due, this.branches, pending=pending
                        )
                    )
                return "waiting"
            except (_StartOver, _Interrupted, KeyboardInterrupt):
                raise
            except _Quietly as quiet:
                return quiet.outcome
            except WorkflowStepFailedError as exc:
                logger.warning("Run %s failed: %s", run_id, exc)
                error = {
                    "code": STEP_FAILED,
                    "message": str(exc),
                    "step_name": exc.step_name,
                    "step_error": exc.error,
                }
                this.write(lambda pending: runs.fail(run_id, error, pending=pending))
                return "failed"
            except BaseException as exc:  # SystemExit and the like from workflow code too
                error = error_json(exc)
                if "code" in error:  # the exception's own ``code`` (e.g. SystemExit's status)
                    error["exception_code"] = error.pop("code")
                failed = this.write(
                    lambda pending: runs.fail(
                        run_id, {"code": WORKFLOW_ERROR, **error}, pending=pending
                    )
                )
                if not failed:
                    # Cancelled (or otherwise ended) while this pass ran: what it raised — a
                    # refused child start, say — is not the workflow failing.
                    logger.info("Run %s: no longer running; its pass ended (%s)", run_id, exc)
                    return "not-running"
                logger.warning("Run %s failed: its workflow raised", run_id, exc_info=exc)
                return "failed"
            return self._complete(this, output)
        except _Quietly as quiet:
            return quiet.outcome
        finally:
            this.discard()  # a step transaction no write carried: rolled back

    def _complete(self, this: _Pass, output: Any) -> str:
        """The workflow returned ``output``: complete the run. With a carried result, where
        both are JSON, the result, the completion and the release of the run lease are one
        write (a completion that also picks the next due pass with ``chain``)."""
        runs = WorkflowRun.objects.db_manager(self.alias)
        pending = this.pending
        try:
            check_json(output, "Workflow output", using=self.alias)
        except ValueError:
            pending = None  # the run fails (as complete() says), with the result written
        if pending is None:
            completed = this.write(
                lambda carried: runs.complete(this.run.id, output, pending=carried)
            )
            return "completed" if completed else "failed"
        store = WorkflowStep.objects.db_manager(self.alias)
        claim = pending.claim

        def write(_: PendingResult | None) -> Any:
            # A retry (the first try's reply was lost: it may have committed, picking a run
            # nobody would drive) picks nothing: that run is picked again once its lease
            # lapses.
            self._completions += 1
            first = self._completions == 1
            done = store.set_result_completing_run(
                claim.step_id,
                pending.result,
                claim.attempt,
                output=output,
                lease=self.held.lease,
                next_pass_holder=new_holder()
                if self.chain and first and self.keep_going()
                else None,
                next_pass_ttl=self.lease_ttl,
            )
            if pending.transaction is not None and not done.written:
                # Its transaction must not commit without its result: rolled back.
                raise TransactionManagementError("the step's result was not written")
            return done

        done = this.write(write)
        if done.next_pass is not None:
            self.next_pass = done.next_pass
        if done.written:
            if done.lease_live is not None:
                self.held.released_elsewhere(done.lease_live)
            # A run no longer running was not completed: "failed", as a pass would say.
            return "completed" if done.completed else "failed"
        # Refused: a repeat of a write whose reply was lost, or the attempt superseded (the
        # ordinary write says which, and logs a refusal).
        if runs.filter(pk=this.run.id, status=RunStatus.COMPLETED).exists():
            self.held.released_elsewhere(True)
            return "completed"
        return _record(pending).outcome

    # -- helpers the pass calls ----------------------------------------------------------------

    def held_check(self) -> None:
        """Raise :class:`_Interrupted` once the run lease is seen lost."""
        try:
            self.held.check()
        except LeaseLostError as exc:
            raise _Interrupted(exc) from exc

    def _interrupted(self, stop: _Interrupted) -> str:
        """The unit of work ends: a carried result is written on its own (its run asked for
        a pass), the run lease released and, the run lease being lost, another pass asked for
        a second later; a database error is raised again for the worker to back off."""
        this, self._current = self._current, None
        if this is not None and this.pending is not None:
            # Else its step lease lapses and another attempt runs the step.
            with contextlib.suppress(*_DATABASE_FAULTS):
                _record(this.pending)
        self.held.finish(vouch=False)
        if isinstance(stop.error, LeaseLostError):
            return self._pass_later(stop.error)
        # The next pass is due now, not once the run lease would have lapsed.
        with contextlib.suppress(*_DATABASE_FAULTS):
            WorkflowRun.objects.db_manager(self.alias).request_pass(self.run_id)
        raise stop.error

    def _pass_later(self, exc: LeaseTakenError | LeaseLostError) -> str:
        """The run lease was taken, or lost: ask for another pass :data:`PASS_RETRY_DELAY`
        seconds later (never failing the run); returns ``"lease-taken"``."""
        if isinstance(exc, LeaseTakenError):
            logger.info(
                "Run %s: its lease is taken; another pass in %.0f s", self.run_id, PASS_RETRY_DELAY
            )
        else:
            logger.warning("Run %s: its lease was lost; another pass follows", self.run_id)
        WorkflowRun.objects.db_manager(self.alias).request_pass(self.run_id, PASS_RETRY_DELAY)
        return "lease-taken"


def record_alone(
    ran: StepRun,
    output_of: Callable[[Any, Any], Any],
    *,
    chain: bool = False,
    next_step: tuple[float, Sequence[str] | None] | None = None,
) -> tuple[str, PassClaim | Claim | None]:
    """Record the result of step ``ran`` — the only step of its run, whose workflow then
    returns ``output_of(run_id, result)`` (:func:`~django_leases.workflows.registry.
    one_step_workflow`: a task's) — with the run's completion in one write that takes the run
    lease only for that instant: no pass, no replay. Where that write does not land (the
    fence refused it, or the result or output is not JSON) the result goes the ordinary way
    (:func:`record_step`); where a pass holds the run lease, the result is written and the
    run's pass asked for. ``chain``: the completion also picks the next due run with its
    lease; ``next_step`` (``(step lease TTL in seconds, queues or None)``, instead): it
    claims the next due step of those queues (neither when it is tried again after a lost
    reply). Returns the outcome (``"completed"``, ``"failed"`` for a run no longer running,
    ``"succeeded"`` when a pass was asked for, or what :func:`record_step` says) and the
    picked run's pass claim or the claimed step (or ``None``)."""
    claim = ran.claim
    try:
        output = output_of(claim.run_id, ran.result)
        check_json(ran.result, "Step result", using=claim.using)
        check_json(output, "Workflow output", using=claim.using)
    except ValueError:  # not JSON: the ordinary write says so
        return _record(ran).outcome, None
    store = WorkflowStep.objects.db_manager(claim.using)
    tries = 0

    def write() -> Any:
        nonlocal tries
        tries += 1
        return store.set_result_completing_run(
            claim.step_id,
            ran.result,
            claim.attempt,
            output=output,
            lease=None,
            lease_holder=new_holder(),
            next_pass_holder=new_holder() if chain and tries == 1 else None,
            next_pass_ttl=run_lease_ttl(),
            next_step_ttl=next_step[0] if next_step and tries == 1 else None,
            next_step_queues=next_step[1] if next_step else None,
        )

    done = retrying(ran, write)
    claimed = done.next_step
    if claimed is not None:
        # The step claimed by the write is this thread's from now on, while the receivers
        # of what the write did (user code) run: its lease is renewed meanwhile.
        claimed = held_while(claimed, done.notify)
    following = done.next_pass if done.next_pass is not None else claimed
    if not done.written:
        return _record(ran).outcome, following
    if done.pass_asked:
        return StepStatus.SUCCEEDED.value, following
    # A run no longer running was not completed: "failed", as a pass would say.
    return ("completed" if done.completed else "failed"), following


def run_pass(run_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Run one orchestration pass of run ``run_id`` under the run lease ``workflow-run:<id>``,
    creating the step it reaches for any worker (not running it here).

    Returns what happened: ``"waiting"`` (a step is not finished yet), ``"completed"``,
    ``"failed"``, ``"suspended"`` (the workflow is not registered here: code
    ``WORKFLOW_NOT_FOUND``), ``"not-running"`` or ``"lease-taken"`` (the run lease was taken
    or lost: another pass follows about a second later; the run never fails for it).
    """
    return RunDriver(run_id, using=using).drive()


__all__ = [
    "PASS_RETRY_DELAY",
    "PassCalls",
    "RunContext",
    "RunDriver",
    "record_alone",
    "run_lease_ttl",
    "run_pass",
]
