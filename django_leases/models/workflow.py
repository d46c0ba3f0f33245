"""Workflow runs, their steps and each step's attempts, with the rules that govern them
(DESIGN §5, reference rules F1–F10): ``WorkflowRun.objects``, ``WorkflowStep.objects``,
``WorkflowStepAttempt.objects``.

Every method opens the transaction it needs (``transaction.atomic(using=...)``), never
assuming one from its caller, and every "live / lapsed / due" decision is made on the
database clock inside the statement (``DbNow()``; see :mod:`django_leases.clock`).

The fence of a step is its ``attempt`` number (:func:`fence_q`, the rule in one place):

* a **claim** that starts a new attempt raises ``attempt`` in the same guarded ``UPDATE``
  that grants the step lease, so exactly one claimer can own an attempt;
* a result, an error or a lease renewal is one ``UPDATE`` through the fence (this attempt,
  still ``running``); when it matches nothing, the writer was **superseded** and
  :class:`~django_leases.exceptions.WorkflowStepSupersededError` is raised with nothing
  written — neither the step nor its attempt row (the history);
* lease expiry is *not* the fence: a slow worker that nobody replaced may still finish.

Where a rule has a tuned statement (PostgreSQL: :mod:`django_leases.workflows.sql`), it sits
beside the portable ORM path in the same method, behind :func:`django_leases.db.tuned`. The
worker's three hot statements run as PL/pgSQL functions that the migrations install
(:func:`functions`); with the tuned path on, they must be installed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypedDict, TypeVar

from django.db import DatabaseError, IntegrityError, connections, models, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Subquery, Value
from django.db.models.expressions import Expression, RawSQL
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases import clock, db, faults, signals
from django_leases.clock import DbNow, to_stored
from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_LENGTH, QueueLimits, queue_limits
from django_leases.exceptions import (
    WorkflowRunStateError,
    WorkflowStepCancelledError,
    WorkflowStepSupersededError,
)
from django_leases.ids import uuid7
from django_leases.models.lease import (
    Lease,
    acquire_statement,
    grant_sql,
    release_held_statement,
    released_grant_sql,
)
from django_leases.models.queue import Admission, WorkflowQueue
from django_leases.signals import lease_acquired, lease_released
from django_leases.validation import (
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_RETRY_DELAY,
    as_stored,
    check_attempt,
    check_identifier,
    check_json,
    check_lease_name,
    check_name,
    error_json,
    parse_run_id,
    seconds,
    ttl_seconds,
)
from django_leases.workflows import sql
from django_leases.workflows.channel import channel_name, notify_work_due
from django_leases.workflows.functions import Pieces, catalogue
from django_leases.workflows.values import (
    FINISHED_RUN_STATUSES,
    MAX_CLAIMANT_LENGTH,
    RUN_CANCELLED,
    RUN_LEASE_PREFIX,
    STEP_FUNCTION_NOT_FOUND,
    STEP_LEASE_LAPSED,
    STEP_RESULT_NOT_JSON,
    STEP_TIMED_OUT,
    WAITING_STEP_STATUSES,
    AttemptStatus,
    Claim,
    NextStep,
    PassClaim,
    PassState,
    PendingResult,
    RunChange,
    RunCompletion,
    RunStatus,
    StepOptions,
    StepStatus,
    StepWrite,
    nothing_owed,
    run_lease_key,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django_stubs_ext import WithAnnotations

    class _LockingAnnotations(TypedDict):
        """What :meth:`WorkflowStepQuerySet._locking` annotates a step with."""

        lease_live: bool | None  # NULL while the step has no lease
        due: bool
        run_status: str
        run_workflow: str
        db_now: datetime  # the database clock, when the step was read

    _LockedStep = WithAnnotations["WorkflowStep", _LockingAnnotations]

__all__ = [
    "FUNCTIONS_MIGRATION",
    "AttemptStatus",
    "QueueCounts",
    "RunStatus",
    "Scheduled",
    "StepStatus",
    "WorkflowRun",
    "WorkflowRunQuerySet",
    "WorkflowStep",
    "WorkflowStepAttempt",
    "WorkflowStepAttemptQuerySet",
    "WorkflowStepQuerySet",
    "fence_q",
    "functions",
    "request_passes",
    "retry_delay_after",
]

logger = logging.getLogger("django_leases.workflows")

#: The latest migration that installs the :func:`functions` (a test checks it holds exactly
#: their definitions).
FUNCTIONS_MIGRATION = "0028_workflow_functions"


# -- shared pieces ------------------------------------------------------------------------------


def fence_q(step_id: int | Expression, attempt: int | Expression) -> Q:
    """The fence rule, in one place: the step row, only while ``attempt`` is its **running**
    attempt. Every write a claim makes after the claim (result, error, suspension, lease
    renewal or release) goes through it — as an ORM filter, or compiled into a tuned
    statement (:func:`_fence_sql`) — so a superseded attempt, a finished one, or one stopped
    by a cancel matches no row. Lease expiry is deliberately not part of it."""
    return Q(pk=step_id, attempt=attempt, status=StepStatus.RUNNING)


def _fence_sql(
    alias: str, step_id: int | Expression, attempt: int | Expression
) -> tuple[str, list[Any]]:
    """:func:`fence_q` compiled into SQL for ``alias``'s database (values or SQL
    expressions: a function's arguments)."""
    rows = WorkflowStep._default_manager.using(alias).filter(fence_q(step_id, attempt))
    compiler = rows.query.get_compiler(using=alias)
    where, params = compiler.compile(rows.query.where)
    return where, list(params)


