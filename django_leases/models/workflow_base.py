"""What the workflow QuerySets share (:mod:`django_leases.models.workflow` composes them):
the fence rule (:func:`fence_q`), the worker's hot statements as PL/pgSQL functions
(:func:`functions`) and the fallback when one is missing (:func:`call_function`), the decoding
of their rows, the rule that a finished step asks its run for a pass
(:func:`request_passes`, :func:`finish_branch`), and the signals a write owes.

The modules below :mod:`~django_leases.models.workflow` reach the three workflow models
through :data:`run_model`, :data:`step_model` and :data:`attempt_model` (Django's app
registry), never by importing the module that defines them (and imports them).
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.apps import apps
from django.db import DatabaseError, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Subquery
from django.db.models.expressions import Expression, RawSQL

from django_leases import clock, db, signals
from django_leases.clock import DbNow
from django_leases.conf import QueueLimits, queue_limits
from django_leases.exceptions import WorkflowRunStateError
from django_leases.models.lease import (
    PG_EPOCH_FLOOR,
    Lease,
    acquire_statement,
    announce,
    epoch_floor_sql,
    grant_sql,
    release_held_statement,
    released_grant_sql,
)
from django_leases.models.queue import WorkflowQueue, WorkflowQueueKey
from django_leases.models.recorded import defer_decoding
from django_leases.signals import lease_acquired
from django_leases.validation import parse_run_id, ttl_seconds
from django_leases.workflows import sql
from django_leases.workflows.channel import notify_work_due
from django_leases.workflows.functions import Pieces, catalogue
from django_leases.workflows.values import (
    Claim,
    PassClaim,
    PassState,
    RunStatus,
    StepOptions,
    StepStatus,
    status_said,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_leases.models.tags import WorkflowRunTag
    from django_leases.models.wait import WorkflowWait
    from django_leases.models.workflow import WorkflowRun, WorkflowStep, WorkflowStepAttempt

logger = logging.getLogger("django_leases.workflows")


def refused_in_state(run_id: uuid.UUID, status: str, verb: str, rule: str) -> WorkflowRunStateError:
    """:class:`WorkflowRunStateError` for a run (or step) whose ``status`` does not allow what
    was asked: ``verb`` and ``rule`` as the caller's ``gettext`` gives them, the status said
    by its label (:func:`~django_leases.workflows.values.status_said`), so an operator reads
    the refusal in the active language."""
    return WorkflowRunStateError(run_id, status, verb, rule, said=status_said(status))


def _registered(model_name: str) -> Callable[[], Any]:
    """A function of no arguments that returns this app's model ``model_name`` (``str``)
    from Django's app registry, looked up on the first call and kept."""
    return functools.cache(lambda: apps.get_model("django_leases", model_name))


#: ``WorkflowRun``, ``WorkflowStep``, ``WorkflowStepAttempt``, ``WorkflowRunTag`` and
#: ``WorkflowWait``, each from Django's app registry (see the module's docstring).
run_model: Callable[[], type[WorkflowRun]] = _registered("WorkflowRun")
step_model: Callable[[], type[WorkflowStep]] = _registered("WorkflowStep")
attempt_model: Callable[[], type[WorkflowStepAttempt]] = _registered("WorkflowStepAttempt")
tag_model: Callable[[], type[WorkflowRunTag]] = _registered("WorkflowRunTag")
wait_model: Callable[[], type[WorkflowWait]] = _registered("WorkflowWait")


#: The latest migration that installs the :func:`functions` (a test checks it holds exactly
#: their definitions).
FUNCTIONS_MIGRATION = "0045_named_claim_functions"


def fence_q(step_id: int | Expression, attempt: int | Expression) -> Q:
    """The fence rule, in one place: the step row, only while ``attempt`` is its **running**
    attempt. Every write a claim makes after the claim (result, error, suspension, lease
    renewal or release) goes through it — as an ORM filter, or compiled into a tuned
    statement (:func:`fence_sql`) — so a superseded attempt, a finished one, or one stopped
    by a cancel matches no row. Lease expiry is deliberately not part of it."""
    return Q(pk=step_id, attempt=attempt, status=StepStatus.RUNNING)


