"""When runs start and by when they must end (:class:`RunTiming`, the top layer of
``WorkflowRun.objects``): delayed starts (``run_after``), debounced starts (``debounce_key``
+ ``debounce``) and run deadlines (``deadline``), DESIGN §5c.

The columns it keeps on ``WorkflowRun``:

* ``first_pass_at`` — when a delayed or debounced start's first pass is due. The run is
  **pending** (no pass has run yet) while ``pass_due_at`` still equals it: a worker that
  picks the pass moves ``pass_due_at`` (one run-lease TTL ahead), so the two part in the
  very statement that starts the first pass, and a debounced start that finds them apart
  knows the run is no longer pending — decided on the row, never by a read-then-write.
* ``debounce_key`` — set only while a debounced run is pending; a unique constraint on
  ``(workflow, debounce_key)`` (NULLs never collide, on every backend) admits one such run
  per workflow and key. A start that finds the holder no longer pending clears its key
  and creates the new pending run.
* ``deadline_at`` — a run still running or suspended at that time (database clock) is
  failed by :meth:`RunTiming.expire_deadlines` (which workers call once per poll interval,
  and :func:`~django_leases.testing.drive` before each unit of work) with
  :class:`~django_leases.exceptions.WorkflowDeadlineExceeded`; its running step attempts
  are failed through their fence (so their late writes are refused, as superseded) and
  its live descendants are cancelled, all in one transaction.

Runs started with any of these options are written by the portable ORM statements (the
tuned start statement of :mod:`django_leases.workflows.sql` writes none of these columns);
every other start keeps the tuned path.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.db import IntegrityError, OperationalError, models, transaction
from django.db.models import F, Q, Value

from django_leases import clock, db
from django_leases.clock import DbNow, to_stored
from django_leases.exceptions import WorkflowDeadlineExceeded
from django_leases.frozen import frozen
from django_leases.models.operations import RunOperations
from django_leases.models.workflow_base import (
    run_reached,
    tag_model,
)
from django_leases.validation import (
    MAX_KEY_LENGTH,
    MAX_WAIT_SECONDS,
    check_name,
    error_json,
    seconds,
    wait_seconds,
)
from django_leases.workflows.values import RUN_CANCELLED, RunStatus

if TYPE_CHECKING:
    from datetime import timedelta

    from django_leases.models.workflow import WorkflowRun

#: Statuses a run can still fail from at its deadline (not finished yet).
LIVE_RUN_STATUSES = (RunStatus.RUNNING, RunStatus.SUSPENDED)

#: How many times a debounced start tries again after losing a race for its key.
_DEBOUNCE_ROUNDS = 20

#: How many times :meth:`RunTiming.expire_deadlines` starts a run's expiry over when a
#: child appeared between its scan for children and its lock on the run.
_EXPIRE_ROUNDS = 5


def check_run_after(value: object, what: str = "run_after") -> float | datetime | None:
    """``value`` as seconds (≥ 0, a number or a ``timedelta``) or a ``datetime``, or
    ``None``. A naive ``datetime`` is refused while ``USE_TZ`` is on, an aware one whose
    instant falls outside years 1 to 9999 in UTC (what a ``datetime`` read back can hold);
    NaN, infinities and negative seconds always. An aware one is returned in UTC (the same
    instant: PostgreSQL refuses a UTC offset beyond ±15:59 that Python allows). Raises
    ``ValueError`` naming ``what``."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if django_settings.USE_TZ and value.tzinfo is None:
            raise ValueError(f"{what} must be an aware datetime while USE_TZ is on, not {value!r}")
        if value.tzinfo is None:
            return value
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError(
                f"{what} must fall within the years 1 to 9999 in UTC, not {value!r}"
            ) from None
    return wait_seconds(value, what)


def check_deadline(value: object, what: str = "deadline") -> float | None:
    """``value`` as seconds > 0 (a number or a ``timedelta``), or ``None``; ``ValueError``
    naming ``what`` otherwise."""
    if value is None:
        return None
    return seconds(value, what, above_minimum=True, maximum=MAX_WAIT_SECONDS)


