"""Step execution under fenced step leases (DESIGN §5), and starting runs.

A claimed step (:class:`~django_leases.workflows.values.Claim`) is executed in two parts:
:func:`run_step_function` calls its ``@step_function`` outside any transaction while its step
lease is renewed every TTL/3 (each renewal fenced to the attempt), and :func:`record_step`
writes what came of it — the result or the error, fenced to the attempt — reconnecting and
trying again after a connection error for as long as the step lease is vouched for.
:func:`execute_step` does both. Orchestration passes (the replay of a ``@workflow``) are
:mod:`django_leases.workflows.driver`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections, router

from django_leases import db, tracing
from django_leases.exceptions import (
    LeaseLostError,
    WorkflowStepCancelledError,
    WorkflowStepSupersededError,
)
from django_leases.fencing import Fence, step_fence
from django_leases.frozen import frozen
from django_leases.models import WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.renewal import UNKNOWN, Renewed, Unknown, renewer
from django_leases.validation import check_queue_key
from django_leases.workflows import aio

# Re-exported: the conformance suite patches the lookup on this module.
from django_leases.workflows.registry import get_step_function as get_step_function
from django_leases.workflows.registry import get_workflow, step_declaration
from django_leases.workflows.transactional import (
    CutShort,
    OpenTransaction,
    begin,
    run_in_transaction,
)
from django_leases.workflows.values import Claim, PassState

logger = logging.getLogger("django_leases.workflows")

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: First pause before a fenced write that lost its connection is tried again, seconds.
WRITE_RETRY_BACKOFF = 0.1
#: Longest pause between two tries of such a write, seconds.
WRITE_RETRY_MAX_BACKOFF = 2.0


# -- starting -----------------------------------------------------------------------------------


def start_workflow(
    name: str,
    input: Any = None,
    *,
    key: str | None = None,
    using: str | None = None,
    run_after: float | timedelta | datetime | None = None,
    deadline: float | timedelta | None = None,
    debounce_key: str | None = None,
    debounce: float | timedelta | None = None,
    tags: dict[str, str] | None = None,
    queue_key: str | None = None,
) -> uuid.UUID:
    """Create a run of workflow ``name`` with JSON ``input`` and its first pass, atomically.

    Safe inside an outer ``transaction.atomic()`` (the webhook view records the delivery and
    starts the run in one transaction): the run is picked by a worker once that commits.
    ``key`` (a ``str`` of at most 255 characters) makes the start idempotent: the same key
    for the same workflow returns the existing run's id and creates nothing, also when
    several processes start it at once (a unique constraint decides). ``using`` is a
    database alias (default: the router's choice).

    Args:
        queue_key: the key the run's steps count under for a queue's per-key limits
            (``key_concurrency``, ``key_rate``) and round-robin order — a ``str`` of 1 to 255
            characters, ``None`` for none; ``run.step(..., queue_key=)`` overrides it per
            step.
        tags: ``dict[str, str]`` of at most 16 tags, names of 1 to 64 characters, values of
            at most 255, stored as ``WorkflowRun.tags`` and found with
            ``WorkflowRun.objects.tagged(tags)`` (a start that finds its key's run returns
            it with the tags it has; a debounced start replaces the pending run's).
        run_after: a delayed start — seconds ≥ 0 (a number or a ``timedelta``, counted on
            the database clock) or a ``datetime`` (aware while ``USE_TZ`` is on): the first
            pass is not due before then.
        deadline: seconds > 0 (a number or a ``timedelta``) from the start, on the database
            clock: a run not finished by then is failed with error type
            :class:`~django_leases.exceptions.WorkflowDeadlineExceeded`, its live child runs
            cancelled and a step attempt still running superseded (its late write refused).
        debounce_key: a debounced start's key — a ``str`` (1–255 characters), given with
            ``debounce`` (both or neither), not with ``key`` or ``run_after``. At most one
            **pending** run (no pass has run yet) per workflow and debounce key: a start
            while one is pending replaces its input (and deadline), moves its first pass to
            DB now + ``debounce`` and returns its id; otherwise a new pending run is created
            the same way. Concurrent starts make one run.
        debounce: the debounce window, seconds > 0 (a number or a ``timedelta``).

    Returns the run id (``uuid.UUID``).

    Raises:
        UnknownWorkflowError: no workflow of that name is registered.
        ValueError: ``name`` is not a ``str``, ``input`` is not JSON-serialisable, a bad
            key, or a bad or unmatched timing option (negative, NaN, a naive ``datetime``
            while ``USE_TZ`` is on, ``debounce`` without ``debounce_key``…), bad tags or a
            bad queue key; nothing written.
    """
    get_workflow(name)
    check_queue_key(queue_key)
    alias = using or router.db_for_write(WorkflowRun)
    return (
        WorkflowRun.objects.db_manager(alias)
        .start(
            name,
            input,
            key=key,
            run_after=run_after,
            deadline=deadline,
            debounce_key=debounce_key,
            debounce=debounce,
            tags=tags,
            queue_key=queue_key,
        )
        .id
    )


def send_event(
    run_id: uuid.UUID | str, name: str, payload: Any = None, *, using: str | None = None
) -> None:
    """Send event ``name`` with JSON ``payload`` to run ``run_id``, for its
    ``run.wait_for_event(name)``: delivered exactly once, with the run's wake-up, in one
    transaction (joining the caller's, if any). An event sent before the run reaches the
    wait is kept until it does. ``using``: database alias (default: the router's choice).

    Raises:
        WorkflowRun.DoesNotExist: no such run (nothing written).
        WorkflowRunStateError: the run is completed, failed or cancelled (nothing written).
        WorkflowEventRefusedError: the wait already has its event, timed out, or is
            another kind of wait (nothing written).
        ValueError: a bad run id or name, or a payload that is not JSON or is larger than
            ``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]`` bytes of JSON (nothing written).
        ImproperlyConfigured: ``MAX_EVENT_PAYLOAD`` is not an ``int`` ≥ 1.
    """
    alias = using or router.db_for_write(WorkflowWait)
    WorkflowWait.objects.db_manager(alias).send_event(run_id, name, payload)


# -- starting from async code ----------------------------------------------------------------
#
# Both run their sync form through ``sync_to_async(thread_sensitive=True)``, as Django's own
# async ORM methods do: in an async view that is the request's one sync thread (Django's ASGI
# handler gives each request one), so the call shares that thread's connection, which Django
# closes (or keeps, per CONN_MAX_AGE) when the request ends; in a ``TestCase`` it is the
# test's thread, inside the test transaction. ``thread_sensitive=False`` would run it on a
# pool thread with a connection of its own that nothing closes (Django keeps connections per
# thread and closes them at request boundaries only on the request's thread), outside any
# transaction of the caller.


def _coroutine_form(function: Callable[_P, _T], doc: str) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """``function`` as a coroutine function named ``a<its name>`` with docstring ``doc``:
    each call runs ``function`` through ``sync_to_async(thread_sensitive=True)`` with the
    same arguments and returns (or raises) what it did. Its signature is ``function``'s
    (``inspect.signature`` follows ``__wrapped__``), so the two never drift apart."""

    @functools.wraps(function)
    async def coroutine(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)

    coroutine.__name__ = coroutine.__qualname__ = f"a{function.__name__}"
    coroutine.__doc__ = doc
    return coroutine


astart_workflow = _coroutine_form(
    start_workflow,
    """The coroutine form of :func:`start_workflow`, for async views and other async code:
    same arguments, return value (the run id, ``uuid.UUID``) and errors.

    It runs ``start_workflow`` through ``sync_to_async(thread_sensitive=True)``, on the
    caller's sync thread and connection: in an async view, the request's sync thread; under
    ``async_to_sync``, the calling thread, inside its open transaction if any.
    """,
)

asend_event = _coroutine_form(
    send_event,
    """The coroutine form of :func:`send_event`: same arguments and errors; returns ``None``
    once the event is delivered (committed, unless the caller's sync thread has a transaction
    open), and raises what ``send_event`` raises (nothing written then). Runs ``send_event``
    through ``sync_to_async(thread_sensitive=True)``.
    """,
)


# -- steps --------------------------------------------------------------------------------------


def _on_own_connection(call: Callable[[], None]) -> None:
    """Run ``call`` on a short-lived thread, so on a database connection of its own (in
    autocommit), and re-raise what it raised; the thread's connections are closed."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed back to the caller's thread
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="dl-step-progress", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


class StepContext:
    """What a ``@step_function`` gets as ``ctx``.

    Attributes:
        run_id: the run's ``uuid.UUID``; step_name, function_name: ``str``;
        attempt: the attempt this execution is (``int`` ≥ 1) — use it with ``run_id`` and
            ``step_name`` as an idempotency key for side effects;
        lease_lost: a :class:`threading.Event` set once the step lease is seen lost (the
            attempt may have been superseded; nothing this attempt returns will land then);
        started_at: when this attempt started (an aware ``datetime``, database clock), or
            ``None`` where the claim did not read it back;
        run_created_at: when the run was created (database clock), or ``None`` likewise.
        using: the alias of the database the run is on (``str``): where a worker's
            ``--database`` or ``start_workflow(using=)`` put it, which need not be the
            router's choice.
        transactional: ``True`` when the step function was declared
            ``@step_function(..., transactional=True)``: this call runs inside a transaction
            on the run's database that also records its result
            (:mod:`django_leases.workflows.transactional`).
        idempotency_key: a ``str`` (a UUID's text, 36 characters) that is the same for every
            attempt of this step of this run and differs between steps and runs: send it
            with outbound calls (Stripe's ``Idempotency-Key`` header, say) so that a second
            attempt is recognised by the service instead of done twice.
        fence: this attempt's :class:`~django_leases.fencing.Fence`, for writes to the
            application's own rows that a superseded attempt must not make
            (``FencedQuerySet.fenced_update(ctx.fence, ...)``). Its ``token`` (an ``int``)
            is the attempt number above the epoch floor of the server that granted the
            claim: the attempt itself on a database that never failed over, and after an
            asynchronous PostgreSQL promotion above every token of the old timeline — send
            it to an outside service's compare-and-set to fence a side effect there.

    ``set_progress(value)`` keeps JSON ``value`` as the step's progress (shown on the run's
    admin page), fenced to this attempt.
    """

    def __init__(
        self, claim: Claim, lease_lost: threading.Event, *, transactional: bool = False
    ) -> None:
        self.run_id = claim.run_id
        self.step_name = claim.step_name
        self.function_name = claim.function_name
        self.attempt = claim.attempt
        self.lease_lost = lease_lost
        self.started_at = claim.started_at
        self.run_created_at = claim.run_created_at
        self.using = claim.using
        self.transactional = transactional
        # Whether a transactional step's transaction is the outermost one on its connection
        # (made right after this, outside any atomic block): not nested in a caller's.
        self._transaction_outermost = transactional and not connections[claim.using].in_atomic_block
        self._key = f"workflow-step:{claim.step_id}"
        self._claim = claim

    # Made on first use: most steps read neither, and a step is the hot path.
    @functools.cached_property
    def idempotency_key(self) -> str:
        """The same for every attempt of this step of this run (see the class's doc)."""
        return str(uuid.uuid5(self._claim.run_id, self._claim.step_name))

    @functools.cached_property
    def fence(self) -> Fence:
        """This attempt's :class:`~django_leases.fencing.Fence` (see the class's doc)."""
        claim = self._claim
        return step_fence(claim.step_id, claim.attempt, using=claim.using, floor=claim.fence_floor)

    def set_progress(self, value: Any) -> None:
        """Keep JSON ``value`` (e.g. ``{"done": 40, "of": 100}``) as the step's
        ``progress``: one fenced write (``WorkflowStep.objects.set_progress``), shown on the
        run's page. Call it as often as the work deserves; each call is a round trip.

        Raises:
            WorkflowStepSupersededError: this attempt was superseded (another worker runs
                the step now) or its run was cancelled; nothing was written, and nothing
                this attempt returns will land either: stop.
            ValueError: ``value`` is not JSON the database stores.
        """
        claim = self._claim

        def write() -> None:
            WorkflowStep.objects.db_manager(claim.using).set_progress(
                claim.step_id, value, claim.attempt
            )

        connection = connections[claim.using]
        if (
            self._transaction_outermost
            and connection.vendor != "sqlite"
            and connection.in_atomic_block
        ):
            # Inside a transactional step's own transaction (or an atomic block the step opened
            # in it), an UPDATE of the step row would hold its lock until the step commits:
            # the lease's renewals, a cancel, a takeover would wait, and nobody would see the
            # progress. Write it on a connection of its own, committed at once. (SQLite has
            # one writer: its transaction holds the whole database anyway. Nested in an outer
            # transaction — drive() in a TestCase — the write joins it, as every write there
            # does.)
            _on_own_connection(write)
        else:
            write()

    def check(self) -> None:
        """Raise :class:`LeaseLostError` once the step lease is seen lost; else ``None``."""
        if self.lease_lost.is_set():
            raise LeaseLostError(self._key)


@dataclass
class StepRun:
    """What came of calling a claimed step's function (:func:`run_step_function`).

    Attributes:
        claim: the claim it ran under.
        renewal: the step lease's renewal (stopped; its ``deadline`` bounds the retries of the
            write), or ``None`` when no function was called.
        result: the function's return value (when it returned).
        failure: the exception it raised (``None`` when it returned).
        missing: no step function of that name is registered in this process.
        recorded: what a transactional step's own transaction wrote (its result, or
            ``"superseded"``: nothing), else ``None``.
        transaction: a transactional step's transaction, still open, its result not
            written yet (:func:`run_step_function` with ``carry``), else ``None``.
    """

    claim: Claim
    renewal: Renewed | None
    result: Any = None
    failure: BaseException | None = None
    missing: bool = False
    recorded: StepRecorded | None = None
    transaction: OpenTransaction | None = None

    @property
    def succeeded(self) -> bool:
        """The function returned and its result is to be written (not a transactional
        step's: that is written in the step's own transaction, :attr:`recorded`)."""
        return not self.missing and self.failure is None and self.recorded is None


@frozen
class StepRecorded:
    """What :func:`record_step` wrote.

    Attributes:
        outcome: ``"succeeded"``, ``"failed"``, ``"suspended"`` (the step function is missing
            here: the run is suspended) or ``"superseded"`` (nothing written).
        state: with ``hold_pass_seconds``, the run and its steps as the write left them, for
            the pass the caller runs next (``None`` otherwise, or when the run is not running).
        pass_requested: the write asked the run for its next pass (with
            ``hold_pass_seconds``: taken for the caller, who runs it); ``False`` for a
            parallel step that was not the last of its siblings to finish, or a run no
            longer running (nothing for the caller to run).
    """

    outcome: str
    state: PassState | None = None
    pass_requested: bool = True


def refresh_step_leases(
    alias: str, items: Sequence[tuple[tuple[int, int], float]]
) -> list[tuple[int, int] | Unknown | None]:
    """The :class:`~django_leases.renewal.BatchRefresh` of step leases: for ``((step_id,
    attempt), ttl seconds)`` pairs, ``WorkflowStep.objects.refresh_leases`` on ``alias`` (one
    fenced statement); each item back while its attempt still holds the step, ``None`` once
    not, :data:`~django_leases.renewal.UNKNOWN` while its row is locked elsewhere."""
    store = WorkflowStep.objects.db_manager(alias)
    held = store.refresh_leases([(step_id, attempt, ttl) for (step_id, attempt), ttl in items])
    return [
        UNKNOWN if still is UNKNOWN else item if still else None
        for (item, _ttl), still in zip(items, held, strict=True)
    ]


def step_lease_renewal(claim: Claim) -> Renewed:
    """The renewal of ``claim``'s step lease (a :class:`~django_leases.renewal.Renewed`, not
    started): every TTL/3 from ``claim.claimed_at``, fenced to ``claim.attempt``
    (:meth:`~django_leases.models.workflow.WorkflowStepQuerySet.refresh_leases`), by the
    renewer of the claim's database alias, with every other lease the process holds there:
    one statement per tick for all the step leases due. Most steps end before their first
    renewal is due, and cost a registration only."""
    return renewer(claim.using).lease(
        f"workflow-step:{claim.step_id}:{claim.attempt}",
        claim.lease_ttl,
        item=(claim.step_id, claim.attempt),
        refresh=refresh_step_leases,
        held_since=claim.claimed_at,
    )


def held_while(claim: Claim, work: Callable[[], object]) -> Claim | None:
    """Do ``work`` (user code, e.g. signal receivers) while ``claim``'s step lease is
    renewed; return the claim with its ``claimed_at`` moved to the last renewal (so the
    step's own renewal counts from there), or ``None`` when a renewal found the attempt
    superseded (another worker took it over: nothing of it is the caller's any more)."""
    held = step_lease_renewal(claim).start()
    try:
        work()
    finally:
        held.stop()
    if held.lost.is_set():
        logger.warning(
            "Run %s: step %r attempt %d was taken over before it started",
            claim.run_id,
            claim.step_name,
            claim.attempt,
        )
        return None
    since = held.deadline - claim.lease_ttl
    return claim if since <= claim.claimed_at else dataclasses.replace(claim, claimed_at=since)


def run_step_function(
    claim: Claim, *, hold_pass_seconds: float | None = None, carry: bool = False
) -> StepRun:
    """Call the claimed step's ``@step_function`` with its data under its step lease, renewed
    every TTL/3 by the alias's :class:`~django_leases.renewal.Renewer` (fenced to
    ``claim.attempt``: :func:`step_lease_renewal`). The function runs outside
    any transaction; what it returned or raised is returned, nothing is written. A step
    function that is not registered here is reported (``missing``) without a call.

    A transactional step function (``@step_function(..., transactional=True)``) runs inside
    a transaction that also writes its result, fenced
    (:func:`~django_leases.workflows.transactional.run_in_transaction`;
    ``hold_pass_seconds``: as :func:`record_step` takes it): :attr:`StepRun.recorded` says
    what was written. With ``carry`` (the pass that runs it writes its result with the
    workflow's next action) a transactional step function that returns JSON leaves its
    transaction open, nothing written yet: :attr:`StepRun.transaction`, which the caller
    commits or rolls back on this thread.

    Raises:
        DatabaseError: a transactional step's transaction was cut short by a statement of
            the library's own (its attempt given back:
            :func:`~django_leases.workflows.transactional.cut_short`); the unit of work
            ends. What the function itself raises is returned as the attempt's failure.
    """
    func = get_step_function(claim.function_name)
    if func is None:
        return StepRun(claim, None, missing=True)
    renewal = step_lease_renewal(claim)
    ran = StepRun(claim, renewal)
    attributes = {
        "workflow.run_id": claim.run_id,
        "workflow.step": claim.step_name,
        "workflow.function": claim.function_name,
        "workflow.attempt": claim.attempt,
    }
    with tracing.span("django_leases.step", **attributes) as span:
        transactional = step_declaration(claim.function_name).transactional
        ctx = StepContext(claim, renewal.lost, transactional=transactional)
        renewal.start()
        try:
            if transactional and carry:
                ran.result, ran.transaction = begin(claim, lambda: func(claim.data, ctx))
            elif transactional:
                ran.result, ran.recorded = _transacted(claim, func, ctx, hold_pass_seconds)
            else:
                # An ``async def`` one is awaited on this thread's event loop (workflows/aio.py).
                ran.result = aio.call_step_function(func, claim.data, ctx)
        except KeyboardInterrupt:
            raise
        except CutShort as cut:  # the library's own database error: the unit of work ends
            raise cut.error from None
        except BaseException as exc:  # SystemExit, GeneratorExit…: this attempt's failure
            ran.failure = exc
        finally:
            renewal.stop()
        span.set("workflow.outcome", "failed" if ran.failure is not None else "returned")
    if ran.failure is not None:
        logger.warning(
            "Step %r of run %s (attempt %d) raised: %s",
            claim.step_name,
            claim.run_id,
            claim.attempt,
            ran.failure,
            exc_info=ran.failure,
        )
    return ran


def _transacted(
    claim: Claim, func: Callable[..., Any], ctx: StepContext, hold: float | None
) -> tuple[Any, StepRecorded | None]:
    """A transactional step's call and result write (one transaction): its result and what
    was recorded (``None``: nothing; the ordinary write records the outcome)."""
    done = run_in_transaction(claim, lambda: func(claim.data, ctx), hold_pass_seconds=hold)
    if done.superseded is not None:
        superseded(claim, done.superseded)
        return done.result, StepRecorded("superseded")
    wrote = done.written
    if wrote is None:
        return done.result, None
    return done.result, StepRecorded(wrote.status, wrote.state, pass_requested=wrote.pass_requested)


def record_step(ran: StepRun, *, hold_pass_seconds: float | None = None) -> StepRecorded:
    """Write what came of a step on its own, fenced to its attempt: the result
    (``set_result``), the error (``set_error``), or, for a missing step function, the run's
    suspension with code ``STEP_FUNCTION_NOT_FOUND``. The run is asked for a pass.

    ``hold_pass_seconds`` (seconds, the run lease's TTL): the caller runs the run's next pass
    itself; the write takes that pass for it instead of making it due for every worker, and
    returns the run's state for it.

    A write that loses its connection is tried again on a fresh one until the step lease's
    local deadline (:func:`retrying`). A :class:`WorkflowStepSupersededError` ends it
    quietly: a warning is logged, nothing is written, and ``"superseded"`` is returned; so
    does a step whose row is gone (its run deleted, by retention say).

    A transactional step's outcome, written in its own transaction (:attr:`StepRun.recorded`),
    is returned as it is: nothing more is written.
    """
    if ran.recorded is not None:
        return ran.recorded
    claim = ran.claim
    store = WorkflowStep.objects.db_manager(claim.using)
    try:
        if ran.missing:
            store.suspend_for_missing_function(claim.step_id, claim.attempt, claim.function_name)
            logger.error(
                "Run %s suspended: step %r needs step function %r, which is not registered",
                claim.run_id,
                claim.step_name,
                claim.function_name,
            )
            return StepRecorded("suspended")
        if ran.failure is None:

            def write_result() -> StepRecorded:
                wrote = store.set_result(
                    claim.step_id, ran.result, claim.attempt, hold_pass_seconds=hold_pass_seconds
                )
                return StepRecorded(wrote.status, wrote.state, pass_requested=wrote.pass_requested)

            return retrying(ran, write_result)
        failure = ran.failure

        def write_error() -> StepRecorded:
            wrote = store.set_error(
                claim.step_id, failure, claim.attempt, hold_pass_seconds=hold_pass_seconds
            )
            return StepRecorded(wrote.status, wrote.state)

        return retrying(ran, write_error)
    except WorkflowStepSupersededError as exc:
        superseded(claim, exc)
        return StepRecorded("superseded")
    except WorkflowStep.DoesNotExist:
        # The step's row is gone: its run was deleted (retention pruned a cancelled run
        # whose step was still running here). Nothing is left to write to.
        logger.warning(
            "Run %s: step %r attempt %d finished after its run was deleted; its outcome is dropped",
            claim.run_id,
            claim.step_name,
            claim.attempt,
        )
        return StepRecorded("superseded")


def execute_step(claim: Claim, *, hold_pass_seconds: float | None = None) -> str:
    """Run the claimed step's function under its step lease and record the outcome, fenced
    (:func:`run_step_function`, then :func:`record_step`). Returns ``"succeeded"``,
    ``"failed"``, ``"suspended"`` (the step function is not registered here: the run is
    suspended with code ``STEP_FUNCTION_NOT_FOUND``) or ``"superseded"``; never raises
    :class:`WorkflowStepSupersededError`. ``hold_pass_seconds``: see :func:`record_step`."""
    ran = run_step_function(claim, hold_pass_seconds=hold_pass_seconds)
    return record_step(ran, hold_pass_seconds=hold_pass_seconds).outcome


def retrying(ran: StepRun, write: Callable[[], _T]) -> _T:
    """Run the write ``write`` fenced to step ``ran``'s attempt, reconnecting and trying
    again after a connection error until the step lease's local deadline has passed; past it
    the error is raised (the lease lapses and another attempt runs the step). Trying it again
    is safe: the fence refuses a superseded attempt, and a write whose first try committed is
    recognised as recorded. Returns what ``write`` returned."""
    claim = ran.claim
    deadline = ran.renewal.deadline if ran.renewal is not None else time.monotonic()
    backoff = WRITE_RETRY_BACKOFF
    tries = 0
    while True:
        tries += 1
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            if deadline - time.monotonic() <= backoff:
                logger.error(
                    "Step %r of run %s (attempt %d): its outcome could not be written "
                    "within the step lease (%d tries): %s",
                    claim.step_name,
                    claim.run_id,
                    claim.attempt,
                    tries,
                    exc,
                )
                raise
            logger.warning(
                "Step %r of run %s (attempt %d): writing its outcome failed (%s); "
                "reconnecting and trying again in %.1f s",
                claim.step_name,
                claim.run_id,
                claim.attempt,
                exc,
                backoff,
            )
            db.close_thread_connections()
            time.sleep(backoff)
            backoff = min(backoff * 2, WRITE_RETRY_MAX_BACKOFF)


def superseded(claim: Claim, exc: WorkflowStepSupersededError) -> None:
    """Log that ``claim``'s attempt was superseded (or stopped by a cancel): its outcome
    was discarded."""
    if isinstance(exc, WorkflowStepCancelledError):
        why = "was stopped: its run was cancelled"
    else:
        why = f"was superseded (current attempt {exc.current_attempt})"
    logger.warning(
        "Step %r of run %s: attempt %d %s; its outcome was discarded",
        claim.step_name,
        claim.run_id,
        claim.attempt,
        why,
    )


__all__ = [
    "StepContext",
    "StepRecorded",
    "StepRun",
    "asend_event",
    "astart_workflow",
    "execute_step",
    "held_while",
    "record_step",
    "retrying",
    "run_step_function",
    "send_event",
    "start_workflow",
    "superseded",
]