def slot_kept_q() -> Q:
    """The steps whose lease may be extended as far as their queue's limits go: any step of
    a queue without limits (``DJANGO_LEASES["QUEUES"]``), a step of a limited one only while
    its lease is live on the database clock. A lapsed lease holds no slot of its queue,
    which may have admitted another step in its place: brought back to life, it would put
    the queue over its limits, so its worker is told it lost the lease instead (the step is
    taken over as a new attempt once the queue admits it; a result its worker writes
    meanwhile still lands, by the fence). In a queue without limits a slow worker nobody
    replaced keeps its attempt and may renew."""
    limited = sorted(name for name, limits in queue_limits().items() if limits.limited)
    if not limited:
        return Q()
    return Q(lease_expires_at__gt=DbNow()) | ~Q(queue__in=limited)


def renewal_q(step_id: int | Expression, attempt: int | Expression) -> Q:
    """The rule a step lease's renewal lands by: :func:`fence_q` and :func:`slot_kept_q`."""
    return fence_q(step_id, attempt) & slot_kept_q()


def fence_sql(
    alias: str, step_id: int | Expression, attempt: int | Expression, *, renewal: bool = False
) -> tuple[str, list[Any]]:
    """:func:`fence_q` (``renewal``: :func:`renewal_q`) compiled into SQL for ``alias``'s
    database (values or SQL expressions: a function's arguments)."""
    rule = renewal_q if renewal else fence_q
    rows = step_model()._default_manager.using(alias).filter(rule(step_id, attempt))
    compiler = rows.query.get_compiler(using=alias)
    where, params = compiler.compile(rows.query.where)
    return where, list(params)


def workflow_tables(connection: BaseDatabaseWrapper) -> sql.Tables:
    """The run, step, attempt and lease tables' quoted names on ``connection``, for the
    tuned statements of :mod:`django_leases.workflows.sql`."""
    quote = connection.ops.quote_name
    return sql.Tables(
        run=quote(run_model()._meta.db_table),
        step=quote(step_model()._meta.db_table),
        attempt=quote(attempt_model()._meta.db_table),
        lease=quote(Lease._meta.db_table),
        queue=quote(WorkflowQueue._meta.db_table),
        queue_key=quote(WorkflowQueueKey._meta.db_table),
        floor=PG_EPOCH_FLOOR,
    )


def _acquire(connection: BaseDatabaseWrapper) -> Callable[[str], str]:
    table = connection.ops.quote_name(Lease._meta.db_table)
    return lambda rows: acquire_statement(connection, table, rows)


def _release(connection: BaseDatabaseWrapper) -> Callable[[str], str]:
    table = connection.ops.quote_name(Lease._meta.db_table)
    return lambda where: release_held_statement(table, where)


def functions(connection: BaseDatabaseWrapper) -> dict[str, sql.Function]:
    """The worker's hot statements as PL/pgSQL functions for ``connection``'s database
    (PostgreSQL), by short name (:func:`django_leases.workflows.functions.catalogue`, given
    the fence and lease rules written here and in :mod:`~django_leases.models.lease`)."""
    lease_table = connection.ops.quote_name(Lease._meta.db_table)

    def fence(step_id: str, attempt: str) -> tuple[str, list[Any]]:
        return fence_sql(connection.alias, RawSQL(step_id, ()), RawSQL(attempt, ()))

    def acquire_released(rows: str) -> str:
        return acquire_statement(connection, lease_table, rows, released=True)

    pieces = Pieces(
        tables=workflow_tables(connection),
        fence=fence,
        acquire=_acquire(connection),
        acquire_released=acquire_released,
        release=_release(connection),
        grant=grant_sql(connection),
        released=released_grant_sql(connection),
    )
    return catalogue(pieces)