def check_debounce(
    debounce_key: object,
    debounce: object,
    *,
    key: object,
    run_after: object,
    parent: object = None,
) -> float | None:
    """The debounce window in seconds (> 0) when ``debounce_key`` is given, else ``None``.
    Both or neither; not with ``key``, ``run_after`` nor ``parent``. ``ValueError``
    otherwise."""
    if debounce_key is None and debounce is None:
        return None
    if debounce_key is None or debounce is None:
        raise ValueError("debounce_key and debounce go together: give both or neither")
    if key is not None:
        raise ValueError("A debounced start takes no key (debounce_key is its key)")
    if parent is not None:
        raise ValueError(
            "A debounced start takes no parent: starts of many callers make one run, which "
            "is no one run's child (start a child with run.child)"
        )
    if run_after is not None:
        raise ValueError("A debounced start takes no run_after (debounce sets its first pass)")
    check_name(debounce_key, "Debounce key", max_length=MAX_KEY_LENGTH)
    return seconds(debounce, "debounce", above_minimum=True, maximum=MAX_WAIT_SECONDS)


def _due(run_after: float | datetime | None, alias: str) -> Any:
    """The ``pass_due_at`` of a start's first pass: DB now (+ seconds), or the datetime."""
    if not run_after:  # None or 0: now, in the clock's own form
        return DbNow()
    if isinstance(run_after, datetime):
        return to_stored(run_after, alias)
    return clock.db_now_plus(run_after)


def _pending() -> Q:
    """A debounced or delayed run whose first pass has not started (see the module)."""
    return Q(status=RunStatus.RUNNING, pass_due_at=F("first_pass_at"))


def _not_pending() -> Q:
    """The negation of :func:`_pending`, spelled out for NULLs (``first_pass_at`` is set on
    every debounced run)."""
    return (
        ~Q(status=RunStatus.RUNNING)
        | Q(pass_due_at=None)
        | Q(pass_due_at__lt=F("first_pass_at"))
        | Q(pass_due_at__gt=F("first_pass_at"))
    )


@frozen
class _DebouncedStart:
    """A debounced :meth:`RunTiming.start`'s arguments, checked: the run's workflow and
    input (``value``), its debounce key, the window and the deadline (seconds; ``None``:
    none), its tags and its queue key."""

    workflow: str
    value: Any
    debounce_key: str
    window: float
    limit: float | None
    tags: dict[str, str] | None
    queue_key: str