def _tables(connection: BaseDatabaseWrapper) -> sql.Tables:
    quote = connection.ops.quote_name
    return sql.Tables(
        run=quote(WorkflowRun._meta.db_table),
        step=quote(WorkflowStep._meta.db_table),
        attempt=quote(WorkflowStepAttempt._meta.db_table),
        lease=quote(Lease._meta.db_table),
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
        return _fence_sql(connection.alias, RawSQL(step_id, ()), RawSQL(attempt, ()))

    def acquire_released(rows: str) -> str:
        return acquire_statement(connection, lease_table, rows, released=True)

    pieces = Pieces(
        tables=_tables(connection),
        fence=fence,
        acquire=_acquire(connection),
        acquire_released=acquire_released,
        release=_release(connection),
        grant=grant_sql(connection),
        released=released_grant_sql(connection),
    )
    return catalogue(pieces)


_calls: dict[tuple[str, str], str] = {}

#: Aliases on which a function of this code's was found missing (for the life of the
#: process): their workers take the portable path from then on.
_without_functions: set[str] = set()

#: SQLSTATE of "function … does not exist" (undefined_function).
_UNDEFINED_FUNCTION = "42883"


class _FunctionsGone(Exception):
    """A function call found its function missing: the method runs again, portably."""


def _functions(connection: BaseDatabaseWrapper) -> bool:
    """Whether the tuned path's functions are called on ``connection``: the tuned path is on
    (PostgreSQL), and none of them was found missing in this process."""
    return db.tuned(connection, "postgresql") and connection.alias not in _without_functions


def _call_row(connection: BaseDatabaseWrapper, short: str, args: Sequence[Any]) -> Any:
    """Call function ``short`` with ``args`` on ``connection`` and return its one row (or
    ``None``). A function that does not exist (dropped, or of another version than this
    code's: a rolling deploy ran a newer release's migrations) is not an error of the unit of
    work: the alias goes portable for the rest of the process, a warning says so once, and
    :class:`_FunctionsGone` has the method run again the portable way (the call was the
    method's first statement, outside any transaction)."""
    key = (connection.alias, short)
    call = _calls.get(key)
    if call is None:
        call = _calls[key] = functions(connection)[short].call()
    try:
        with db.cursor(connection) as cursor:
            return cursor.execute(call, args).fetchone()
    except DatabaseError as exc:
        cause = exc.__cause__
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if state != _UNDEFINED_FUNCTION or connection.in_atomic_block:
            raise
        if connection.alias not in _without_functions:
            _without_functions.add(connection.alias)
            logger.warning(
                "Database %r lacks the workflow function %s of this version (%s): this "
                "process takes the portable path from now on (a statement or a few more per "
                "unit of work). Run 'manage.py migrate' where this version is deployed.",
                connection.alias,
                functions(connection)[short].name,
                exc,
            )
        raise _FunctionsGone(short) from exc


_R = TypeVar("_R")
_P = ParamSpec("_P")


def _falls_back(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``method`` again when a function it called was missing (:func:`_call_row`): the
    second time, on the portable path."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except _FunctionsGone:
            return method(*args, **kwargs)

    return wrapper


def _live() -> ExpressionWrapper[Q]:
    """``lease_expires_at > now`` on the database clock."""
    return ExpressionWrapper(Q(lease_expires_at__gt=DbNow()), output_field=BooleanField())


def _due_q() -> Q:
    """``available_at`` unset or passed, on the database clock."""
    return Q(available_at__isnull=True) | Q(available_at__lte=DbNow())


def _due() -> ExpressionWrapper[Q]:
    return ExpressionWrapper(_due_q(), output_field=BooleanField())


class _Owed:
    """The signals a write owes, sent once, by the first call."""

    def __init__(self, send: Callable[[], None]) -> None:
        self._send: Callable[[], None] | None = send

    def __call__(self) -> None:
        send, self._send = self._send, None
        if send is not None:
            send()


def _claims_in_one(
    connection: BaseDatabaseWrapper, limits: Mapping[str, QueueLimits], taken: Sequence[str]
) -> bool:
    """Whether a claim of a due step of queues ``taken`` (empty: every queue) is the tuned
    one statement: PostgreSQL, and no queue of ``limits`` it may take has limits."""
    if not _functions(connection):
        return False
    limited = {name for name, queue in limits.items() if queue.limited}
    return not (limited & set(taken or limits))


def _claim_from_row(alias: str, row: Any, ttl: float, sent: float) -> tuple[bool, Claim | None]:
    """``(lapsed, claim)`` from the columns of :func:`sql.claim_step_ctes` (see
    :meth:`WorkflowStepQuerySet._claim_unlimited`); ``sent``: ``time.monotonic()`` before
    the statement was sent. A claim's ``step_attempt_started`` is sent once it commits."""
    if row[0]:
        return True, None
    if row[1] is None:
        return False, None
    step_id, run_id, step_name, function_name, attempt, data, waited = row[1:8]
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
    )
    transaction.on_commit(lambda: _attempt_started(claim, waited), using=alias)
    return False, claim


def _pass_state_from_row(alias: str, row: Any) -> PassState:
    """The :class:`PassState` from the columns of :func:`sql.pass_state`."""
    run = WorkflowRun(
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
        step = WorkflowStep(run_id=run.id, **values)
        step._state.adding = False
        step._state.db = alias
        steps[step.step_name] = step
    return PassState(run=run, steps=steps)


def _with_result(state: PassState, step_id: int, stored: Any) -> None:
    """Step ``step_id`` of ``state`` as succeeded with the ``stored`` result: a statement
    that wrote it read the steps in its snapshot, before its own write."""
    for step in state.steps.values():
        if step.pk == step_id:
            step.status = StepStatus.SUCCEEDED
            step.result = stored
            step.error = None


def _pass_claim(
    alias: str, row: Any, holder: str, sent: float, connection: BaseDatabaseWrapper
) -> PassClaim:
    """The :class:`PassClaim` from a row of :func:`sql.pick_pass`'s columns."""
    width = len(sql.PASS_STATE_TYPES)
    state = _pass_state_from_row(alias, row[:width])
    lease = None
    if row[width] is not None:
        lease = Lease.objects.db_manager(alias).from_returned(connection, row[width:])
        lease_acquired.send_robust(sender=Lease, lease=lease)
    return PassClaim(
        run_id=state.run.id,
        using=alias,
        state=state,
        lease=lease,
        lease_refused=lease is None,
        sent=sent,
    )


def _wake(alias: str) -> None:
    """Tell idle workers that work is due now (inside the transaction that made it due)."""
    notify_work_due(alias)


def _run_reached(alias: str, run_id: uuid.UUID | str, status: str, **details: Any) -> None:
    """Send the signal of a run that reached ``status`` (once its transaction commits)."""
    signal = signals.RUN_STATUS_SIGNALS[status]
    try:
        pk = parse_run_id(run_id)
    except ValueError:  # not a run's lease: nothing to tell
        return
    transaction.on_commit(
        lambda: signal.send_robust(sender=WorkflowRun, run_id=pk, using=alias, **details),
        using=alias,
    )


def _attempt_started(claim: Claim, waited: float | None = 0.0) -> Claim:
    """Say a claim started an attempt; ``waited``: seconds the step was due before it (on the
    database clock; ``None`` for a lapsed lease taken over)."""
    signals.step_attempt_started.send_robust(
        sender=WorkflowStep,
        step_id=claim.step_id,
        run_id=claim.run_id,
        step_name=claim.step_name,
        attempt=claim.attempt,
        waited=waited,
        using=claim.using,
    )
    return claim


def _attempt_finished(
    alias: str, step_id: int, attempt: int, status: str, run_id: uuid.UUID | None = None
) -> None:
    transaction.on_commit(
        lambda: signals.step_attempt_finished.send_robust(
            sender=WorkflowStep,
            step_id=step_id,
            run_id=run_id,
            attempt=attempt,
            status=status,
            using=alias,
        ),
        using=alias,
    )


# -- runs ---------------------------------------------------------------------------------------


#: How many times :meth:`WorkflowRunQuerySet.cancel` starts over when a child appeared
#: between its scan for children and its lock on the parent.
_CANCEL_ROUNDS = 5


class _StartOver(Exception):
    """Internal: roll the cancel's transaction back and scan for children again."""


class WorkflowRunQuerySet(db.RoutedQuerySet["WorkflowRun"]):
    """Domain methods of ``WorkflowRun.objects``. Each opens whatever transaction it needs."""

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        key: str | None = None,
        parent: uuid.UUID | None = None,
    ) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` with JSON ``input``, due for its first pass.

        ``key`` (a non-empty ``str`` of at most 255 characters) makes the start idempotent:
        while a run of ``workflow`` with that key exists, that run is returned and nothing is
        written — enforced by a unique constraint on ``(workflow, key)``, so concurrent starts
        with one key create one run. ``run.started`` tells them apart: ``False`` for a run
        found by its key. ``parent``: the id of the run this one is a child of
        (``run.child``); the parent is asked for a pass when this run finishes.

        Does not check that the workflow is registered (``start_workflow`` does). Safe inside an
        outer transaction. Raises ``ValueError`` for a bad name or key, or non-JSON input.
        """
        check_identifier(workflow, "Workflow name")
        check_json(input, "Workflow input")
        if key is not None:
            check_name(key, "Run key", max_length=MAX_KEY_LENGTH)
        alias = self.write_alias()
        connection = connections[alias]
        value = {} if input is None else input
        if db.tuned(connection, "postgresql"):
            # One statement (atomic on its own, or part of the caller's transaction): the
            # run, due for its first pass, and the notification (sent when it commits); a
            # key already taken inserts nothing and notifies nobody.
            run = self.model(
                workflow=workflow,
                input=value,
                status=RunStatus.RUNNING,
                pass_requests=1,
                key=key,
                parent_id=parent,
            )
            params: list[Any] = [
                run.id,
                workflow,
                json.dumps(value),
                key,
                parent,
                channel_name(alias),
            ]
            with connection.cursor() as cursor:
                cursor.execute(sql.start_run(_tables(connection)), params)
                row = cursor.fetchone()
            if row is None:
                return self._keyed(workflow, key)
            run.created_at = run.updated_at = run.pass_due_at = row[0]
            run._state.adding = False
            run._state.db = alias
        else:
            try:
                with transaction.atomic(using=alias):
                    run = self.rows().create(
                        workflow=workflow,
                        input=value,
                        key=key,
                        parent_id=parent,
                        pass_due_at=DbNow(),
                        pass_requests=1,
                    )
                    _wake(alias)
            except IntegrityError:
                if key is None:
                    raise
                return self._keyed(workflow, key)
        run.started = True
        self._started(alias, run.id, workflow)
        return run

    def _keyed(self, workflow: str, key: str | None) -> WorkflowRun:
        """The run of ``workflow`` holding ``key`` (a start that found it), ``started=False``."""
        run = self.rows().get(workflow=workflow, key=key)
        run.started = False
        return run

    def id_for_key(self, workflow: str, key: str) -> uuid.UUID | None:
        """The id of the run of ``workflow`` started with ``key``, or ``None``."""
        found = self.rows().filter(workflow=workflow, key=key).values_list("pk", flat=True)
        return found.first()

    def start_one_step(
        self,
        workflow: str,
        input: Any,
        *,
        step_name: str,
        function_name: str,
        options: StepOptions | None = None,
        available_at: datetime | None = None,
    ) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` (JSON ``input``) together with its one step
        ``step_name`` (step function ``function_name``, data = ``input``), in one transaction
        (joining the caller's: the step is claimable once that commits). No first pass: the
        step is due at ``available_at`` (an aware ``datetime``, compared with the database
        clock by the claim; ``None``: DB now), with ``options`` (:class:`~values.StepOptions`;
        ``None``: no retries, the defaults otherwise). The run's pass comes when the step
        finishes and replays ``workflow``, which must call ``run.step(step_name,
        function_name, ...)``. Idle workers are woken when it commits. Used by the Django
        Tasks backend.

        Raises ``ValueError`` for a bad name, non-JSON input or a naive ``available_at``;
        nothing is written then.
        """
        check_identifier(workflow, "Workflow name")
        step = _check_step(
            NextStep(step_name, function_name, input, options or StepOptions(retries=0))
        )
        options = step.options
        if available_at is not None and (
            not isinstance(available_at, datetime) or available_at.tzinfo is None
        ):
            raise ValueError(f"available_at must be an aware datetime, not {available_at!r}")
        value = {} if input is None else input
        alias = self.write_alias()
        connection = connections[alias]
        if db.tuned(connection, "postgresql"):
            # One statement (atomic on its own, or part of the caller's transaction): the
            # run, its step and the notification (sent when it commits).
            run = self.model(workflow=workflow, input=value, status=RunStatus.RUNNING)
            params: list[Any] = [
                run.id,
                workflow,
                json.dumps(value),
                step_name,
                function_name,
                options.retries,
                options.retry_delay,
                options.retry_backoff,
                options.retry_delay_max,
                options.timeout,
                options.queue,
                options.priority,
                available_at,
                channel_name(alias),
            ]
            with connection.cursor() as cursor:
                cursor.execute(sql.start_one_step(_tables(connection)), params)
                (created_at, _) = cursor.fetchone()
            run.created_at = run.updated_at = created_at
            run._state.adding = False
            run._state.db = alias
            self._started(alias, run.id, workflow)
            return run
        with transaction.atomic(using=alias):
            run = self.rows().create(workflow=workflow, input=value)
            WorkflowStep.objects.db_manager(alias).rows().create(
                run=run,
                **_step_columns(step),
                available_at=DbNow() if available_at is None else to_stored(available_at, alias),
            )
            _wake(alias)
        self._started(alias, run.id, workflow)
        return run

    @staticmethod
    def _started(alias: str, run_id: uuid.UUID, workflow: str) -> None:
        """Send ``run_started`` for a run just created, once its transaction commits."""
        transaction.on_commit(
            lambda: signals.run_started.send_robust(
                sender=WorkflowRun, run_id=run_id, workflow=workflow, using=alias
            ),
            using=alias,
        )

    def request_pass(self, run_id: uuid.UUID | str, delay: float = 0.0) -> bool:
        """Mark a running run due for an orchestration pass ``delay`` seconds (≥ 0) from DB now.

        Returns ``True`` if the run is running (and now due), ``False`` otherwise.
        """
        delay = seconds(delay, "delay")
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            return bool(request_passes(alias, Q(pk=run_id), delay))

    @_falls_back
    def claim_due_pass(self, ttl: float, lease_holder: str | None = None) -> PassClaim | None:
        """Pick one running run whose pass is due (``pass_due_at <= DB now``), with its run
        lease ``workflow-run:<id>`` for ``lease_holder``; ``None`` when no pass is due.

        The pick pushes ``pass_due_at`` to DB now + ``ttl`` seconds: no other worker picks the
        run meanwhile, and if this worker dies before the pass ends, the run is picked again
        after ``ttl``. Rows are picked with ``SKIP LOCKED`` where the database has it, so
        concurrent workers pick different runs. The lease is taken by the acquire rule of
        ``Lease.objects.acquire`` (``lease_acquired`` is sent) for ``ttl`` seconds:
        ``PassClaim.lease`` is the granted lease, or ``None`` with ``lease_refused`` when
        another holder has it live (the caller asks for the pass again later, as a pass that
        finds the lease taken does). Without ``lease_holder`` no lease is taken (the caller
        takes it) and ``lease_refused`` is ``False``. ``PassClaim.state`` holds the run and
        its steps as the pick read them. Tuned (PostgreSQL, with a holder): all of it is one
        statement.
        """
        ttl = ttl_seconds(ttl)
        alias = self.write_alias()
        connection = connections[alias]
        sent = time.monotonic()
        if lease_holder is not None and _functions(connection):
            row = _call_row(connection, "pick_pass", [ttl, lease_holder])
            return None if row is None else _pass_claim(alias, row, lease_holder, sent, connection)
        return self._claim_due_pass_portably(alias, ttl, lease_holder, sent)

    def _claim_due_pass_portably(
        self,
        alias: str,
        ttl: float,
        lease_holder: str | None,
        sent: float,
        besides: uuid.UUID | None = None,
    ) -> PassClaim | None:
        """:meth:`claim_due_pass`'s portable path; ``besides``: a run never to pick (the run
        a completion just wrote, as the tuned completion's pick leaves it out)."""
        connection = connections[alias]
        with transaction.atomic(using=alias):
            due = self.rows().filter(status=RunStatus.RUNNING, pass_due_at__lte=DbNow())
            if besides is not None:
                due = due.exclude(pk=besides)
            if connection.features.has_select_for_update_skip_locked:
                due = due.select_for_update(skip_locked=True)
            run_id = due.order_by("pass_due_at").values_list("pk", flat=True).first()
            if run_id is None:
                return None
            # Guarded, so the pick stays exclusive even where the SELECT locks nothing.
            picked = (
                self.rows()
                .filter(pk=run_id, status=RunStatus.RUNNING, pass_due_at__lte=DbNow())
                .update(pass_due_at=clock.db_now_plus(ttl))
            )
            state = self.pass_state(run_id) if picked else None
        if state is None:
            return None
        lease = None
        if lease_holder is not None:
            key = run_lease_key(run_id)
            lease = Lease.objects.db_manager(alias).acquire(key, lease_holder, ttl)
        return PassClaim(
            run_id=run_id,
            using=alias,
            state=state,
            lease=lease,
            lease_refused=lease_holder is not None and lease is None,
            sent=sent,
        )

    @_falls_back
    def take_pass(self, run_id: uuid.UUID | str, ttl: float, lease_holder: str) -> PassClaim | None:
        """Take the pass of running run ``run_id`` for a worker that has just run one of its
        steps (before it writes the result, so that it can write the run's completion with
        it): the run lease ``workflow-run:<id>`` for ``lease_holder`` (``ttl`` seconds, by
        the acquire rule of ``Lease.objects.acquire``; ``lease_acquired`` is sent) and the
        pass state, read once the lease is held. ``pass_due_at`` is not touched.

        Returns the :class:`PassClaim` (``lease`` ``None`` with ``lease_refused`` when
        another holder has the lease live: the caller writes its result the ordinary way),
        or ``None`` when the run is not running (or unknown), or when its pass waits on more
        than one unfinished parallel step (``branches_left`` > 1: the result asks for no
        pass, so nothing is taken — a wide fan-out's branches read nothing here). Tuned
        (PostgreSQL): one statement.
        """
        ttl = ttl_seconds(ttl)
        alias = self.write_alias()
        connection = connections[alias]
        pk = parse_run_id(run_id)
        sent = time.monotonic()
        if _functions(connection):
            row = _call_row(connection, "take_pass", [pk, ttl, lease_holder])
            return None if row is None else _pass_claim(alias, row, lease_holder, sent, connection)
        if not self.rows().filter(pk=pk, status=RunStatus.RUNNING, branches_left__lte=1).exists():
            return None
        lease = Lease.objects.db_manager(alias).acquire(run_lease_key(pk), lease_holder, ttl)
        state = self.pass_state(pk)
        if state is None or state.run.status != RunStatus.RUNNING:
            if lease is not None:
                Lease.objects.db_manager(alias).release(lease)
            return None
        return PassClaim(
            run_id=pk,
            using=alias,
            state=state,
            lease=lease,
            lease_refused=lease is None,
            sent=sent,
        )

    def pass_state(self, run_id: uuid.UUID | str) -> PassState | None:
        """The run (``id``, ``workflow``, ``status``, ``input``, ``pass_requests``) and its
        steps by name, read in one transaction; ``None`` for an unknown run."""
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            run = (
                self.rows()
                .filter(pk=run_id)
                .only("id", "workflow", "status", "input", "pass_requests")
                .first()
            )
            if run is None:
                return None
            steps = WorkflowStep.objects.db_manager(alias).filter(run_id=run.pk).order_by("id")
            return PassState(run=run, steps={step.step_name: step for step in steps})

    def work_due_within(self, horizon: float) -> bool:
        """Whether a pass or a waiting step of a running run is due within ``horizon``
        seconds of DB now.

        Waiting steps are ``pending`` / ``scheduled`` / ``failed`` with attempts left; a
        running step counts when its attempt's ``timeout`` ends within the horizon (a lease
        lapsing is not foreseen here).
        """
        alias = self.write_alias()
        until = clock.db_now_plus(horizon)
        if self.rows().filter(status=RunStatus.RUNNING, pass_due_at__lte=until).exists():
            return True
        waiting = Q(status__in=WAITING_STEP_STATUSES, available_at__lte=until) & ~Q(
            status=StepStatus.FAILED, attempt__gte=F("retries") + 1
        )
        timing_out = Q(status=StepStatus.RUNNING, deadline_at__lte=until)  # a step timeout
        return (
            WorkflowStep.objects.db_manager(alias)
            .filter(waiting | timing_out, run__status=RunStatus.RUNNING)
            .exists()
        )

    def finish_pass(
        self,
        run_id: uuid.UUID | str,
        pass_requests: int,
        due_at: datetime | None = None,
        branches: int = 0,
        *,
        pending: PendingResult | None = None,
    ) -> bool:
        """End a pass: clear ``pass_due_at`` — or set it to ``due_at`` (a ``datetime`` from
        the database clock: when the wait the pass ended at needs the next pass, a sleep's
        end or an event's timeout) — unless the run was asked for another pass since
        ``pass_requests`` was read (that pass will see the wait again). ``branches``: the
        pass ended at a ``run.parallel`` with that many of its steps not finished (an
        ``int`` ≥ 0); only the result that finishes the last of them asks for the next pass
        (:meth:`WorkflowStepQuerySet.set_result`). ``pending``: a result the pass carries,
        written first in the same transaction (:func:`write_pending`). Returns ``True`` if
        the pass was ended.

        Raises:
            WorkflowStepSupersededError: ``pending``'s attempt was superseded (nothing
                written).
        """
        ended = self.rows().filter(pk=run_id, pass_requests=pass_requests)
        values = {"pass_due_at": due_at, "branches_left": max(int(branches), 0)}
        if pending is None:
            # One statement: atomic on its own (autocommit), no transaction around it.
            return bool(ended.update(**values))
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            return bool(ended.update(**values))

    def complete(
        self, run_id: uuid.UUID | str, output: Any, *, pending: PendingResult | None = None
    ) -> bool:
        """Mark a running run ``completed`` with JSON ``output``; ``True`` if it was running.

        A non-JSON ``output`` fails the run instead, with a clear error. ``pending``: a
        result the run's pass carries, written first in the same transaction
        (:func:`write_pending`; :class:`WorkflowStepSupersededError` when refused).
        """
        try:
            check_json(output, "Workflow output")
        except ValueError as exc:
            return self._finish(run_id, RunStatus.FAILED, error=error_json(exc), pending=pending)
        return self._finish(run_id, RunStatus.COMPLETED, output=output, pending=pending)

    def fail(
        self,
        run_id: uuid.UUID | str,
        error: BaseException | Mapping[str, Any] | str,
        *,
        pending: PendingResult | None = None,
    ) -> bool:
        """Mark a running run ``failed`` with ``error``; ``True`` if it was running.
        ``pending``: as for :meth:`complete`."""
        return self._finish(run_id, RunStatus.FAILED, error=error_json(error), pending=pending)

    def suspend(
        self, run_id: uuid.UUID | str, error: BaseException | Mapping[str, Any] | str
    ) -> bool:
        """Mark a running run ``suspended`` (waits for an operator); ``True`` if it was running."""
        return self._finish(run_id, RunStatus.SUSPENDED, error=error_json(error))

    def _finish(
        self,
        run_id: uuid.UUID | str,
        status: str,
        *,
        output: Any = None,
        error: Any = None,
        pending: PendingResult | None = None,
    ) -> bool:
        values: dict[str, Any] = {
            "status": status,
            "error": error,
            "pass_due_at": None,
            "branches_left": 0,  # no pass waits on parallel steps any more
            "updated_at": DbNow(),
        }
        if status == RunStatus.COMPLETED:
            values["output"] = Value(output, output_field=models.JSONField())
        if status in (RunStatus.COMPLETED, RunStatus.FAILED):
            values["finished_at"] = DbNow()
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            finished = bool(
                self.rows().filter(pk=run_id, status=RunStatus.RUNNING).update(**values)
            )
            if finished and status != RunStatus.SUSPENDED:
                _wake_parent(alias, run_id)
        if finished:
            details = {"output": output} if status == RunStatus.COMPLETED else {"error": error}
            _run_reached(alias, run_id, status, **details)
        return finished

    # -- operators ------------------------------------------------------------------------------
    #
    # resume / cancel / retry_step, used by the admin actions and ``manage.py workflow_runs``.
    # Each opens one transaction and locks, in this order, the run's steps (by id) and then
    # the run row: the same order as a worker's writes (a step, then its run), so an operator
    # and a worker never deadlock, and a claim or fenced write committed just before is seen.

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
        for a run that is ``running``, ``completed`` or ``cancelled`` (nothing written).
        """
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            run.require("resume")
            steps = _reopen_missing_function_steps(alias, run.pk)
            if run.status == RunStatus.FAILED:
                steps += _grant_last_attempts(alias, Q(run_id=run.pk))
            _reopen_run(alias, run.pk)
            _wake(alias)
        return RunChange(run.pk, run.status, RunStatus.RUNNING, tuple(steps))

    def cancel(self, run_id: uuid.UUID | str) -> RunChange:
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

        Returns a :class:`RunChange` (``steps``: the running steps stopped). Raises
        ``WorkflowRun.DoesNotExist`` / ``ValueError`` for an unknown or malformed id and
        :class:`WorkflowRunStateError` for a ``completed``, ``failed`` or ``cancelled`` run.
        """
        alias = self.write_alias()
        pk = parse_run_id(run_id)
        error = {"code": RUN_CANCELLED, "message": "The run was cancelled by an operator"}
        cascaded = {
            "code": RUN_CANCELLED,
            "message": f"The run was cancelled with its parent run {pk}",
        }
        # Children are locked before their parent (the order in which a finishing child
        # wakes its parent). A child that a pass started after the scan is only seen once
        # the parent is locked: locking it then would invert that order (a deadlock with
        # the child finishing), so the transaction is rolled back and the cancel starts
        # over, now finding it first. No child can be started once the parent is locked
        # (start_child locks it and needs it running), so this ends.
        for turn in range(_CANCEL_ROUNDS):
            last = turn == _CANCEL_ROUNDS - 1
            try:
                with transaction.atomic(using=alias):
                    locked = self._live_descendants(alias, pk)  # deepest first
                    for child_id in locked:
                        child = self._lock_for_operator(alias, child_id)
                        if child.status in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                            self._cancel_locked(alias, child, cascaded)
                    run = self._lock_for_operator(alias, pk)
                    run.require("cancel")
                    late = [c for c in self._live_descendants(alias, pk) if c not in locked]
                    if late and not last:
                        raise _StartOver
                    running = self._cancel_locked(alias, run, error)
                    for child_id in late:  # the last round only: lock them after all
                        child = self._lock_for_operator(alias, child_id)
                        if child.status in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                            self._cancel_locked(alias, child, cascaded)
                    _wake_parent(alias, pk)
            except _StartOver:
                continue
            return RunChange(run.pk, run.status, RunStatus.CANCELLED, tuple(running))
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

    def _cancel_locked(self, alias: str, run: WorkflowRun, error: dict[str, Any]) -> list[str]:
        """Cancel the locked ``run`` (inside the caller's transaction); the names of the
        running steps it stopped."""
        stepping = WorkflowStep.objects.db_manager(alias)
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
            status=RunStatus.CANCELLED,
            error=error,
            pass_due_at=None,
            finished_at=DbNow(),
            updated_at=DbNow(),
        )
        _run_reached(alias, run.pk, RunStatus.CANCELLED)
        return [name for _, _, name in running]

    def retry_step(self, run_id: uuid.UUID | str, step_name: str) -> RunChange:
        """Run the ``failed`` step ``step_name`` again as a new attempt, due at once.

        A step that failed on its last attempt is granted one more. A ``failed`` or
        ``suspended`` run is set running again as by :meth:`resume` (the other steps of a
        suspended run that miss their step function are made due too, or the run could
        never finish); a ``running`` run just gets its step due now (ahead of its retry
        delay).

        Returns a :class:`RunChange`. Raises ``WorkflowRun.DoesNotExist`` / ``ValueError``
        for an unknown or malformed run id, ``WorkflowStep.DoesNotExist`` for an unknown
        step, and :class:`WorkflowRunStateError` when the step is not ``failed`` or the run
        is ``completed`` or ``cancelled`` (nothing written).
        """
        check_identifier(step_name, "Step name")
        alias = self.write_alias()
        stepping = WorkflowStep.objects.db_manager(alias)
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            step = stepping.filter(run_id=run.pk, step_name=step_name).values("status").first()
            if step is None:
                raise WorkflowStep.DoesNotExist(f"Run {run.pk} has no step named {step_name!r}")
            run.require("retry")
            if step["status"] != StepStatus.FAILED:
                raise WorkflowRunStateError(
                    run.pk,
                    run.status,
                    "retried",
                    f"step {step_name!r} is {step['status']}; only a failed step can be",
                )
            others: list[str] = []
            if run.status == RunStatus.SUSPENDED:
                others = _reopen_missing_function_steps(alias, run.pk)
            _grant_last_attempts(alias, Q(run_id=run.pk, step_name=step_name))
            stepping.filter(run_id=run.pk, step_name=step_name, status=StepStatus.FAILED).update(
                available_at=DbNow(), updated_at=DbNow()
            )
            if run.status != RunStatus.RUNNING:
                _reopen_run(alias, run.pk)
            _wake(alias)
        steps = (step_name, *(name for name in others if name != step_name))
        return RunChange(run.pk, run.status, RunStatus.RUNNING, steps)

    def prune(self, older_than: float | timedelta, *, batch_size: int = 500) -> int:
        """Delete finished runs (``completed``, ``failed``, ``cancelled``) that finished more
        than ``older_than`` (seconds ≥ 0, or a ``timedelta``) before database now, with their
        steps, attempts and run leases (``workflow-run:<id>``). Returns how many runs.

        Retention, for an operator (``manage.py workflow_runs prune``): a run's lease keeps
        its row once released, so without pruning the lease table grows by one row per run.
        Running and suspended runs are never touched, nor a run whose lease is live (a
        worker still finishing with it; a later prune takes it), nor a child run
        (``run.child``) whose parent is running, suspended or failed — the parent reads the
        child's outcome when it replays (a failed one once resumed); it goes with or after
        its parent. Webhook deliveries that
        started a pruned run stay, their ``run`` emptied, so a redelivery is still known.
        Works in transactions of ``batch_size`` runs (int ≥ 1): a failure keeps every batch
        before it done and leaves its own batch whole. Raises ``ValueError`` for a bad
        ``older_than`` or ``batch_size``.
        """
        cutoff = seconds(older_than, "older_than")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int ≥ 1, not {batch_size!r}")
        alias = self.write_alias()
        runs = self.rows()
        leases = Lease.objects.db_manager(alias)
        finished = runs.filter(
            status__in=FINISHED_RUN_STATUSES, finished_at__lte=clock.db_now_plus(-cutoff)
        ).exclude(
            # A child is its parent's outcome until the parent is finished for good: one
            # running, suspended or failed (resumable) replays ``run.child`` and reads it.
            # A subquery, not a join: the locking read below locks run rows only.
            parent_id__in=runs.filter(
                status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.FAILED)
            ).values("pk")
        )
        deleted = 0
        skipped: set[uuid.UUID] = set()
        while True:
            with transaction.atomic(using=alias):
                ids = list(
                    db.for_update(finished.exclude(pk__in=skipped), alias)
                    .order_by("finished_at")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not ids:
                    return deleted
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
                deleted += len(gone)

    def _lock_for_operator(self, alias: str, run_id: uuid.UUID | str) -> WorkflowRun:
        """Lock the run's steps, then the run (inside the caller's transaction); the run."""
        pk = parse_run_id(run_id)
        steps = WorkflowStep._default_manager.using(alias).filter(run_id=pk)
        list(db.for_update(steps, alias).order_by("id").values_list("pk", flat=True))
        run = db.for_update(self.rows().filter(pk=pk), alias).first()
        if run is None:
            raise WorkflowRun.DoesNotExist(f"No workflow run with id {pk}")
        return run


def _lock_running(alias: str, run_id: uuid.UUID | str) -> bool:
    """Lock run ``run_id`` if it is ``running`` (inside the caller's transaction); whether
    it is."""
    running = WorkflowRun._default_manager.using(alias).filter(pk=run_id, status=RunStatus.RUNNING)
    return db.for_update(running, alias).values_list("pk", flat=True).first() is not None


def _reopen_missing_function_steps(alias: str, run_id: uuid.UUID) -> list[str]:
    """Make the run's steps suspended for a missing step function due again, each granted one
    extra attempt (the attempt that found no function never ran it). Returns their names."""
    steps = WorkflowStep._default_manager.using(alias).filter(
        run_id=run_id, status=StepStatus.FAILED, error__code=STEP_FUNCTION_NOT_FOUND
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("retries") + 1, available_at=DbNow(), updated_at=DbNow())
    return names


def _grant_last_attempts(alias: str, where: Q) -> list[str]:
    """Give each failed step matching ``where`` that is out of attempts one more, due now.
    Returns their names."""
    steps = WorkflowStep._default_manager.using(alias).filter(
        where, status=StepStatus.FAILED, attempt__gte=F("retries") + 1
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("attempt"), available_at=DbNow(), updated_at=DbNow())
    return names


def _reopen_run(alias: str, run_id: uuid.UUID) -> None:
    """Set the run ``running``, its error, output and end cleared, due for a pass now."""
    WorkflowRun._default_manager.using(alias).filter(pk=run_id).update(
        status=RunStatus.RUNNING,
        error=None,
        output=None,
        finished_at=None,
        pass_due_at=DbNow(),
        pass_requests=F("pass_requests") + 1,
        branches_left=0,
        updated_at=DbNow(),
    )


def _wake_parent(alias: str, run_id: uuid.UUID | str) -> None:
    """Ask the parent of run ``run_id`` (a child started by ``run.child``) for a pass now,
    inside the caller's transaction: the child just finished."""
    parent = WorkflowRun._default_manager.using(alias).filter(pk=run_id).values("parent_id")
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
        WorkflowRun._default_manager.using(alias)
        .filter(where, status=RunStatus.RUNNING)
        .update(
            pass_due_at=clock.db_now_plus(delay) if delay else DbNow(),
            pass_requests=F("pass_requests") + 1,
            branches_left=0,
            updated_at=DbNow(),
        )
    )
    if requested and not delay:
        _wake(alias)  # due now (work due later is found by polling)
    return requested