_calls: dict[tuple[str, str], str] = {}


#: The functions whose row ends in a claim: their call reads the server's epoch floor in the
#: same statement, one column after the function's (:attr:`Claim.fence_floor`).
CLAIMING_FUNCTIONS = frozenset(
    {
        "claim_queue",
        "claim_queue_counted",
        "claim_queue_keyed",
        "claim_step",
        "claim_step_except",
        "complete_run_alone_claiming",
        "insert_claimed",
        "set_result_claiming_next",
    }
)


#: Aliases on which a function of this code's was found missing (for the life of the
#: process): their workers take the portable path from then on.
without_functions: set[str] = set()


class FunctionsGone(Exception):
    """A function call found its function missing: the method runs again, portably."""


def functions_called(connection: BaseDatabaseWrapper) -> bool:
    """Whether the tuned path's functions are called on ``connection``: the tuned path is on
    (PostgreSQL), and none of them was found missing in this process."""
    return db.tuned(connection, "postgresql") and connection.alias not in without_functions


def call_function(connection: BaseDatabaseWrapper, short: str, args: Sequence[Any]) -> Any:
    """Call function ``short`` with ``args`` on ``connection`` and return its one row (or
    ``None``). A function that does not exist (dropped, or of another version than this
    code's: a rolling deploy ran a newer release's migrations) is not an error of the unit of
    work: the alias goes portable for the rest of the process, a warning says so once, and
    :class:`FunctionsGone` has the method run again the portable way (the call is the
    method's first write). Inside a transaction (a transactional step's, whose result is
    written in it) the call is made in a savepoint, so the failed call leaves that
    transaction as it was and the method runs again in it."""
    key = (connection.alias, short)
    call = _calls.get(key)
    if call is None:
        then = (epoch_floor_sql(connection) or "0") if short in CLAIMING_FUNCTIONS else ""
        call = _calls[key] = functions(connection)[short].call(then=then)
    inside = not db.outside_transactions(connection)
    try:
        with (
            transaction.atomic(using=connection.alias) if inside else nullcontext(),
            db.cursor(connection) as cursor,
        ):
            return cursor.execute(call, args).fetchone()
    except DatabaseError as exc:
        db.functions_gone(
            exc,
            connection.alias,
            without_functions,
            f"Database %(alias)r lacks the workflow function {functions(connection)[short].name} "
            "of this version (%(error)s): this process takes the portable path from now on (a "
            "statement or a few more per unit of work). Run 'manage.py migrate' where this "
            "version is deployed.",
        )
        raise FunctionsGone(short) from exc


_R = TypeVar("_R")


_P = ParamSpec("_P")