class RunTiming(RunOperations):
    """Delayed starts, debounced starts and run deadlines."""

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        key: str | None = None,
        parent: uuid.UUID | None = None,
        run_after: float | timedelta | datetime | None = None,
        deadline: float | timedelta | None = None,
        debounce_key: str | None = None,
        debounce: float | timedelta | None = None,
        tags: Mapping[str, str] | None = None,
        queue_key: str | None = None,
    ) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` with JSON ``input``, due for its first
        pass (:meth:`~django_leases.models.passes.RunPasses.start`: ``key``, ``parent``,
        ``tags`` and ``queue_key``), with these options:

        Args:
            run_after: seconds ≥ 0 (a number or a ``timedelta``, counted on the database
                clock) or a ``datetime`` (aware while ``USE_TZ`` is on): the first pass is
                not due before then.
            deadline: seconds > 0 (a number or a ``timedelta``) from now on the database
                clock: a run not finished by then is failed with
                :class:`~django_leases.exceptions.WorkflowDeadlineExceeded`
                (:meth:`expire_deadlines`). A child run (``parent``) never outlives its
                parent's deadline: its own is the earlier of the two, and without one of
                its own it takes its parent's.
            debounce_key: a ``str`` (1–255 characters), with ``debounce`` (not with
                ``key``, ``run_after`` nor ``parent``): at most one **pending** run (no pass
                has run yet) per workflow and debounce key. A start while one is pending
                replaces its input (and its deadline, tags and queue key where this start
                gives them: those it leaves out are kept), moves its first pass to DB now +
                ``debounce`` and returns it (``started`` ``False``); otherwise a new pending
                run is created the same way. Concurrent starts make one run (a unique
                constraint decides).
            debounce: the debounce window, seconds > 0 (a number or a ``timedelta``).

        Returns the run (``started``: whether this call created it). Safe inside an outer
        transaction (a debounced start that meets a deadlock on MariaDB / MySQL there
        raises the database's ``OperationalError``; on its own it starts over).

        Raises:
            ValueError: a bad name, key, input or option, or options that do not go
                together; nothing is written then.
        """
        after = check_run_after(run_after)
        limit = check_deadline(deadline)
        window = check_debounce(debounce_key, debounce, key=key, run_after=run_after, parent=parent)
        tagged, keyed = self._check_start(workflow, input, key, tags, queue_key)
        alias = self.write_alias()
        cap = None
        if parent is not None:
            cap = self.rows().filter(pk=parent).values_list("deadline_at", flat=True).first()
        if after is None and limit is None and window is None and cap is None:
            return super().start(
                workflow, input, key=key, parent=parent, tags=tagged, queue_key=queue_key
            )
        value = {} if input is None else input
        if window is not None:
            assert debounce_key is not None  # checked with the window
            return self._debounced(
                alias, _DebouncedStart(workflow, value, debounce_key, window, limit, tagged, keyed)
            )

        def capped(run: WorkflowRun) -> None:  # never later than the parent's deadline
            if cap is not None:
                self.rows().filter(pk=run.pk).filter(
                    Q(deadline_at=None) | Q(deadline_at__gt=cap)
                ).update(deadline_at=cap)

        return self._insert_started(
            alias,
            wake=after is None,
            then=capped,
            workflow=workflow,
            input=value,
            key=key,
            parent_id=parent,
            pass_due_at=_due(after, alias),
            # Pending until its first pass is picked (one statement: one clock).
            first_pass_at=None if after is None else _due(after, alias),
            pass_requests=1,
            deadline_at=None if limit is None else clock.db_now_plus(limit),
            tags=tagged,
            queue_key=keyed,
        )

    def _debounced(self, alias: str, start: _DebouncedStart) -> WorkflowRun:
        """:meth:`start`'s debounced start (arguments checked)."""

        def once() -> WorkflowRun | None:
            with transaction.atomic(using=alias):
                return self._debounce_once(alias, start)

        for _ in range(_DEBOUNCE_ROUNDS):
            # A deadlock (MariaDB / MySQL) is run again at once; a lost race, by this loop.
            run = db.again_after_whole_rollback(alias, once)
            if run is not None:
                if run.started:
                    self._started(alias, run.pk, start.workflow)
                return run
        raise OperationalError(
            f"Debounced start of {start.workflow!r} with key {start.debounce_key!r} lost its race "
            f"{_DEBOUNCE_ROUNDS} times"
        )

    def _debounce_once(self, alias: str, start: _DebouncedStart) -> WorkflowRun | None:
        """One try inside the caller's transaction: move the pending run, or free the key of
        a run no longer pending and create one; ``None`` when a concurrent start took the
        key first (the caller tries again)."""
        workflow, value, debounce_key = start.workflow, start.value, start.debounce_key
        window, limit, tags, queue_key = start.window, start.limit, start.tags, start.queue_key
        holding = self.rows().filter(workflow=workflow, debounce_key=debounce_key)
        due = clock.db_now_plus(window)
        # One guarded UPDATE decides: the run is still pending (its first pass not picked).
        # What this start gives replaces the pending run's; what it leaves out (no deadline,
        # no tags, no queue key) the run keeps.
        given: dict[str, Any] = {}
        if limit is not None:
            given["deadline_at"] = clock.db_now_plus(limit)
        if tags is not None:
            given["tags"] = tags
        if queue_key:
            given["queue_key"] = queue_key
        moved = holding.filter(_pending()).update(
            input=Value(value, output_field=models.JSONField()),
            pass_due_at=due,
            first_pass_at=due,
            updated_at=DbNow(),
            **given,
        )
        if moved:
            run = holding.get()
            if tags is not None:
                tag_model().objects.db_manager(alias).write(run.pk, tags)
            run.started = False
            return run
        # A holder no longer pending gives its key up (one that became pending since the
        # UPDATE above — a concurrent start's — keeps it, and the insert below loses).
        holding.filter(_not_pending()).update(debounce_key=None)
        try:
            with transaction.atomic(using=alias):
                # One statement: the database clock reads the same in both columns.
                run = self._create_tagged(
                    alias,
                    workflow=workflow,
                    input=value,
                    debounce_key=debounce_key,
                    pass_due_at=due,
                    first_pass_at=due,
                    pass_requests=1,
                    deadline_at=None if limit is None else clock.db_now_plus(limit),
                    tags=tags,
                    queue_key=queue_key,
                )
        except IntegrityError:
            return None
        run.started = True
        return run

    def pending(self) -> RunTiming:
        """Runs of a delayed or debounced start whose first pass has not started yet."""
        return self.filter(_pending())

    def start_pending_now(self) -> int:
        """Make every pending run (:meth:`pending`, a delayed or debounced start) due now on
        the database clock, still pending; returns how many. For tests
        (:func:`~django_leases.testing.drive` jumps them so)."""
        return (
            self.rows()
            .filter(_pending(), pass_due_at__gt=DbNow())
            .update(pass_due_at=DbNow(), first_pass_at=DbNow())
        )

    # -- deadlines ------------------------------------------------------------------------

    def past_deadline(self) -> models.QuerySet[WorkflowRun]:
        """The running or suspended runs whose ``deadline_at`` has passed on the database
        clock: what :meth:`expire_deadlines` fails."""
        return self.rows().filter(status__in=LIVE_RUN_STATUSES, deadline_at__lte=DbNow())

    def expire_deadlines(self, limit: int = 100) -> list[uuid.UUID]:
        """Fail every running or suspended run whose ``deadline_at`` has passed on the
        database clock (at most ``limit``, an int ≥ 1, earliest first), each in a
        transaction of its own, with error type
        :class:`~django_leases.exceptions.WorkflowDeadlineExceeded`.

        In that transaction, as a cancel does: its live descendants (running or suspended
        child runs, theirs…) are cancelled (code ``RUN_CANCELLED``); its running step
        attempts are failed through their fence, so a late result, error or renewal of
        theirs is refused (:class:`WorkflowStepSupersededError`, dropped quietly by the
        engine) and the worker's ``ctx.lease_lost`` is set at its next renewal; its waiting
        steps leave the due-work index; its parent is asked for a pass. A write that
        committed first stays: a run completed before its expiry is not touched.

        Returns the ids of the runs failed. Raises ``ValueError`` for a bad ``limit``.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int ≥ 1, not {limit!r}")
        due = list(
            self.past_deadline()
            .order_by("deadline_at", "created_at", "id")
            .values_list("pk", flat=True)[:limit]
        )
        alias = self.write_alias()
        return [pk for pk in due if self._expire(alias, pk)]

    def _expire(self, alias: str, pk: uuid.UUID) -> bool:
        """Fail run ``pk`` at its deadline if it is still live and past it (see
        :meth:`expire_deadlines`); ``True`` if it was."""
        cascaded = {
            "code": RUN_CANCELLED,
            "message": f"The run was cancelled: its parent run {pk} passed its deadline",
        }

        def lock() -> WorkflowRun | None:
            try:
                run = self._lock_for_operator(alias, pk)
            except self.model.DoesNotExist:  # pruned meanwhile
                return None
            past = self.rows().filter(pk=pk, status__in=LIVE_RUN_STATUSES, deadline_at__lte=DbNow())
            # Finished (or moved) meanwhile: the children's cancel is rolled back.
            return run if past.exists() else None

        def end(run: WorkflowRun, late: list[uuid.UUID]) -> bool:
            self._cancel_children(alias, late, cascaded)
            self._fail_at_deadline(alias, run)
            return True

        # Children locked before their parent, as RunOperations.cancel does (and why).
        return bool(self._end_with_descendants(alias, pk, cascaded, _EXPIRE_ROUNDS, lock, end))

    def _fail_at_deadline(self, alias: str, run: WorkflowRun) -> None:
        """Fail the locked ``run`` with its deadline error (inside the caller's
        transaction): its running attempts failed through their fence, waiting steps out
        of the due-work index."""
        error = error_json(WorkflowDeadlineExceeded(run.pk, run.deadline_at))
        self._end_locked(alias, run, RunStatus.FAILED, error, branches_left=0, debounce_key=None)
        run_reached(alias, run.pk, RunStatus.FAILED, error=error)

    def deadline_due_within(self, horizon: float) -> bool:
        """Whether a live run's deadline passes within ``horizon`` seconds of DB now."""
        until = clock.db_now_plus(horizon)
        return self.rows().filter(status__in=LIVE_RUN_STATUSES, deadline_at__lte=until).exists()


__all__ = [
    "LIVE_RUN_STATUSES",
    "RunTiming",
    "check_deadline",
    "check_debounce",
    "check_run_after",
]