def _queue_admits(
    alias: str, queue: str, refused: set[str] | None
) -> tuple[bool, Admission | None]:
    """Whether a claim of a step of ``queue`` may start, and the queue's admission to record
    when it does (``None`` for a queue without limits). A limited queue is asked under its
    lock (:meth:`WorkflowQueueQuerySet.admit`); a refusal adds it to ``refused``."""
    limits = queue_limits().get(queue)
    if limits is None or not limits.limited:
        return True, None
    steps = WorkflowStep._default_manager.using(alias)
    admission = WorkflowQueue.objects.admit(
        alias, limits, running=lambda: steps.running_in([queue]).get(queue, 0)
    )
    if admission is None:
        if refused is not None:
            refused.add(queue)
        return False, None
    return True, admission


def _finish_branch(alias: str, step_id: int, hold: float | None = None) -> bool:
    """The portable path of the rule that a step's result asks its run for a pass, inside
    the caller's transaction (after the fenced write of step ``step_id``): every result
    raises ``pass_requests``; while the run's last pass waits on more than one unfinished
    parallel step (``branches_left`` > 1) the result only counts one off and asks for
    nothing, else it asks as :func:`_request_pass` does (``hold`` seconds: taken for the
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
    run_id = WorkflowStep._default_manager.using(alias).filter(pk=step_id).values("run_id")[:1]
    runs = WorkflowRun._default_manager.using(alias).filter(
        pk=Subquery(run_id), status=RunStatus.RUNNING
    )
    while True:
        if runs.filter(branches_left__lte=1).update(
            pass_due_at=clock.db_now_plus(delay) if delay else DbNow(),
            pass_requests=F("pass_requests") + 1,
            branches_left=0,
            updated_at=DbNow(),
        ):
            if not delay:
                _wake(alias)  # due now (work due later is found by polling)
            return True
        if runs.filter(branches_left__gt=1).update(
            pass_requests=F("pass_requests") + 1,
            branches_left=F("branches_left") - 1,
            updated_at=DbNow(),
        ):
            return False
        if not runs.exists():  # not running (any more)
            return False


# -- steps --------------------------------------------------------------------------------------


def _check_step(step: NextStep) -> NextStep:
    """``step`` with its names and data checked (``ValueError``; its options are checked
    when they are made); returns it."""
    check_identifier(step.step_name, "Step name")
    check_identifier(step.function_name, "Step function name")
    check_json(step.data, "Step data")
    return step


def _step_columns(step: NextStep) -> dict[str, Any]:
    """The columns a new step row is created with, from ``step`` and its options."""
    options = step.options
    return {
        "step_name": step.step_name,
        "function_name": step.function_name,
        "data": {} if step.data is None else step.data,
        "retries": options.retries,
        "retry_delay": options.retry_delay,
        "retry_backoff": options.retry_backoff,
        "retry_delay_max": options.retry_delay_max,
        "timeout": options.timeout,
        "queue": options.queue,
        "priority": options.priority,
    }


def _insert_params(step: NextStep, ttl: float) -> list[Any]:
    """The parameters the tuned inserts of a claimed step take after the run's id (see
    :func:`sql.insert_claimed`): names, data as JSON text, retry settings, lease TTL."""
    options = step.options
    return [
        step.step_name,
        step.function_name,
        json.dumps({} if step.data is None else step.data),
        options.retries,
        options.retry_delay,
        options.retry_backoff,
        options.retry_delay_max,
        ttl,
    ]


def _in_one_statement(connection: BaseDatabaseWrapper, options: StepOptions) -> bool:
    """Whether a step with ``options`` is inserted claimed by a tuned statement here
    (:meth:`~values.StepOptions.one_statement`, on PostgreSQL with the tuned path on)."""
    if not _functions(connection):
        return False
    limits = queue_limits().get(options.queue)
    return options.one_statement(limited=limits is not None and limits.limited)


def write_pending(alias: str, pending: PendingResult | None) -> bool:
    """Write ``pending`` — a step attempt's result that a pass handed to its workflow and
    did not write yet — through the step's fence, with its attempt row, inside the caller's
    transaction on ``alias``; the run is not asked for a pass (the caller's pass is that
    pass). Returns ``True`` if written, ``False`` for ``None`` or a repeat of this very write
    (its first try committed).

    Raises:
        WorkflowStepSupersededError: the attempt is no longer the step's running one.
    """
    if pending is None:
        return False
    steps = WorkflowStepQuerySet(WorkflowStep, using=alias)
    json_result = Value(pending.result, output_field=models.JSONField())
    return steps._record_outcome(
        alias,
        pending.step_id,
        pending.attempt,
        step={
            "status": StepStatus.SUCCEEDED,
            "result": json_result,
            "error": None,
            "lease_expires_at": None,
        },
        history={"status": AttemptStatus.SUCCEEDED, "result": json_result},
        repeat_of=(AttemptStatus.SUCCEEDED, pending.result),
    )


def retry_delay_after(
    attempt: int,
    retry_delay: float,
    retry_backoff: float = 1.0,
    retry_delay_max: float | None = None,
) -> float:
    """The seconds between the failure of ``attempt`` (an ``int`` >= 1) of a step and its
    next attempt: ``min(retry_delay * retry_backoff ** (attempt - 1), cap)``, where the cap is
    ``retry_delay_max`` (seconds) or, when that is ``None``, :data:`MAX_RETRY_DELAY` (one
    day). With the default ``retry_backoff`` of 1.0 every delay is ``retry_delay``.

    The one rule of a step's retry delay (``retry_delay`` and ``retry_delay_max`` in seconds,
    ``retry_backoff`` a factor, as stored on the step): the store adds it to the database
    clock where a failed attempt is recorded (:meth:`WorkflowStepQuerySet.set_error`, a timed
    out attempt). Deterministic, without jitter: steps that fail together retry together,
    and a delay can be told in advance. The growth is compared with the cap in logarithms
    first, so a large factor raised to a large attempt number is capped without computing a
    power that would overflow a float. Values the checks refuse (a factor below 1 or not
    finite, a negative cap: a row edited by hand) read as no growth and no cap of their own.
    """
    cap = MAX_RETRY_DELAY
    if retry_delay_max is not None and 0.0 <= retry_delay_max < cap:
        cap = retry_delay_max
    if not retry_delay > 0.0 or cap == 0.0:
        return 0.0
    growths = attempt - 1
    if growths <= 0 or not 1.0 < retry_backoff < math.inf:
        return min(retry_delay, cap)
    exponent = growths * math.log(retry_backoff)  # the logarithm of the growth
    if math.log(retry_delay) + exponent >= math.log(cap):
        return cap
    try:
        grown = retry_delay * retry_backoff**growths
    except OverflowError:  # a subnormal retry_delay times a growth beyond any float
        grown = math.exp(math.log(retry_delay) + exponent)
    return min(grown, cap)


@dataclass(frozen=True)
class QueueCounts:
    """A queue's steps as operators count them (:meth:`WorkflowStepQuerySet.queue_counts`):
    ``waiting`` (due, unclaimed), ``running`` (live lease) and ``oldest_waiting`` (seconds
    the longest-waiting due step has been due, database clock; ``None`` when none waits)."""

    waiting: int
    running: int
    oldest_waiting: float | None


@dataclass(frozen=True)
class Scheduled:
    """What :meth:`WorkflowStepQuerySet.schedule_claimed` did.

    Attributes:
        step: the step row (``WorkflowStep``), created by this call or found.
        claim: the claim of the step for the caller (:class:`~values.Claim`), when this call
            created it and claimed it; else ``None``.
        pass_finished: the claim also ended the caller's pass (``finish_pass``).
        created: this call created the step (``False``: it existed).
    """

    step: WorkflowStep
    claim: Claim | None
    pass_finished: bool = False
    created: bool = True


def _inserted_claimed(
    alias: str,
    step_id: int,
    run_id: uuid.UUID,
    step: NextStep,
    ttl: float,
    sent: float,
    claimant: str = "",
) -> Scheduled:
    """The :class:`Scheduled` of a step a tuned statement inserted claimed (``running`` at
    attempt 1 under a ``ttl``-second lease for ``claimant``, the statement sent at ``sent``,
    monotonic)."""
    row = WorkflowStep(
        pk=step_id,
        run_id=run_id,
        status=StepStatus.RUNNING,
        attempt=1,
        claimant=claimant,
        **_step_columns(step),
    )
    row._state.adding = False
    row._state.db = alias
    claim = Claim(
        step_id=step_id,
        run_id=run_id,
        step_name=step.step_name,
        function_name=step.function_name,
        attempt=1,
        data=row.data,
        lease_ttl=ttl,
        claimed_at=sent,
        using=alias,
    )
    return Scheduled(row, _attempt_started(claim), True)


@dataclass(frozen=True)
class ResultWithNext:
    """What :meth:`WorkflowStepQuerySet.set_result_claiming_next` did.

    Attributes:
        write: the result's :class:`~values.StepWrite`; its ``state`` is the run's pass,
            taken for the caller, when no next step was created and the run asked for one.
        next: the next step, when this call created it (:class:`Scheduled`; its ``claim``
            is ``None`` where the step is not the caller's to run: another queue, or its
            queue at its limit); ``None`` otherwise.
        pass_requests: the run's ``pass_requests`` once the pass ended with the next step's
            creation, for the caller's next pass to end with; ``None`` when no step was
            created or a pass asked for meanwhile stays due.
    """

    write: StepWrite
    next: Scheduled | None = None
    pass_requests: int | None = None


class WorkflowStepQuerySet(db.RoutedQuerySet["WorkflowStep"]):
    """Domain methods of ``WorkflowStep.objects``: schedule, claim, fenced writes, history."""

    def schedule(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        timeout: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
    ) -> WorkflowStep:
        """Create step ``step_name`` of a run, due now, unless it exists; return the row.

        ``retries`` (``int``, 0 to 1000) allows ``retries + 1`` attempts. After attempt *n*
        fails, attempt *n* + 1 is due ``min(retry_delay * retry_backoff ** (n - 1),
        retry_delay_max)`` seconds later on the database clock (:func:`retry_delay_after`):
        ``retry_delay`` in seconds (0 to 86 400), ``retry_backoff`` a factor ≥ 1 (1.0, the
        default: every delay is ``retry_delay``), ``retry_delay_max`` in seconds (0 to
        86 400; ``None``: one day).

        ``queue`` (``str``) is the queue it is claimed from and ``priority`` (``int``) its
        place among due steps: higher first, first due first within a priority (the engine
        passes its step function's declaration).

        ``timeout`` (seconds > 0, or ``None``): an attempt running longer is failed with a
        ``STEP_TIMED_OUT`` error (and retried if attempts remain) by the next claim that
        looks for due work; its late writes are refused by the attempt fence.

        Idempotent: a second call returns the existing step untouched. Raises ``ValueError``
        for bad names, non-JSON ``data``, bad options (:class:`~values.StepOptions`), or an
        existing step recorded with a different ``function_name``.
        """
        options = StepOptions(
            retries=retries,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
            timeout=timeout,
            queue=queue,
            priority=priority,
        )
        return self.schedule_step(run_id, NextStep(step_name, function_name, data, options))

    def schedule_step(
        self, run_id: uuid.UUID | str, step: NextStep, *, pending: PendingResult | None = None
    ) -> WorkflowStep:
        """:meth:`schedule` for a :class:`~values.NextStep`, with ``pending`` — a result the
        caller's pass carries, written first, fenced (:func:`write_pending`) — in the same
        transaction.

        Raises:
            ValueError: as :meth:`schedule` (nothing written).
            WorkflowStepSupersededError: ``pending``'s attempt was superseded (nothing
                written).
        """
        _check_step(step)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            return self._schedule(run_id, step)[0]

    def schedule_many(
        self,
        run_id: uuid.UUID | str,
        calls: Sequence[tuple[str, str, Any]],
        options: StepOptions | None = None,
        *,
        options_of: Mapping[str, StepOptions] | None = None,
        pending: PendingResult | None = None,
    ) -> dict[str, WorkflowStep]:
        """:meth:`schedule` for many steps at once (``run.parallel``): each ``(step_name,
        function_name, data)`` of ``calls`` not recorded yet is created, due now, in one
        insert (existing ones are left untouched); idle workers are woken once. Returns
        every step of ``calls`` by name, as now stored. Each step gets ``options_of[name]``
        where given, else ``options`` (:class:`~values.StepOptions`; ``None``: the defaults).
        ``pending``: a result the caller's pass carries, written first in the same
        transaction (:func:`write_pending`).

        Raises ``ValueError`` as :meth:`schedule` does (nothing written), also for a name
        given twice; :class:`WorkflowStepSupersededError` when ``pending``'s attempt was
        superseded (nothing written).
        """
        names = [call[0] for call in calls]
        if len(set(names)) != len(names):
            raise ValueError("run.parallel: a step name is given twice")
        default = StepOptions() if options is None else options
        wanted = [
            _check_step(NextStep(name, function, data, (options_of or {}).get(name, default)))
            for name, function, data in calls
        ]
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        rows = self.rows()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            rows.bulk_create(
                [self.model(run_id=pk, **_step_columns(step)) for step in wanted],
                batch_size=500,
                ignore_conflicts=True,  # recorded already (by another pass): left as it is
            )
            # Due on the database clock (bulk_create writes values, not expressions).
            rows.filter(
                run_id=pk, step_name__in=names, status=StepStatus.PENDING, available_at=None
            ).update(available_at=DbNow())
            _wake(alias)
            found = {step.step_name: step for step in rows.filter(run_id=pk, step_name__in=names)}
        for step_name, function_name, _data in calls:
            if found[step_name].function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} of run {run_id} was recorded with step function "
                    f"{found[step_name].function_name!r}, not {function_name!r}"
                )
        return found

    def _schedule(self, run_id: uuid.UUID | str, step: NextStep) -> tuple[WorkflowStep, bool]:
        """:meth:`schedule` on a checked step; ``(step row, created by this call)``."""
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            row, created = self.rows().get_or_create(
                run_id=parse_run_id(run_id),
                step_name=step.step_name,
                defaults={
                    **_step_columns(step),
                    "available_at": DbNow(),
                },
            )
            if created:
                _wake(alias)
        if row.function_name != step.function_name:
            raise ValueError(
                f"Step {step.step_name!r} of run {run_id} was recorded with step function "
                f"{row.function_name!r}, not {step.function_name!r}"
            )
        return row, created

    @_falls_back
    def schedule_claimed(
        self,
        run_id: uuid.UUID | str,
        step: NextStep,
        *,
        lease_ttl_seconds: float,
        finish_pass: int,
        queues: Sequence[str] | None = None,
        claimant: str = "",
    ) -> Scheduled:
        """:meth:`schedule` ``step``, and claim it for the caller if this call created it.

        For a worker that drives a run itself: the step it schedules is due now, so it runs
        it straight away instead of leaving it to the queue (no notification is sent). The
        claim follows :meth:`claim_for_execution`'s rules for a new step — ``running`` at
        attempt 1 with a ``lease_ttl_seconds`` lease on the database clock, plus its attempt
        row; if its worker dies, the lease lapses and any worker claims attempt 2. A claim
        also ends the caller's pass (:meth:`WorkflowRunQuerySet.finish_pass`'s rule, with
        ``finish_pass`` the ``pass_requests`` the pass read), and names ``claimant``
        (``WorkflowStep.claimant``; see :meth:`reclaim_created`). The step is inserted and
        claimed in one transaction, so no other worker ever sees it unclaimed when this call
        claims it. Tuned (PostgreSQL, where :meth:`~values.StepOptions.one_statement`):
        creating, claiming and ending the pass are one statement, inserting only while the
        run is ``running``.

        ``queues`` (the caller's ``--queue`` names; ``None`` or empty: every queue): a step
        of another queue is only scheduled, for a worker of its queue. A step of a limited
        queue is claimed through :meth:`claim_for_execution`, which enforces the limits (it
        may leave it waiting).

        Returns a :class:`Scheduled`; its ``claim`` is ``None`` when the step already
        existed, the run is not running, the step is not the caller's to take (another
        queue, or its queue is at its limit), or another worker claimed it first. Raises
        ``ValueError`` as :meth:`schedule` does.
        """
        _check_step(step)
        options = step.options
        if queues and options.queue not in queues:
            row, created = self._schedule(run_id, step)
            return Scheduled(row, None, created=created)
        ttl = ttl_seconds(lease_ttl_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        sent = time.monotonic()
        if not _in_one_statement(connection, options):
            with transaction.atomic(using=alias):
                scheduled = self._insert_and_claim(alias, run_id, step, ttl, (), claimant)
                if scheduled.claim is None:
                    return scheduled
                runs = WorkflowRun.objects.db_manager(alias)
                finished = runs.finish_pass(run_id, finish_pass)
            return dataclasses.replace(scheduled, pass_finished=finished)
        run_id = parse_run_id(run_id)
        found = _call_row(
            connection,
            "insert_claimed",
            [run_id, *_insert_params(step, ttl), finish_pass, claimant],
        )
        if found is None or found[0] is None:  # it exists, or the run is not running
            row, created = self._schedule(run_id, step)
            return Scheduled(row, None, created=created)
        return _inserted_claimed(alias, int(found[0]), run_id, step, ttl, sent, claimant)

    def _insert_and_claim(
        self,
        alias: str,
        run_id: uuid.UUID | str,
        step: NextStep,
        ttl: float,
        queues: Sequence[str] | None,
        claimant: str,
    ) -> Scheduled:
        """Create ``step`` (unless it exists) and claim it for the caller under a ``ttl``
        lease naming ``claimant``, inside the caller's transaction — so no other worker ever
        sees it unclaimed when this claims it. A step of a queue not in ``queues`` (empty:
        every queue), or one its queue does not admit now, is left for its workers."""
        row, created = self._schedule(run_id, step)
        if not created or (queues and step.options.queue not in queues):
            return Scheduled(row, None, created=created)
        claim = self.claim_for_execution(
            run_id, step.step_name, step.function_name, ttl, claimant=claimant
        )
        if claim is None:
            return Scheduled(row, None)
        row.status, row.claimant = StepStatus.RUNNING, claimant
        return Scheduled(row, claim)

    # -- claims ---------------------------------------------------------------------------------

    def claim_for_execution(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        lease_ttl_seconds: float,
        *,
        claimant: str = "",
    ) -> Claim | None:
        """Claim step ``step_name`` of a run for execution under a ``lease_ttl_seconds`` lease;
        the claim names ``claimant`` (``WorkflowStep.claimant``, empty: none).

        Rules (DESIGN §5, all judged on the database clock, one transaction, row locked):

        * ``function_name`` differs from the recorded one → ``ValueError`` before any write;
        * the run is not ``running``, the step ``succeeded``, the step ``running`` with a live
          lease, or not yet due (``available_at`` in the future) → ``None``;
        * ``pending`` / ``scheduled`` → ``running`` at the **same** attempt, lease granted;
        * ``failed`` with attempts left, or ``running`` with a **lapsed** lease →
          ``attempt + 1`` in the same guarded ``UPDATE`` that grants the lease, plus an
          attempt row; every write of an earlier attempt is refused from then on;
        * ``failed`` with no attempts left → ``None``; ``running``, lapsed and out of attempts
          → the step fails with a "lost its worker on every attempt" error and the run is
          asked for a pass; ``None``.

        Exactly one of many concurrent claimers gets a :class:`Claim`.

        Raises:
            ValueError: bad names, run id or TTL, or a function name mismatch (nothing written).
            WorkflowStep.DoesNotExist: no such step.
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        ttl = ttl_seconds(lease_ttl_seconds)
        alias = self.write_alias()
        sent = time.monotonic()
        with transaction.atomic(using=alias):
            step = (
                self._locking(alias, skip_locked=False)
                .filter(run_id=parse_run_id(run_id), step_name=step_name)
                .first()
            )
            if step is None:
                raise self.model.DoesNotExist(f"Run {run_id} has no step named {step_name!r}")
            if step.function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} of run {run_id} runs step function "
                    f"{step.function_name!r}, not {function_name!r}"
                )
            return self._claim_locked(alias, step, ttl, sent, claimant=claimant)

    @_falls_back
    def claim_due(
        self, lease_ttl_seconds: float, *, queues: Sequence[str] | None = None
    ) -> Claim | None:
        """Claim one due step of a running run for a worker, or ``None`` if none is due.

        Due: ``running`` with a lapsed lease (taken first), or ``pending`` / ``scheduled`` /
        ``failed``-with-attempts-left whose ``available_at`` has passed — highest
        ``priority`` first, then first due first. Only steps of ``queues`` (names; ``None``
        or empty: every queue), and none of a queue at its concurrency limit or out of its
        rate (``DJANGO_LEASES["QUEUES"]``; decided under the queue's lock, see
        :class:`WorkflowQueueQuerySet`). Rows are picked with ``SKIP LOCKED`` where the
        database has it. The claim follows :meth:`claim_for_execution`'s rules; a lapsed
        step out of attempts is failed on the way and the next one tried. Tuned (PostgreSQL,
        when no queue the caller may take has limits): one statement, unless a lapsed step
        waits to be taken over.

        Raises:
            QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
        """
        ttl = ttl_seconds(lease_ttl_seconds)
        alias = self.write_alias()
        limits = queue_limits()
        taken = list(queues or ())
        connection = connections[alias]
        if _claims_in_one(connection, limits, taken):
            # No queue this worker takes has limits: one statement, unless a lapsed step
            # is to be taken over (below).
            lapsed, claim = self._claim_unlimited(connection, ttl, taken)
            if not lapsed:
                return claim
        blocked: set[str] = set()  # limited queues found full: passed over from then on
        looked: set[str] = set()  # limited queues whose fullness was looked at
        for _round in range(20):
            sent = time.monotonic()
            refused: set[str] = set()
            with transaction.atomic(using=alias):
                step = self._next_due(alias, taken, blocked)
                if step is None:
                    return None
                queue = limits.get(step.queue)
                if queue is not None and queue.limited and step.queue not in looked:
                    # An unlocked look first: a full queue is passed over without waiting
                    # for its lock (the claim below still decides under the lock).
                    looked.add(step.queue)
                    full = self._full_queues(alias, {step.queue: queue})
                    if full:
                        blocked |= full
                        continue
                claim = self._claim_locked(alias, step, ttl, sent, refused)
            if claim is not None:
                return claim
            blocked |= refused
        return None

    def running_in(self, queues: Sequence[str]) -> dict[str, int]:
        """How many steps of each of ``queues`` are running with a live lease (database
        clock): what a queue's concurrency limit counts. Queues with none are left out."""
        return dict(
            self.rows()
            .filter(queue__in=list(queues), status=StepStatus.RUNNING, lease_expires_at__gt=DbNow())
            .values_list("queue")
            .annotate(n=models.Count("pk"))
            .values_list("queue", "n")
        )

    def _full_queues(self, alias: str, limits: Mapping[str, QueueLimits]) -> set[str]:
        """Of the limited queues in ``limits``, those that look full now: at their
        concurrency limit, or out of their rate (unlocked reads: a hint that spares a claim
        the lock of a queue that would refuse it; the claim still decides under the lock)."""
        limited = {name: queue for name, queue in limits.items() if queue.limited}
        counted = {name: q.concurrency for name, q in limited.items() if q.concurrency is not None}
        running = self.using(alias).running_in(sorted(counted)) if counted else {}
        full = {name for name, limit in counted.items() if running.get(name, 0) >= limit}
        return full | WorkflowQueue.objects.rate_used_up(alias, limited)

    def queue_counts(self) -> dict[str, QueueCounts]:
        """Per queue named by a step of a running run: its waiting steps (due, unclaimed),
        running steps (live lease) and the age of its oldest waiting step in seconds on the
        database clock (``None`` when none waits). Operators' views read this."""
        steps = self.rows().filter(run__status=RunStatus.RUNNING)
        waiting = {
            row["queue"]: row
            for row in steps.filter(status__in=WAITING_STEP_STATUSES, available_at__lte=DbNow())
            .exclude(status=StepStatus.FAILED, attempt__gte=F("retries") + 1)
            .values("queue")
            .annotate(
                n=models.Count("pk"),
                oldest=models.Min("available_at"),
                db_now=models.Max(DbNow()),
            )
        }
        running = dict(
            steps.filter(status=StepStatus.RUNNING, lease_expires_at__gt=DbNow())
            .values_list("queue")
            .annotate(n=models.Count("pk"))
            .values_list("queue", "n")
        )
        found = {}
        for name in set(waiting) | set(running):
            row = waiting.get(name)
            oldest = None
            if row is not None and row["oldest"] is not None:
                oldest = max(0.0, (row["db_now"] - row["oldest"]).total_seconds())
            found[name] = QueueCounts(
                waiting=0 if row is None else int(row["n"]),
                running=int(running.get(name, 0)),
                oldest_waiting=oldest,
            )
        return found

    def _claim_unlimited(
        self, connection: BaseDatabaseWrapper, ttl: float, queues: Sequence[str]
    ) -> tuple[bool, Claim | None]:
        """:meth:`claim_due`'s tuned path (function ``claim_step``) for queues without
        limits: ``(lapsed, claim)`` — ``lapsed`` when a lapsed step waits to be taken over
        (nothing was claimed: the portable path decides it), else the claim or ``None``."""
        sent = time.monotonic()
        row = _call_row(connection, "claim_step", [ttl, list(queues) or None])
        return _claim_from_row(connection.alias, row, ttl, sent)

    def _locking(self, alias: str, *, skip_locked: bool) -> models.QuerySet[_LockedStep]:
        features = connections[alias].features
        run_status: Any = F("run__status")
        run_workflow: Any = F("run__workflow")
        of: tuple[str, ...] = ("self",)
        if not features.has_select_for_update_of:
            # No FOR UPDATE OF (MariaDB, SQLite): read the run's status in a subquery, whose
            # rows a locking read leaves unlocked (a join's would be locked too, so steps of
            # one run could not be claimed side by side).
            of = ()
            runs = WorkflowRun._default_manager.using(alias).filter(pk=models.OuterRef("run_id"))
            run_status = models.Subquery(runs.values("status")[:1])
            run_workflow = models.Subquery(runs.values("workflow")[:1])
        qs = self.rows().annotate(
            lease_live=_live(),
            due=_due(),
            run_status=run_status,
            run_workflow=run_workflow,
            db_now=DbNow(),
        )
        if skip_locked and features.has_select_for_update_skip_locked:
            return qs.select_for_update(skip_locked=True, of=of)
        return qs.select_for_update(of=of)

    def _next_due(
        self,
        alias: str,
        queues: Sequence[str] = (),
        blocked: set[str] | frozenset[str] = frozenset(),
    ) -> _LockedStep | None:
        base = self._locking(alias, skip_locked=True).filter(run__status=RunStatus.RUNNING)
        if queues:
            base = base.filter(queue__in=[name for name in queues if name not in blocked])
        elif blocked:
            base = base.exclude(queue__in=sorted(blocked))
        # Running steps whose lease lapsed, or whose attempt ran past its timeout.
        lapsed = (
            base.filter(
                Q(lease_expires_at__lte=DbNow())
                | Q(lease_expires_at__isnull=True)
                | Q(deadline_at__lte=DbNow()),
                status=StepStatus.RUNNING,
            )
            .order_by("lease_expires_at")
            .first()
        )
        if lapsed is not None:
            return lapsed
        return (
            base.filter(status__in=WAITING_STEP_STATUSES, available_at__lte=DbNow())
            .exclude(status=StepStatus.FAILED, attempt__gte=F("retries") + 1)
            .order_by("-priority", "available_at", "id")
            .first()
        )

    def _claim_locked(
        self,
        alias: str,
        step: _LockedStep,
        ttl: float,
        sent: float,
        refused: set[str] | None = None,
        *,
        claimant: str = "",
    ) -> Claim | None:
        """Decide and write a claim of the locked, annotated ``step`` (inside a transaction),
        naming ``claimant`` (empty: none).

        A step of a limited queue starts only if the queue admits it (under the queue's lock,
        :meth:`WorkflowQueueQuerySet.admit`); else ``None``, and the queue is added to
        ``refused``."""
        if step.run_status != RunStatus.RUNNING or step.status == StepStatus.SUCCEEDED:
            return None
        if step.status == StepStatus.RUNNING and step.lease_live:
            if step.deadline_at is not None and step.deadline_at <= step.db_now:
                self._time_out(alias, step)
            return None
        # Guarded on what was read, and on the run still running: a cancel that committed
        # while this claim waited for the step row is seen here (a new statement).
        rows = self.rows().filter(
            pk=step.pk, attempt=step.attempt, status=step.status, run__status=RunStatus.RUNNING
        )
        lease = clock.db_now_plus(ttl)
        deadline = None if step.timeout is None else clock.db_now_plus(step.timeout)
        admission: Admission | None = None
        if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED):
            if not step.due:
                return None
            admitted, admission = _queue_admits(alias, step.queue, refused)
            if not admitted:
                return None
            attempt = step.attempt
            granted = rows.filter(_due_q()).update(
                status=StepStatus.RUNNING,
                lease_expires_at=lease,
                claimant=claimant,
                deadline_at=deadline,
                updated_at=DbNow(),
            )
        else:  # failed, or running with a lapsed lease
            exhausted = step.attempt >= step.retries + 1
            lapsed_q = Q(lease_expires_at__lte=DbNow()) | Q(lease_expires_at__isnull=True)
            if exhausted:
                if step.status == StepStatus.RUNNING:
                    self._fail_lost_worker(alias, step, rows.filter(lapsed_q))
                return None
            if step.status == StepStatus.FAILED and not step.due:
                return None
            guard = _due_q() if step.status == StepStatus.FAILED else lapsed_q
            admitted, admission = _queue_admits(alias, step.queue, refused)
            if not admitted:
                return None
            attempt = step.attempt + 1
            # The new attempt and the lease in one guarded UPDATE: from here on, every write
            # carrying an earlier attempt matches no row.
            granted = rows.filter(guard).update(
                status=StepStatus.RUNNING,
                attempt=F("attempt") + 1,
                lease_expires_at=lease,
                claimant=claimant,
                deadline_at=deadline,
                result=None,
                error=None,
                updated_at=DbNow(),
            )
        if granted != 1:
            return None
        history: dict[str, Any] = {
            "status": AttemptStatus.RUNNING,
            "result": None,
            "error": None,
            "finished_at": None,
        }
        if admission is not None:
            # The start the queue's rate log records is the attempt's start.
            WorkflowQueue.objects.record_start(alias, admission)
            history["started_at"] = admission.started_at
        WorkflowStepAttempt._default_manager.using(alias).update_or_create(
            step_id=step.pk, attempt=attempt, defaults=history
        )
        claim = Claim(
            step_id=step.pk,
            run_id=step.run_id,
            step_name=step.step_name,
            function_name=step.function_name,
            attempt=attempt,
            data=step.data,
            lease_ttl=ttl,
            claimed_at=sent,
            using=alias,
            run_workflow=step.run_workflow,
        )
        waited = None
        if step.available_at is not None and step.status != StepStatus.RUNNING:
            waited = (step.db_now - step.available_at).total_seconds()
        transaction.on_commit(lambda: _attempt_started(claim, waited), using=alias)
        return claim

    def _time_out(self, alias: str, step: WorkflowStep) -> None:
        """Fail the locked ``step``'s running attempt, past its ``timeout`` on the database
        clock, with a ``STEP_TIMED_OUT`` error, through the fence (inside the caller's
        transaction), as :meth:`set_error` would: retried after the step's retry delay for
        this attempt (:func:`retry_delay_after`) if attempts remain, else the run is asked
        for a pass. Its worker's renewals, result and error are refused from then on."""
        error = {
            "code": STEP_TIMED_OUT,
            "message": (
                f"Step {step.step_name!r} attempt {step.attempt} ran longer than its timeout "
                f"of {step.timeout:g} s"
            ),
        }
        exhausted = step.attempt >= step.retries + 1
        delay = retry_delay_after(
            step.attempt, step.retry_delay, step.retry_backoff, step.retry_delay_max
        )
        self._record_outcome(
            alias,
            step.pk,
            step.attempt,
            step={
                "status": StepStatus.FAILED,
                "error": error,
                "result": None,
                "lease_expires_at": None,
                "deadline_at": None,
                "available_at": None if exhausted else clock.db_now_plus(delay),
            },
            history={"status": AttemptStatus.FAILED, "error": error},
        )
        if exhausted:
            request_passes(alias, Q(pk=step.run_id))
        elif not delay:
            _wake(alias)

    def _fail_lost_worker(
        self, alias: str, step: WorkflowStep, rows: models.QuerySet[WorkflowStep]
    ) -> None:
        error = {
            "code": STEP_LEASE_LAPSED,
            "message": (
                f"Step {step.step_name!r} lost its worker on every attempt "
                f"({step.attempt} of {step.retries + 1}): its lease lapsed each time"
            ),
        }
        failed = rows.update(
            status=StepStatus.FAILED,
            error=error,
            lease_expires_at=None,
            available_at=None,
            updated_at=DbNow(),
        )
        if failed:
            WorkflowStepAttempt._default_manager.using(alias).filter(
                step_id=step.pk, attempt=step.attempt, status=AttemptStatus.RUNNING
            ).update(status=AttemptStatus.FAILED, error=error, finished_at=DbNow())
            _attempt_finished(alias, step.pk, step.attempt, StepStatus.FAILED, step.run_id)
            request_passes(alias, Q(pk=step.run_id))

    # -- fenced writes --------------------------------------------------------------------------

    def set_result(
        self, step_id: int, result: Any, attempt: int, *, hold_pass_seconds: float | None = None
    ) -> StepWrite:
        """Record ``result`` (JSON) for ``attempt`` of the step; returns a :class:`StepWrite`.

        One conditional write through the fence (this attempt, still ``running``); the attempt
        row is updated in the same transaction, and the run is asked for a pass: due now
        (idle workers are woken) or, with ``hold_pass_seconds`` (the run lease's TTL), taken
        for the caller, who runs it next — then ``StepWrite.state`` is the run and its steps
        as the write left them. A step of a ``run.parallel`` the run's last pass waits on
        asks only if it is the last of them to finish (``StepWrite.pass_requested``; the
        others just count themselves off the run's ``branches_left``), so N branches cost
        one pass, not N; the decision is taken on the run row locked by the write's own
        ``UPDATE``, so two branches finishing at once wake the run exactly once.
        A result that is not JSON is not stored: the attempt fails
        with a ``STEP_RESULT_NOT_JSON`` error instead (as :meth:`set_error`, so retries
        apply). Writing again the result this attempt already recorded returns a
        ``StepWrite`` with ``written=False`` (safe to retry after a lost acknowledgement).
        Tuned (PostgreSQL): one statement.

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` is not an int ≥ 1.
        """
        check_attempt(attempt)
        try:
            check_json(result, "Step result")
        except ValueError as exc:
            return self.set_error(
                step_id,
                {"code": STEP_RESULT_NOT_JSON, "type": "ValueError", "message": str(exc)},
                attempt,
                hold_pass_seconds=hold_pass_seconds,
            )
        hold = None if hold_pass_seconds is None else ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        if db.tuned(connection, "postgresql"):
            fence, fence_params = _fence_sql(alias, step_id, attempt)
            statement, params = sql.set_result(
                _tables(connection),
                fence,
                fence_params,
                json.dumps(result),
                attempt,
                hold=hold,
                channel=channel_name(alias),
            )
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                row = cursor.fetchone()
            if row[0]:
                state = None
                asked = bool(row[1]) if hold is None else row[1] is not None
                if hold is not None and row[1] is not None:
                    state = _pass_state_from_row(alias, row[1:])
                    _with_result(state, step_id, self.stored_json(result))
                _attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
                return StepWrite(StepStatus.SUCCEEDED, state=state, pass_requested=asked)
            # Nothing matched the fence: a repeat of this very write, or a refusal.
            if self._already_recorded(alias, step_id, attempt, AttemptStatus.SUCCEEDED, result):
                return StepWrite(StepStatus.SUCCEEDED, written=False)
            self._refuse(alias, step_id, attempt)
        json_result = Value(result, output_field=models.JSONField())
        with transaction.atomic(using=alias):
            written = self._record_outcome(
                alias,
                step_id,
                attempt,
                step={
                    "status": StepStatus.SUCCEEDED,
                    "result": json_result,
                    "error": None,
                    "lease_expires_at": None,
                },
                history={"status": AttemptStatus.SUCCEEDED, "result": json_result},
                repeat_of=(AttemptStatus.SUCCEEDED, result),
            )
            # A repeat (``written`` false) goes on as if it had asked: at worst one pass more.
            asked = _finish_branch(alias, step_id, hold) if written else True
        state = self._state_after(alias, step_id, hold) if asked else None
        return StepWrite(StepStatus.SUCCEEDED, written, state, pass_requested=asked)

    def _state_after(self, alias: str, step_id: int, hold: float | None) -> PassState | None:
        """The pass state of the step's run after a write that took its pass (``hold``)."""
        if hold is None:
            return None
        run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
        state = WorkflowRun.objects.db_manager(alias).pass_state(run_id)
        return state if state is not None and state.run.status == RunStatus.RUNNING else None

    @_falls_back
    def set_result_claiming_next(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        next_step: NextStep,
        finish_pass: int,
        lease_ttl_seconds: float,
        hold_pass_seconds: float,
        queues: Sequence[str] | None = None,
        claimant: str = "",
    ) -> ResultWithNext:
        """Record ``result`` for ``attempt`` of the step (:meth:`set_result`), and create the
        step its run's workflow asks for next, claimed for the caller (:meth:`schedule_claimed`)
        in a claim that names ``claimant`` (:func:`~values.claimant_name`: the same for every
        try of this write, so a try after a lost reply can find its own claim with
        :meth:`reclaim_created`).

        For the driver of a run that has replayed the workflow in memory with this result
        and found it asks for ``next_step`` next: the pass the result asks for has then been
        run, so it ends with the next step's creation — unless another pass was asked for
        since ``finish_pass`` (the ``pass_requests`` the caller's last pass read), which stays
        due. The next step is created only when the result was written, the run is
        ``running`` and its last pass waits on no other parallel step; when it is not (or a
        step of that name exists), the write is :meth:`set_result` with
        ``hold_pass_seconds``: the pass is taken for the caller, who runs it for real.
        ``lease_ttl_seconds``: the next step's lease; ``queues``: as for
        :meth:`schedule_claimed` (a step of another queue, or of a limited queue at its
        limit, is created for its workers, not claimed). Tuned (PostgreSQL), for a step of
        the default queue with no timeout or priority of its own: one statement; else the
        two writes one after the other (a worker dying between them leaves the pass taken,
        due again once ``hold_pass_seconds`` have passed).

        Args:
            step_id: the step (``int``).
            result: its JSON result.
            attempt: the attempt that ran (``int`` ≥ 1), the fence.
            next_step: the step to create (:class:`~values.NextStep`).
            finish_pass: ``pass_requests`` as the caller's pass read it (``int``).
            lease_ttl_seconds: seconds of the next step's lease.
            hold_pass_seconds: seconds the run's pass is taken for when no step is created
                (the run lease's TTL).
            queues: the caller's ``--queue`` names (``None`` or empty: every queue).
            claimant: the name the next step's claim carries (``str``).

        Returns:
            A :class:`ResultWithNext`.

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` or the next step's settings are invalid (as
                :meth:`schedule` says); nothing was written.
        """
        check_attempt(attempt)
        _check_step(next_step)
        ttl = ttl_seconds(lease_ttl_seconds)
        hold = ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        try:
            check_json(result, "Step result")
        except ValueError:  # ``set_result`` turns it into the attempt's failure
            return ResultWithNext(self.set_result(step_id, result, attempt, hold_pass_seconds=hold))
        options = next_step.options
        served = not queues or options.queue in queues
        if not (served and _in_one_statement(connection, options)):
            return self._claiming_next_portably(
                alias, step_id, result, attempt, next_step, finish_pass, ttl, hold, queues, claimant
            )
        sent = time.monotonic()
        row = _call_row(
            connection,
            "set_result_claiming_next",
            [
                step_id,
                json.dumps(result),
                attempt,
                hold,
                *_insert_params(next_step, ttl),
                finish_pass,
                claimant,
            ],
        )
        if row[2] is not None:
            faults.reached(
                "workflow.next-step-written", run_id=row[1], step_name=next_step.step_name
            )
        if not row[0]:
            # Nothing matched the fence: a repeat of this very write, or a refusal.
            if self._already_recorded(alias, step_id, attempt, AttemptStatus.SUCCEEDED, result):
                return ResultWithNext(StepWrite(StepStatus.SUCCEEDED, written=False))
            self._refuse(alias, step_id, attempt)
        _attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
        width = sql.CLAIMING_NEXT_COLUMNS
        if row[2] is None:  # no step created: the pass, if the run asked, is the caller's
            state = None
            if row[width] is not None:
                state = _pass_state_from_row(alias, row[width:])
                _with_result(state, step_id, self.stored_json(result))
            write = StepWrite(StepStatus.SUCCEEDED, state=state, pass_requested=state is not None)
            return ResultWithNext(write)
        run_id = parse_run_id(row[1])
        scheduled = _inserted_claimed(alias, int(row[2]), run_id, next_step, ttl, sent, claimant)
        return ResultWithNext(StepWrite(StepStatus.SUCCEEDED), scheduled, row[3])

    def _claiming_next_portably(
        self,
        alias: str,
        step_id: int,
        result: Any,
        attempt: int,
        next_step: NextStep,
        finish_pass: int,
        ttl: float,
        hold: float,
        queues: Sequence[str] | None,
        claimant: str,
    ) -> ResultWithNext:
        """:meth:`set_result_claiming_next` as one transaction: the result through the fence
        (the step's row locked first), the run locked, the next step inserted and claimed
        (:meth:`_insert_and_claim`), and the run's pass ended as the tuned statement ends it.
        Where no step is created (the run is not running, its last pass waits on other
        parallel steps, or a step of that name exists) the result asks for the pass as
        :meth:`set_result` with ``hold`` does, and the state is the caller's."""
        runs = WorkflowRun._default_manager.using(alias)
        with transaction.atomic(using=alias):
            if not write_pending(alias, PendingResult(step_id, attempt, result)):
                return ResultWithNext(StepWrite(StepStatus.SUCCEEDED, written=False))
            run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).get()
            run = (
                db.for_update(runs.filter(pk=run_id), alias)
                .values("status", "branches_left")
                .first()
            )
            scheduled = None
            if run is not None and run["status"] == RunStatus.RUNNING and run["branches_left"] <= 1:
                scheduled = self._insert_and_claim(alias, run_id, next_step, ttl, queues, claimant)
            if scheduled is None or not scheduled.created:
                asked = _finish_branch(alias, step_id, hold)
                write = StepWrite(
                    StepStatus.SUCCEEDED,
                    state=self._state_after(alias, step_id, hold) if asked else None,
                    pass_requested=asked,
                )
                return ResultWithNext(write)
            # The pass this result asks for is the caller's (run already, in memory), so it
            # ends here — unless another was asked for since ``finish_pass``: due now.
            ended = runs.filter(pk=run_id, pass_requests=finish_pass).update(
                pass_requests=F("pass_requests") + 1,
                pass_due_at=None,
                branches_left=0,
                updated_at=DbNow(),
            )
            if not ended:
                request_passes(alias, Q(pk=run_id))
        faults.reached("workflow.next-step-written", run_id=run_id, step_name=next_step.step_name)
        return ResultWithNext(
            StepWrite(StepStatus.SUCCEEDED), scheduled, finish_pass + 1 if ended else None
        )

    def reclaim_created(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        *,
        lease: Lease,
        lease_ttl_seconds: float,
        claimant: str,
    ) -> Scheduled | None:
        """Claim again a step that a write of the caller created claimed, when that write's
        reply was lost (:meth:`set_result_claiming_next` tried again finds its result
        recorded): the step is the caller's only while its running attempt 1 is the claim
        that write made — the claim names ``claimant`` (a step the write left unclaimed,
        which another worker claimed since, names another or none) — while the caller still
        holds the run lease ``lease`` (same holder and token, live on the database clock, so
        nobody else ran a pass of the run since) and the run is running. Its step lease is
        then renewed ``lease_ttl_seconds`` (seconds) from now. Returns the step and its claim
        (:class:`Scheduled`), or ``None`` (the step's lease lapses and it is taken over as
        for any lost worker).

        Raises:
            ValueError: an empty ``claimant`` (it would name every unnamed claim).
        """
        if not claimant:
            raise ValueError("reclaim_created needs the claimant the write named")
        ttl = ttl_seconds(lease_ttl_seconds)
        run_id = parse_run_id(run_id)
        alias = self.write_alias()
        sent = time.monotonic()
        with transaction.atomic(using=alias):
            held = (
                Lease._default_manager.using(alias)
                .select_for_update()
                .filter(
                    key=run_lease_key(run_id),
                    holder=lease.holder,
                    token=lease.token,
                    released_at__isnull=True,
                    expires_at__gt=DbNow(),
                )
                .values_list("pk", flat=True)
                .first()
            )
            if held is None:
                return None
            mine = self.rows().filter(
                run_id=run_id,
                step_name=step_name,
                status=StepStatus.RUNNING,
                attempt=1,
                claimant=claimant,
                run__status=RunStatus.RUNNING,
            )
            if not mine.update(lease_expires_at=clock.db_now_plus(ttl), updated_at=DbNow()):
                return None
            step = self.rows().get(run_id=run_id, step_name=step_name)
        claim = Claim(
            step_id=step.pk,
            run_id=step.run_id,
            step_name=step_name,
            function_name=step.function_name,
            attempt=1,
            data=step.data,
            lease_ttl=ttl,
            claimed_at=sent,
            using=alias,
        )
        return Scheduled(step, claim, False)

    @_falls_back
    def set_result_completing_run(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        output: Any,
        lease: Lease | None,
        lease_holder: str | None = None,
        next_pass_holder: str | None = None,
        next_pass_ttl: float = 30.0,
        next_step_ttl: float | None = None,
        next_step_queues: Sequence[str] | None = None,
    ) -> RunCompletion:
        """Record ``result`` (JSON) for ``attempt`` of the step **and** complete its run with
        ``output`` (JSON) **and** release the run lease ``lease`` (held by the caller).

        ``lease=None``: the caller holds no run lease (a worker that ran a step from the
        queue and knows the workflow returns with its result, a task's): the write takes
        the run lease for ``lease_holder`` (a fresh holder name, required then) and
        releases it in the same instant, so the run is completed only while no pass holds
        it; when one does, the result is written and a pass asked for instead
        (``RunCompletion.pass_asked``), as :meth:`set_result` would. ``lease_acquired`` and
        ``lease_released`` are sent for that grant. Rows are locked in the house's order:
        the step, its run, then the run lease.

        For the worker that drives the run: it replayed the run with this result in memory
        and the workflow returned ``output``, so the pass that would follow the result is
        already known. Everything is conditional on the step's fence (this attempt, still
        ``running``, as :meth:`set_result`): when it refuses, nothing is written, the lease
        is not released, and the caller goes the ordinary way (:meth:`set_result`, which
        raises or recognises a repeat). The run is completed only while it is ``running``.

        ``next_pass_holder``: also pick the next due pass with its run lease for that
        holder (``next_pass_ttl`` seconds), as :meth:`WorkflowRunQuerySet.claim_due_pass`
        does; it is picked whatever the fence said, and is never this step's run.
        ``next_step_ttl`` (seconds, instead of ``next_pass_holder``): also claim the next due
        step under a step lease of that TTL, of ``next_step_queues`` (names; ``None``: every
        queue), as :meth:`claim_due` does (``RunCompletion.next_step``); it is claimed
        whatever the fence said. Tuned (PostgreSQL): all of it is one statement (the claim
        too, without a held run lease while no queue it may take has limits: else it
        follows as :meth:`claim_due`); elsewhere one transaction, then the pick or claim.

        Returns a :class:`RunCompletion`. Raises ``ValueError`` for a bad attempt, non-JSON
        ``result`` or ``output``, a bad TTL, both a pick and a claim asked for, or
        (``lease=None``) a missing or bad ``lease_holder`` (nothing written);
        ``QueueConfigError`` (``next_step_ttl``) when ``DJANGO_LEASES["QUEUES"]`` is not
        usable.
        """
        check_attempt(attempt)
        check_json(result, "Step result")
        check_json(output, "Workflow output")
        held: Lease | str = (
            lease if lease is not None else check_lease_name(lease_holder, "lease_holder")
        )
        next_ttl = ttl_seconds(next_pass_ttl)
        step_ttl = None if next_step_ttl is None else ttl_seconds(next_step_ttl)
        if step_ttl is not None and next_pass_holder is not None:
            raise ValueError("Pick the next pass or claim the next step, not both")
        taken = list(next_step_queues or ())
        alias = self.write_alias()
        connection = connections[alias]
        # The claim joins the write where claim_due's one statement applies (PostgreSQL).
        in_one = (
            step_ttl is not None
            and isinstance(held, str)
            and _claims_in_one(connection, queue_limits(), taken)
        )
        if not _functions(connection):
            done = self._complete_run_portably(
                alias,
                step_id,
                result,
                attempt,
                output,
                held,
                next_pass_holder,
                next_ttl,
            )
        elif isinstance(held, str):
            done = self._complete_run_alone(
                connection,
                step_id,
                result,
                attempt,
                output,
                held,
                next_pass_holder,
                next_ttl,
                claim=step_ttl if in_one else None,
                queues=taken,
            )
        else:
            done = self._complete_run_holding(
                connection, step_id, result, attempt, output, held, next_pass_holder, next_ttl
            )
        if step_ttl is None or in_one:
            return done
        return dataclasses.replace(done, next_step=self.claim_due(step_ttl, queues=taken))

    def _complete_run_holding(
        self,
        connection: BaseDatabaseWrapper,
        step_id: int,
        result: Any,
        attempt: int,
        output: Any,
        held: Lease,
        next_pass_holder: str | None,
        next_ttl: float,
    ) -> RunCompletion:
        """:meth:`set_result_completing_run` with the run lease ``held``, tuned: one
        statement."""
        alias = connection.alias
        args: list[Any] = [
            step_id,
            json.dumps(result),
            attempt,
            json.dumps(output),
            held.key,
            held.holder,
            held.token,
        ]
        short = "complete_run"
        if next_pass_holder is not None:
            args += [next_pass_holder, next_ttl]
            short = "complete_run_picking"
        sent = time.monotonic()
        row = _call_row(connection, short, args)
        width = sql.COMPLETION_COLUMNS
        next_pass = None
        if next_pass_holder is not None and row[width] is not None:
            next_pass = _pass_claim(alias, row[width:], next_pass_holder, sent, connection)
        if row[2] is not None:
            lease_released.send_robust(sender=Lease, lease=held)
        if row[0]:
            _attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
        if row[1]:
            run_id = held.key.removeprefix(RUN_LEASE_PREFIX)
            _run_reached(alias, run_id, RunStatus.COMPLETED, output=output, finished_at=row[3])
        return RunCompletion(
            written=bool(row[0]),
            completed=bool(row[1]),
            lease_live=None if row[2] is None else bool(row[2]),
            next_pass=next_pass,
            finished_at=row[3],
        )

    def _complete_run_alone(
        self,
        connection: BaseDatabaseWrapper,
        step_id: int,
        result: Any,
        attempt: int,
        output: Any,
        holder: str,
        next_holder: str | None,
        next_ttl: float,
        *,
        claim: float | None = None,
        queues: Sequence[str] = (),
    ) -> RunCompletion:
        """:meth:`set_result_completing_run` without a held run lease, tuned: one statement;
        ``claim``: the step lease TTL (seconds) of the next due step of ``queues`` (empty:
        every queue; none of them limited) it claims too."""
        alias = connection.alias
        args: list[Any] = [
            step_id,
            json.dumps(result),
            attempt,
            json.dumps(output),
            holder,
            channel_name(alias),
        ]
        short = "complete_run_alone"
        if next_holder is not None:
            args += [next_holder, next_ttl]
            short = "complete_run_alone_picking"
        elif claim is not None:
            args += [claim, list(queues) or None]
            short = "complete_run_alone_claiming"
        sent = time.monotonic()
        row = _call_row(connection, short, args)
        width = sql.ALONE_COLUMNS
        lease_width = len(sql.LEASE_TYPES)
        next_pass = next_step = None
        picked = row[width + lease_width :]
        lapsed = False
        if claim is not None:
            lapsed, next_step = _claim_from_row(alias, picked, claim, sent)
        if next_holder is not None and picked[0] is not None:
            next_pass = _pass_claim(alias, picked, next_holder, sent, connection)
        granted = None
        if row[width] is not None:  # the instant grant: acquired and released
            granted = Lease.objects.db_manager(alias).from_returned(
                connection, row[width : width + lease_width]
            )

        def notify() -> None:
            if granted is not None:
                lease_acquired.send_robust(sender=Lease, lease=granted)
                lease_released.send_robust(sender=Lease, lease=granted)
            if row[0]:
                _attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
            if row[1] is not None:
                _run_reached(alias, row[1], RunStatus.COMPLETED, output=output, finished_at=row[2])

        if next_step is None:
            notify()
        if lapsed and claim is not None:  # a lost worker's step first: the portable path
            next_step = self.claim_due(claim, queues=queues)
        return RunCompletion(
            written=bool(row[0]),
            completed=row[1] is not None,
            lease_live=None,
            next_pass=next_pass,
            finished_at=row[2],
            pass_asked=bool(row[3]),
            next_step=next_step,
            notify=_Owed(notify) if next_step is not None and not lapsed else nothing_owed,
        )

    def _complete_run_portably(
        self,
        alias: str,
        step_id: int,
        result: Any,
        attempt: int,
        output: Any,
        lease: Lease | str,
        next_holder: str | None,
        next_ttl: float,
    ) -> RunCompletion:
        """:meth:`set_result_completing_run`'s portable path: one transaction, then the pick.
        ``lease``: the held run lease, or the holder to take it for an instant."""
        json_result = Value(result, output_field=models.JSONField())
        live: bool | None = None
        completed = asked = False
        alone = isinstance(lease, str)
        run_id: uuid.UUID | None = None
        with transaction.atomic(using=alias):
            written = bool(
                self.rows()
                .filter(fence_q(step_id, attempt))
                .update(
                    status=StepStatus.SUCCEEDED,
                    result=json_result,
                    error=None,
                    lease_expires_at=None,
                    updated_at=DbNow(),
                )
            )
            if written:
                WorkflowStepAttempt._default_manager.using(alias).filter(
                    step_id=step_id, attempt=attempt
                ).update(status=AttemptStatus.SUCCEEDED, result=json_result, finished_at=DbNow())
                _attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
                run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).get()
                runs = WorkflowRun.objects.db_manager(alias)
                leases = Lease.objects.db_manager(alias)
                held = None if isinstance(lease, str) else lease
                if isinstance(lease, str) and _lock_running(alias, run_id):
                    # The house's order: the step (written above), its run, then the run
                    # lease — taken for an instant, or found held by a pass.
                    held = leases.acquire_checked(run_lease_key(run_id), lease, next_ttl)
                    if held is None:
                        asked = bool(request_passes(alias, Q(pk=run_id)))
                if held is not None:
                    completed = runs.complete(run_id, output)
                    live = leases.release_held(held)
        next_pass = None
        if next_holder is not None:
            # Never this step's run: a pass asked for it just now, and another holds its lease.
            runs_qs = WorkflowRunQuerySet(WorkflowRun, using=alias)
            next_pass = runs_qs._claim_due_pass_portably(
                alias, next_ttl, next_holder, time.monotonic(), run_id
            )
        return RunCompletion(
            written=written,
            completed=completed,
            lease_live=None if alone else live,
            next_pass=next_pass,
            pass_asked=asked,
        )

    def set_error(
        self,
        step_id: int,
        error: BaseException | Mapping[str, Any] | str,
        attempt: int,
        *,
        hold_pass_seconds: float | None = None,
    ) -> StepWrite:
        """Record ``error`` for ``attempt`` of the step; returns a :class:`StepWrite` (status
        ``failed``).

        One conditional write through the fence. With attempts left, the next attempt becomes
        due the step's retry delay after DB now (``available_at``): ``retry_delay`` seconds
        times ``retry_backoff`` per earlier attempt, at most ``retry_delay_max``
        (:func:`retry_delay_after`); without, the run is asked
        for a pass (which fails it) — taken for the caller with ``hold_pass_seconds`` (seconds), who
        then gets the run's state in ``StepWrite.state``. The attempt row is updated in the
        same transaction. ``error`` is an exception, a JSON mapping or a message. Writing
        again the error this attempt already recorded returns ``written=False`` (safe to
        retry after a lost acknowledgement).

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
        """
        check_attempt(attempt)
        payload = error_json(error)
        hold = None if hold_pass_seconds is None else ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            config = (
                self.rows()
                .filter(pk=step_id)
                .values("retries", "retry_delay", "retry_backoff", "retry_delay_max")
                .first()
            )
            if config is None:
                raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
            exhausted = attempt >= config["retries"] + 1
            delay = retry_delay_after(
                attempt,
                config["retry_delay"],
                config["retry_backoff"],
                config["retry_delay_max"],
            )
            written = self._record_outcome(
                alias,
                step_id,
                attempt,
                step={
                    "status": StepStatus.FAILED,
                    "error": payload,
                    "result": None,
                    "lease_expires_at": None,
                    "available_at": None if exhausted else clock.db_now_plus(delay),
                },
                history={"status": AttemptStatus.FAILED, "error": payload},
                repeat_of=(AttemptStatus.FAILED, payload),
            )
            if written and exhausted:
                request_passes(alias, Q(steps__pk=step_id), hold=hold)
            elif not exhausted and not delay:
                _wake(alias)  # the next attempt is due at once
        state = self._state_after(alias, step_id, hold) if written and exhausted else None
        return StepWrite(StepStatus.FAILED, written, state)

    def suspend_for_missing_function(self, step_id: int, attempt: int, function_name: str) -> None:
        """The step function is not registered here: fail ``attempt`` with code
        ``STEP_FUNCTION_NOT_FOUND`` and suspend the run with the same error, fenced on
        ``attempt`` like :meth:`set_error`. The step is not due again until the run is resumed.

        Raises :class:`WorkflowStepSupersededError` (nothing written) for a stale attempt.
        """
        check_attempt(attempt)
        error = {
            "code": STEP_FUNCTION_NOT_FOUND,
            "message": f"No step function named {function_name!r} is registered in this process",
            "function_name": function_name,
        }
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            self._fail_attempt_for_good(alias, step_id, attempt, error)
            runs = WorkflowRun._default_manager.using(alias).filter(
                steps__pk=step_id, status=RunStatus.RUNNING
            )
            run_id = runs.values_list("pk", flat=True).first()
            if run_id is not None and runs.update(
                status=RunStatus.SUSPENDED, error=error, pass_due_at=None, updated_at=DbNow()
            ):
                _run_reached(alias, run_id, RunStatus.SUSPENDED, error=error)

    def refresh_lease(self, step_id: int, ttl: float | None, attempt: int) -> bool:
        """Extend the step lease to DB now + ``ttl`` seconds, or release it (``ttl=None``).

        Fenced: lands only while ``attempt`` is the step's running attempt (lease expiry is
        not checked — a slow worker nobody replaced still owns its attempt). Returns ``True``
        if it landed, ``False`` for a superseded or finished attempt (nothing written).
        Raises ``ValueError`` for a bad TTL or attempt.
        """
        check_attempt(attempt)
        expiry = None if ttl is None else clock.db_now_plus(ttl_seconds(ttl))
        # One statement: atomic on its own.
        return bool(self.rows().filter(fence_q(step_id, attempt)).update(lease_expires_at=expiry))

    def _fail_attempt_for_good(
        self, alias: str, step_id: int, attempt: int, error: dict[str, Any]
    ) -> bool:
        """Fail ``attempt`` with ``error`` and no retry due (step and history), through the
        fence like every outcome; returns what :meth:`_record_outcome` returns."""
        return self._record_outcome(
            alias,
            step_id,
            attempt,
            step={
                "status": StepStatus.FAILED,
                "error": error,
                "lease_expires_at": None,
                "available_at": None,
            },
            history={"status": AttemptStatus.FAILED, "error": error},
        )

    def _record_outcome(
        self,
        alias: str,
        step_id: int,
        attempt: int,
        *,
        step: dict[str, Any],
        history: dict[str, Any],
        repeat_of: tuple[str, Any] | None = None,
    ) -> bool:
        """Write ``attempt``'s outcome through the fence: ``step`` values on the step row,
        then ``history`` values on the attempt row (``finished_at`` set), inside the caller's
        transaction. Returns ``True`` when written, ``False`` when the attempt had already
        recorded exactly ``repeat_of`` (``(attempt status, result or error)``: a retried write
        whose acknowledgement was lost). Otherwise nothing is written and
        :class:`WorkflowStepSupersededError` (or ``DoesNotExist``) is raised."""
        fenced = WorkflowStep._default_manager.using(alias).filter(fence_q(step_id, attempt))
        if not fenced.update(**step, updated_at=DbNow()):
            if repeat_of is not None and self._already_recorded(
                alias, step_id, attempt, *repeat_of
            ):
                return False
            self._refuse(alias, step_id, attempt)
        WorkflowStepAttempt._default_manager.using(alias).filter(
            step_id=step_id, attempt=attempt
        ).update(**history, finished_at=DbNow())
        _attempt_finished(alias, step_id, attempt, history["status"])
        return True

    def _already_recorded(
        self, alias: str, step_id: int, attempt: int, status: str, outcome: Any
    ) -> bool:
        """Whether ``attempt`` already recorded exactly this outcome (``status`` with this
        result / error): a retried write whose first try committed but whose acknowledgement
        was lost (a dropped connection). Decided on the attempt row, which only the owner of
        the attempt writes and which keeps its outcome after the step moves on; a superseded
        attempt's row stays ``running``, so it never matches."""
        field = "result" if status == AttemptStatus.SUCCEEDED else "error"
        row = (
            WorkflowStepAttempt._default_manager.using(alias)
            .filter(step_id=step_id, attempt=attempt)
            .values("status", field)
            .first()
        )
        if row is None or row["status"] != status:
            return False
        return bool(row[field] == json.loads(json.dumps(outcome)))

    def _refuse(self, alias: str, step_id: int, attempt: int) -> None:
        row = (
            WorkflowStep._default_manager.using(alias)
            .filter(pk=step_id)
            .values_list("attempt", "run__status")
            .first()
        )
        if row is None:
            raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
        current, run_status = row
        signals.step_attempt_superseded.send_robust(
            sender=WorkflowStep,
            step_id=step_id,
            attempt=attempt,
            current_attempt=current,
            using=alias,
        )
        if current == attempt and run_status == RunStatus.CANCELLED:
            raise WorkflowStepCancelledError(step_id, attempt)
        raise WorkflowStepSupersededError(step_id, attempt, current)

    # -- reading --------------------------------------------------------------------------------

    def stored_json(self, value: Any) -> Any:
        """JSON ``value`` as this database gives it back once stored: PostgreSQL's ``jsonb``
        orders keys and rewrites numbers (:func:`~django_leases.validation.as_stored`);
        elsewhere the JSON text round-trips. A pass that replays a result in memory must see
        what a pass reading it would."""
        if self.connection().vendor == "postgresql":
            return as_stored(value)
        return json.loads(json.dumps(value))

    def history(self, run_id: uuid.UUID | str) -> list[WorkflowStepAttempt]:
        """The run's history: one :class:`WorkflowStepAttempt` per claim, oldest first.

        Each entry has its ``step`` loaded (``entry.step.step_name``). A superseded attempt
        keeps ``status == "running"`` and never shows the result or error it was refused.
        """
        return list(WorkflowStepAttempt.objects.db_manager(self.write_alias()).for_run(run_id))