def falls_back(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``method`` again when a function it called was missing (:func:`call_function`): the
    second time, on the portable path."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except FunctionsGone:
            return method(*args, **kwargs)

    return wrapper


def lease_is_live() -> ExpressionWrapper[Q]:
    """``lease_expires_at > now`` on the database clock."""
    return ExpressionWrapper(Q(lease_expires_at__gt=DbNow()), output_field=BooleanField())


def due_q() -> Q:
    """``available_at`` unset or passed, on the database clock."""
    return Q(available_at__isnull=True) | Q(available_at__lte=DbNow())


def is_due() -> ExpressionWrapper[Q]:
    """:func:`due_q` as a boolean column (to annotate a step with whether it is due now)."""
    return ExpressionWrapper(due_q(), output_field=BooleanField())


class Owed:
    """The signals a write owes, sent once, by the first call."""

    def __init__(self, send: Callable[[], None]) -> None:
        self._send: Callable[[], None] | None = send

    def __call__(self) -> None:
        send, self._send = self._send, None
        if send is not None:
            send()


def claims_in_one(
    connection: BaseDatabaseWrapper, limits: Mapping[str, QueueLimits], taken: Sequence[str]
) -> bool:
    """Whether a claim of a due step of queues ``taken`` (empty: every queue) is the tuned
    one statement: PostgreSQL, and no queue of ``limits`` it may take has limits."""
    if not functions_called(connection):
        return False
    limited = {name for name, queue in limits.items() if queue.limited}
    return not (limited & set(taken or limits))


def claim_from_row(alias: str, row: Any, ttl: float, sent: float) -> tuple[bool, Claim | None]:
    """``(lapsed, claim)`` from the columns of :func:`sql.claim_step_ctes` (see
    :meth:`WorkflowStepQuerySet._claim_unlimited`); ``sent``: ``time.monotonic()`` before
    the statement was sent. A claim's ``step_attempt_started`` is sent once it commits."""
    if row[0]:
        return True, None
    if row[1] is None:
        return False, None
    step_id, run_id, step_name, function_name, attempt, data, waited = row[1:8]
    # The epoch floor follows the claim's columns (CLAIMING_FUNCTIONS).
    floor = row[len(sql.CLAIM_STEP_TYPES)]
    claim = Claim(
        step_id=step_id,
        run_id=parse_run_id(run_id),
        step_name=step_name,
        function_name=function_name,
        attempt=attempt,
        data=json.loads(data),
        lease_ttl=ttl,
        claimed_at=sent,
        using=alias,
        run_created_at=row[8],
        started_at=row[9],
        run_workflow=row[10],
        fence_floor=int(floor),
    )
    attempt_started(claim, waited)
    return False, claim


def claim_of_step(
    alias: str,
    step: Any,
    ttl: float,
    sent: float,
    *,
    attempt: int,
    fence_floor: int,
    run_workflow: str | None = None,
) -> Claim:
    """The :class:`Claim` of ``attempt`` (an ``int`` ≥ 1) of ``step`` (a ``WorkflowStep``
    row: its id, run, names and data) on ``alias``, under a ``ttl``-second lease, the claim
    sent at ``sent`` (``time.monotonic()``) and granted on a server whose epoch floor was
    ``fence_floor``; ``run_workflow``: the run's workflow name, where the claim read it."""
    return Claim(
        step_id=step.pk,
        run_id=step.run_id,
        step_name=step.step_name,
        function_name=step.function_name,
        attempt=attempt,
        data=step.data,
        lease_ttl=ttl,
        claimed_at=sent,
        using=alias,
        run_workflow=run_workflow,
        fence_floor=fence_floor,
    )


def pass_state_from_row(alias: str, row: Any) -> PassState:
    """The :class:`PassState` from the columns of :func:`sql.pass_state`."""
    run = run_model()(
        id=parse_run_id(row[0]),
        workflow=row[1],
        status=row[2],
        input=json.loads(row[3]),
        pass_requests=row[4],
    )
    run._state.adding = False
    run._state.db = alias
    steps = {}
    for values in json.loads(row[5]):
        text = values.pop("result")  # JSON text: decoded when the workflow reads it
        step = step_model()(run_id=run.id, **values)
        defer_decoding(step, "result", text)
        step._state.adding = False
        step._state.db = alias
        steps[step.step_name] = step
    return PassState(run=run, steps=steps)


def with_result(state: PassState, step_id: int, stored: Any) -> None:
    """Step ``step_id`` of ``state`` as succeeded with the ``stored`` result: a statement
    that wrote it read the steps in its snapshot, before its own write."""
    for step in state.steps.values():
        if step.pk == step_id:
            step.status = StepStatus.SUCCEEDED
            step.result = stored
            step.error = None


def pass_claim(
    alias: str, row: Any, holder: str, sent: float, connection: BaseDatabaseWrapper
) -> PassClaim:
    """The :class:`PassClaim` from a row of :func:`sql.pick_pass`'s columns."""
    width = len(sql.PASS_STATE_TYPES)
    state = pass_state_from_row(alias, row[:width])
    lease = None
    if row[width] is not None:
        lease = Lease.objects.db_manager(alias).from_returned(connection, row[width:])
        announce(lease_acquired, lease, alias)
    return PassClaim(
        run_id=state.run.id,
        using=alias,
        state=state,
        lease=lease,
        lease_refused=lease is None,
        sent=sent,
    )


def wake_workers(alias: str) -> None:
    """Tell idle workers that work is due now (inside the transaction that made it due)."""
    notify_work_due(alias)


def run_reached(alias: str, run_id: uuid.UUID | str, status: str, **details: Any) -> None:
    """Send the signal of a run that reached ``status`` (once its transaction commits)."""
    signal = signals.RUN_STATUS_SIGNALS[status]
    try:
        pk = parse_run_id(run_id)
    except ValueError:  # not a run's lease: nothing to tell
        return
    db.after_commit(
        lambda: signal.send_robust(sender=run_model(), run_id=pk, using=alias, **details), alias
    )


def attempt_started(claim: Claim, waited: float | None = 0.0) -> Claim:
    """Say a claim started an attempt, once the transaction open on its database commits (at
    once outside one; never if it rolls back: a claim carried by a write that never commits
    started nothing). ``waited``: seconds the step was due before it (on the database clock;
    ``None`` for a lapsed lease taken over). Returns ``claim``."""
    db.after_commit(
        lambda: signals.step_attempt_started.send_robust(
            sender=step_model(),
            step_id=claim.step_id,
            run_id=claim.run_id,
            step_name=claim.step_name,
            attempt=claim.attempt,
            waited=waited,
            using=claim.using,
        ),
        claim.using,
    )
    return claim


def attempt_finished(
    alias: str, step_id: int, attempt: int, status: str, run_id: uuid.UUID | None = None
) -> None:
    """Send ``step_attempt_finished`` for attempt ``attempt`` of step ``step_id`` with
    ``status`` once the transaction open on ``alias`` commits (never if it rolls back)."""
    db.after_commit(
        lambda: signals.step_attempt_finished.send_robust(
            sender=step_model(),
            step_id=step_id,
            run_id=run_id,
            attempt=attempt,
            status=status,
            using=alias,
        ),
        alias,
    )


def finish_attempt(alias: str, step_id: int, attempt: int, history: Mapping[str, Any]) -> None:
    """Write ``history`` (the ``status`` of attempt ``attempt`` of step ``step_id``, and its
    ``error`` where it failed) on the attempt's row, ``finished_at`` set, and send
    :func:`attempt_finished` with that status: inside the caller's transaction, once the
    outcome went through the step's fence."""
    attempt_model()._default_manager.using(alias).filter(step_id=step_id, attempt=attempt).update(
        **history, finished_at=DbNow()
    )
    attempt_finished(alias, step_id, attempt, history["status"])


def lock_running(alias: str, run_id: uuid.UUID | str) -> bool:
    """Lock run ``run_id`` if it is ``running`` (inside the caller's transaction); whether
    it is."""
    running = run_model()._default_manager.using(alias).filter(pk=run_id, status=RunStatus.RUNNING)
    return db.for_update(running, alias).values_list("pk", flat=True).first() is not None


def lock_runs(alias: str, runs: Any, *fields: str) -> list[tuple[Any, ...]]:
    """Lock ``runs`` (a QuerySet of runs) inside the caller's transaction, oldest first: the
    order every writer locking several runs keeps (children before their parent, as a
    finishing child wakes it: a cancel, a fork, a resume, a prune). Returns their ``fields``
    (default: the id), in that order."""
    ordered = runs.order_by("created_at", "id")
    return list(db.for_update(ordered, alias).values_list(*(fields or ("pk",))))


def wake_parent(alias: str, run_id: uuid.UUID | str) -> None:
    """Ask the parent of run ``run_id`` (a child started by ``run.child``) for a pass now,
    inside the caller's transaction: the child just finished."""
    parent = run_model()._default_manager.using(alias).filter(pk=run_id).values("parent_id")
    request_passes(alias, Q(pk__in=parent))


def request_passes(alias: str, where: Q, delay: float = 0.0, *, hold: float | None = None) -> int:
    """Ask every running run matching ``where`` for a pass ``delay`` seconds from DB now.

    Runs inside the caller's transaction (the methods that finish a step use it so the
    step's outcome and the run's wake-up commit together). ``hold`` (seconds): the caller
    runs the pass itself straight away, so the pass is taken for it as
    :meth:`WorkflowRunQuerySet.claim_due_pass` takes one — due only ``hold`` seconds from
    DB now (when another worker picks it should the caller die) — and nobody is woken.
    Any count of parallel steps left (``branches_left``) is dropped: the pass counts again.
    """
    if hold is not None:
        delay = ttl_seconds(hold)
    requested = (
        run_model()
        ._default_manager.using(alias)
        .filter(where, status=RunStatus.RUNNING)
        .update(
            pass_due_at=clock.db_now_plus(delay) if delay else DbNow(),
            pass_requests=F("pass_requests") + 1,
            branches_left=0,
            updated_at=DbNow(),
        )
    )
    if requested and not delay:
        wake_workers(alias)  # due now (work due later is found by polling)
    return requested


def finish_branch(alias: str, step_id: int, hold: float | None = None) -> bool:
    """The portable path of the rule that a step's result asks its run for a pass, inside
    the caller's transaction (after the fenced write of step ``step_id``): every result
    raises ``pass_requests``; while the run's last pass waits on more than one unfinished
    parallel step (``branches_left`` > 1) the result only counts one off and asks for
    nothing, else it asks as :func:`request_passes` does (``hold`` seconds: taken for the
    caller) and the count is 0. Returns ``True`` when it asked (a running run).

    Race-free without a prior lock: each ``UPDATE``'s condition on ``branches_left`` is
    checked on the row version it locks (PostgreSQL re-checks it on the latest version after
    waiting for a concurrent finish; MySQL/MariaDB read the latest committed version for an
    ``UPDATE``; SQLite writes one at a time), never on an earlier snapshot (so the run is
    found by its id, never through a subquery over its own table). Should the count
    move between the two statements (a concurrent finish), they are tried again. A
    sequential step (count 0) costs the one ``UPDATE`` it always did."""
    delay = 0.0 if hold is None else ttl_seconds(hold)
    # The run by its id, not through a join: a condition inside a subquery over the run
    # table would be judged on the statement's snapshot, not on the locked row.
    run_id = step_model()._default_manager.using(alias).filter(pk=step_id).values("run_id")[:1]
    runs = (
        run_model()
        ._default_manager.using(alias)
        .filter(pk=Subquery(run_id), status=RunStatus.RUNNING)
    )
    while True:
        if runs.filter(branches_left__lte=1).update(
            pass_due_at=clock.db_now_plus(delay) if delay else DbNow(),
            pass_requests=F("pass_requests") + 1,
            branches_left=0,
            updated_at=DbNow(),
        ):
            if not delay:
                wake_workers(alias)  # due now (work due later is found by polling)
            return True
        if runs.filter(branches_left__gt=1).update(
            pass_requests=F("pass_requests") + 1,
            branches_left=F("branches_left") - 1,
            updated_at=DbNow(),
        ):
            return False
        if not runs.exists():  # not running (any more)
            return False


def in_one_statement(connection: BaseDatabaseWrapper, options: StepOptions) -> bool:
    """Whether a step with ``options`` is inserted claimed by a tuned statement here
    (:meth:`~values.StepOptions.one_statement`, on PostgreSQL with the tuned path on)."""
    if not functions_called(connection):
        return False
    limits = queue_limits().get(options.queue)
    return options.one_statement(limited=limits is not None and limits.limited)