class WorkflowStepAttemptQuerySet(db.RoutedQuerySet["WorkflowStepAttempt"]):
    """``WorkflowStepAttempt.objects``: read through :meth:`WorkflowStepQuerySet.history`."""

    def for_run(self, run_id: uuid.UUID | str) -> WorkflowStepAttemptQuerySet:
        """The run's attempts, oldest first, with their steps loaded."""
        return self.filter(step__run_id=parse_run_id(run_id)).select_related("step").order_by("id")

    def with_superseded(self) -> WorkflowStepAttemptQuerySet:
        """Annotate ``superseded`` (``bool``): the attempt still says ``running`` but a later
        attempt of its step was claimed, so its result, error and renewals are refused."""
        return self.annotate(
            superseded=ExpressionWrapper(
                Q(status=AttemptStatus.RUNNING, attempt__lt=F("step__attempt")),
                output_field=BooleanField(),
            )
        )


# -- the models ---------------------------------------------------------------------------------


class WorkflowRun(models.Model):
    """One execution of a ``@workflow``; replayed from the start on each orchestration pass.

    ``pass_due_at`` is set while the run needs an orchestration pass (``NULL`` otherwise); a
    worker that picks the pass pushes it one run-lease TTL ahead, so a pass whose worker died
    is picked again. ``pass_requests`` rises each time the run is asked for a pass, so a pass
    clears ``pass_due_at`` only if no new request arrived while it ran.

    ``branches_left`` is set by a pass that ends at a ``run.parallel`` to the number of its
    steps not finished yet; each result of a step decrements it, and only the one that
    brings it to 0 asks for the next pass (every finish still raises ``pass_requests``). 0
    otherwise: a request for a pass for any other reason (an exhausted failure, an event,
    an operator's retry or resume) resets it, and each pass that ends sets it afresh.
    """

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # Lookups by workflow are served by the unique (workflow, key) index: no index of its own.
    workflow = models.CharField(_("workflow"), max_length=MAX_NAME_LENGTH)
    status = models.CharField(
        _("status"), max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING
    )
    input = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    pass_due_at = models.DateTimeField(_("pass due at"), null=True, blank=True)
    pass_requests = models.PositiveBigIntegerField(default=0)
    branches_left = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text=_("Parallel steps the last pass waits on that have not finished yet."),
    )
    key = models.CharField(
        _("key"),
        max_length=MAX_KEY_LENGTH,
        null=True,
        blank=True,
        help_text=_("Idempotency key: one run per workflow and key."),
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        help_text=_("The run that started this one with run.child."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    #: Set by ``WorkflowRun.objects.start``: whether that call created the run (``False``:
    #: a run with the same key existed).
    started: bool = True

    objects: ClassVar[WorkflowRunQuerySet] = WorkflowRunQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("-created_at",)
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        permissions = (("operate_workflowrun", "Can resume, cancel and retry workflow runs"),)
        constraints = (
            # NULL keys never collide (on every backend): only keyed starts are unique.
            models.UniqueConstraint(fields=["workflow", "key"], name="dl_run_unique_key"),
        )
        indexes = (
            models.Index(
                fields=["pass_due_at"],
                name="dl_run_pass_due",
                condition=Q(pass_due_at__isnull=False),
            ),
            models.Index(fields=["status", "created_at"], name="dl_run_status"),
        )

    def __str__(self) -> str:
        return f"{self.workflow} {self.id}"

    #: Which operator operation a run in each status allows, and the rule that says so.
    OPERATIONS: ClassVar[dict[str, tuple[tuple[str, ...], str, str]]] = {
        "resume": (
            (RunStatus.SUSPENDED, RunStatus.FAILED),
            "resumed",
            "only a suspended or failed run can be",
        ),
        "cancel": (
            (RunStatus.RUNNING, RunStatus.SUSPENDED),
            "cancelled",
            "only a running or suspended run can be",
        ),
        "retry": (
            (RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.FAILED),
            "retried",
            "a step of a finished run cannot be",
        ),
    }

    def allowed_operations(self) -> list[str]:
        """The operator operations (``"resume"``, ``"cancel"``, ``"retry"`` — of a failed
        step) this run's status allows, in that order: what the admin offers and the
        QuerySet methods accept."""
        return [
            name for name, (statuses, _, _) in self.OPERATIONS.items() if self.status in statuses
        ]

    def require(self, operation: str) -> None:
        """Raise :class:`WorkflowRunStateError` unless this run's status allows
        ``operation`` (one of :attr:`OPERATIONS`)."""
        statuses, verb, rule = self.OPERATIONS[operation]
        if self.status not in statuses:
            raise WorkflowRunStateError(self.pk, self.status, verb, rule)

    @property
    def lease_key(self) -> str:
        """The key of the run lease its passes hold (``workflow-run:<id>``)."""
        return run_lease_key(self.pk)


class WorkflowStep(models.Model):
    """A step of a run, claimed by one worker at a time under a lease and an ``attempt``.

    ``attempt`` is the step's fencing number: a result, error or lease renewal lands only
    for the current attempt. ``retries`` allows at most ``retries + 1`` attempts; a failed
    attempt's retry waits ``retry_delay`` seconds times ``retry_backoff`` per earlier attempt,
    at most ``retry_delay_max`` (:func:`retry_delay_after`).
    ``lease_expires_at`` and ``available_at`` are set from the database clock.
    """

    # Served by the unique (run, step_name) index, whose leading column it is.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    step_name = models.CharField(_("step name"), max_length=MAX_NAME_LENGTH)
    function_name = models.CharField(_("function name"), max_length=MAX_NAME_LENGTH)
    data = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    retries = models.PositiveIntegerField(default=5)
    retry_delay = models.FloatField(
        default=0.0, help_text=_("Seconds before the first retry (later ones grow by the backoff).")
    )
    retry_backoff = models.FloatField(
        default=1.0,
        db_default=1.0,
        help_text=_("Factor each retry delay is multiplied by after the first (1: constant)."),
    )
    retry_delay_max = models.FloatField(
        null=True, blank=True, help_text=_("Seconds no retry delay exceeds (empty: one day).")
    )
    timeout = models.FloatField(
        null=True, blank=True, help_text=_("Seconds an attempt may run before it is failed.")
    )
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When the running attempt times out (its timeout).")
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    claimant = models.CharField(
        max_length=MAX_CLAIMANT_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text=_("Who the claim of the running attempt names, where its write named one."),
    )
    available_at = models.DateTimeField(null=True, blank=True)
    queue = models.CharField(
        max_length=MAX_QUEUE_LENGTH,
        default=DEFAULT_QUEUE,
        db_default=DEFAULT_QUEUE,
        help_text=_("The queue it is claimed from (its step function's)."),
    )
    priority = models.IntegerField(
        default=0, db_default=0, help_text=_("Higher is claimed first; FIFO within a priority.")
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[WorkflowStepQuerySet] = WorkflowStepQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("created_at", "id")
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        constraints = (
            models.UniqueConstraint(fields=["run", "step_name"], name="dl_step_unique_name"),
        )
        indexes = (
            # "Find due work": waiting steps by when they become available…
            models.Index(
                fields=["available_at"],
                name="dl_step_waiting",
                condition=Q(status__in=["pending", "scheduled", "failed"]),
            ),
            # …and running steps, by queue: few (one per busy worker thread), read whole
            # for a lapsed lease or a limited queue's count. Not by ``lease_expires_at``,
            # so a lease renewal changes no indexed column and can be a HOT update.
            models.Index(
                fields=["queue"],
                name="dl_step_running",
                condition=Q(status="running"),
            ),
            # The claim's order (priority, then first due first), for a worker of every
            # queue and for one of some queues.
            models.Index(
                fields=["-priority", "available_at", "id"],
                name="dl_step_claim_order",
                condition=Q(status__in=["pending", "scheduled", "failed"]),
            ),
            models.Index(
                fields=["queue", "-priority", "available_at", "id"],
                name="dl_step_queue_waiting",
                condition=Q(status__in=["pending", "scheduled", "failed"]),
            ),
        )

    def __str__(self) -> str:
        return gettext("%(name)s (attempt %(attempt)d, %(status)s)") % {
            "name": self.step_name,
            "attempt": self.attempt,
            "status": StepStatus(self.status).label if self.status in StepStatus else self.status,
        }

    @property
    def max_attempts(self) -> int:
        """``retries + 1``: how many attempts the step may have."""
        return self.retries + 1


class WorkflowStepAttempt(models.Model):
    """One claim of a step: the run history. A superseded attempt keeps ``running``.

    ``started_at`` and ``finished_at`` come from the database clock.
    """

    # Served by the unique (step, attempt) index, whose leading column it is.
    step = models.ForeignKey(
        WorkflowStep, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=DbNow())
    finished_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkflowStepAttemptQuerySet] = WorkflowStepAttemptQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("id",)
        verbose_name = _("step attempt")
        verbose_name_plural = _("step attempts")
        constraints = (
            models.UniqueConstraint(fields=["step", "attempt"], name="dl_attempt_unique"),
        )

    def __str__(self) -> str:
        return f"attempt {self.attempt} of {self.step_id} ({self.status})"
