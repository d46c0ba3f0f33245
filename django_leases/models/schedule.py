"""Workflow schedules and the rules that fire them exactly once (DESIGN §5b):
``WorkflowSchedule.objects``.

A row per declared schedule (:mod:`django_leases.workflows.schedules`), synced from the
declarations as trigger sources are: :meth:`~WorkflowScheduleQuerySet.sync` upserts the
declared rows and marks the others ``declared=False`` (they stop firing; the row stays, with
its history, until the declaration comes back or an operator deletes it). It never touches
``paused``.

**Firing** (:meth:`~WorkflowScheduleQuerySet.fire_due`, called by every workflow worker
about once a second): a schedule is due when its ``next_tick`` has passed on the **database
clock**. For each due schedule one transaction

1. advances ``next_tick`` with a guarded ``UPDATE … WHERE next_tick = <the tick read>`` (a
   compare-and-set: of several workers reading the same tick exactly one matches the row, the
   others match nothing once the winner commits and start nothing), and
2. starts the tick's run with the idempotency key ``schedule:<name>:<tick>``
   (``WorkflowRun.objects.start``; unique per workflow in the database), so even a tick
   fired twice could not create a second run.

In that same transaction, after the guarded ``UPDATE`` has locked the row, the schedule's
``overlap`` policy is applied against its previous run (``last_run_id``, read under the lock):
while that run is live (running or suspended) ``"skip"`` starts nothing and records the
tick as skipped (``last_skipped_tick``, ``last_skip_reason``, ``skipped_ticks``),
``"buffer_one"`` keeps it in ``buffered_tick`` (a tick finding one already there is skipped),
``"cancel_other"`` cancels that run and starts the tick's, ``"allow"`` starts it anyway.
A buffered tick is started by the first ``fire_due`` that finds the previous run ended
(again under the row's lock), so of a schedule's own ticks at most one run is live under
``"skip"`` and ``"buffer_one"``.

A task schedule (``task`` set) enqueues a Django ``@task`` per tick instead: ``fire_due``
calls the ``start_task`` it is given (:data:`TaskStarter`, the Tasks backend's
``enqueue_for_tick``) inside the same transaction, with the tick key.

**Backfill** (:meth:`~WorkflowScheduleQuerySet.backfill`): an operator starts every tick of a
past window, each by its tick key (so exactly once, however often and however concurrently the
window is backfilled, and never a second run for a tick the schedule fired itself); each
backfill is recorded as a :class:`WorkflowScheduleBackfill`.

A tick fired more than :data:`~django_leases.workflows.schedules.MISSED_AFTER` seconds late
was missed (no worker ran at its time): ``catch_up="latest"`` starts one run for the latest
due tick, ``"none"`` starts none and waits for the next tick. A new schedule, a changed
expression or time zone, and a resumed schedule start counting from the next tick after
*now*: ticks before the schedule existed, or while it was paused, never run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import InterfaceError, OperationalError, connections, models, transaction
from django.db.models import F
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.exceptions import UnknownScheduleError, WorkflowRunStateError
from django_leases.frozen import frozen
from django_leases.models.workflow import WorkflowRun
from django_leases.validation import MAX_NAME_LENGTH, check_json
from django_leases.workflows.schedules import (
    CATCH_UP_POLICIES,
    MAX_CRON_LENGTH,
    MISSED_AFTER,
    OVERLAP_POLICIES,
    ScheduleDeclaration,
    latest_tick,
    next_tick,
    run_key,
    ticks_between,
)
from django_leases.workflows.values import RunStatus

__all__ = [
    "SKIP_REASONS",
    "Backfilled",
    "Fired",
    "TaskStarter",
    "WorkflowSchedule",
    "WorkflowScheduleBackfill",
    "WorkflowScheduleQuerySet",
]

#: Starts the run of a task schedule's tick: ``(alias, task path, args, kwargs, key)`` →
#: ``(run id, started)`` (``started`` ``False``: the key's run existed). Called inside the
#: firing transaction, on database ``alias``.
TaskStarter = Callable[[str, str, list[Any], dict[str, Any], str], tuple[uuid.UUID, bool]]

#: Why a tick started no run: its schedule's previous run was still live (``"overlap"``,
#: policy ``skip``), a tick was already waiting for it (``"buffer_full"``, ``buffer_one``), or
#: no worker fired it in time (``"missed"``, the catch-up policy).
SKIP_REASONS = ("overlap", "buffer_full", "missed")
_LIVE = (RunStatus.RUNNING, RunStatus.SUSPENDED)

logger = logging.getLogger("django_leases.workflows")

#: Errors of the connection rather than of one schedule: ``fire_due`` lets them out.
_CONNECTION_FAULTS = (OperationalError, InterfaceError)

#: The last failure said of each schedule in this process (``fire_due``): a schedule that
#: keeps failing the same way is warned of once, not at every look.
_said_failures: dict[str, str] = {}

#: Most firing rounds one :meth:`WorkflowScheduleQuerySet.fire_due` call makes (a round fires
#: at most one tick of each due schedule; late ticks within ``MISSED_AFTER`` take a round each).
MAX_ROUNDS = 64


def _say_failure(name: str, exc: Exception) -> None:
    """Log that schedule ``name``'s tick failed to start with ``exc``: a warning the first
    time it fails so, then at debug level while it keeps failing the same way."""
    said = f"{type(exc).__name__}: {exc}"
    level = logging.DEBUG if _said_failures.get(name) == said else logging.WARNING
    _said_failures[name] = said
    logger.log(
        level,
        "Schedule %r: its tick could not start (%s); it stays due and is tried again, the "
        "other schedules fire meanwhile",
        name,
        said,
    )


@frozen
class Fired:
    """What one firing did to a schedule.

    Attributes:
        name: the schedule.
        tick: the tick a run was started for (aware UTC), or ``None`` when missed ticks were
            skipped (``catch_up="none"``).
        run_id: the run of that tick (``None`` when skipped).
        next_tick: the schedule's next tick now (aware UTC; ``None``: it never matches again).
        skipped: ticks passed over without a run (missed ones; an estimate, at least 0).
        action: what the tick did: ``"started"`` (a run), ``"skipped"`` (none: its previous
            run was live, or a tick already waited), ``"buffered"`` (it waits for the
            previous run), ``"missed"`` (missed ticks passed over, ``tick`` ``None``).
        reason: for ``"skipped"``, one of :data:`SKIP_REASONS`; else ``""``.
        cancelled: the live run cancelled for this tick (``"cancel_other"``), or ``None``.
    """

    name: str
    tick: datetime | None
    run_id: uuid.UUID | None
    next_tick: datetime | None
    skipped: int = 0
    action: str = "started"
    reason: str = ""
    cancelled: uuid.UUID | None = None


@frozen
class Backfilled:
    """What a backfill did.

    Attributes:
        name: the schedule.
        ticks: the window's ticks (aware UTC), oldest first.
        started: the ids of the runs it started (ticks that had none yet).
        existing: the ids of the runs the other ticks already had (by their tick key).
        backfill_id: the :class:`WorkflowScheduleBackfill` row recording it.
    """

    name: str
    ticks: list[datetime]
    started: list[uuid.UUID]
    existing: list[uuid.UUID]
    backfill_id: int


def _declared_values(schedule: ScheduleDeclaration) -> dict[str, Any]:
    """The columns a declaration sets on its row (all but ``name``): what :meth:`sync`
    writes on a new row and overwrites on an existing one."""
    return {
        "workflow": schedule.workflow,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "input": schedule.input,
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "task": schedule.task,
    }


class WorkflowScheduleQuerySet(db.RoutedQuerySet["WorkflowSchedule"]):
    """Domain methods of ``WorkflowSchedule.objects``. Each opens the transaction it needs."""

    def _rows(self, alias: str) -> models.QuerySet[WorkflowSchedule]:
        return self.model._default_manager.using(alias).all()

    # -- reading ------------------------------------------------------------------------------

    def named(self, name: str) -> WorkflowSchedule:
        """The row of schedule ``name``; raises :class:`UnknownScheduleError` if there is none."""
        row = self.filter(name=name).first() if isinstance(name, str) else None
        if row is None:
            raise UnknownScheduleError(name)
        return row

    def due(self) -> WorkflowScheduleQuerySet:
        """Declared, unpaused schedules whose ``next_tick`` has passed on the database clock."""
        return self.filter(declared=True, paused=False, next_tick__lte=DbNow())

    # -- writing ------------------------------------------------------------------------------

    def sync(self, declared: Iterable[ScheduleDeclaration]) -> list[WorkflowSchedule]:
        """Make the rows match the declarations (``registry.declared_schedules()``).

        Upserts each declared row (workflow or task, cron, time zone, input, catch-up,
        overlap, ``declared=True``); a new row, or one whose cron expression or time zone
        changed, gets its ``next_tick`` counted from database now. Every other row becomes
        undeclared (it stops firing; nothing is deleted). ``paused`` is never touched.
        Concurrent syncs leave one row per name and take turns: each locks the declared
        rows in name order. On MariaDB / MySQL a sync that deadlocks all the same (racing one
        of other declarations) runs again, unless it was called inside a transaction of the
        caller's. Returns every row, sorted by name.

        Raises ``ValueError`` for two declarations with one name, or for an input this
        database's JSON columns cannot store (nested deeper than MariaDB's 31 levels; a
        declaration checks it against the package's own limit only), naming the schedule
        (nothing written).
        """
        schedules = sorted(declared, key=lambda schedule: schedule.name)
        names = [schedule.name for schedule in schedules]
        if len(set(names)) != len(names):
            raise ValueError("sync() got two schedules with the same name")
        alias = self.write_alias()
        for schedule in schedules:
            check_json(schedule.input, f"Schedule {schedule.name!r}: the input", using=alias)
        return db.again_after_whole_rollback(alias, lambda: self._sync(alias, schedules, names))

    def _sync(
        self, alias: str, schedules: list[ScheduleDeclaration], names: list[str]
    ) -> list[WorkflowSchedule]:
        """:meth:`sync`'s one transaction."""
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            new = [self.model(name=s.name, **_declared_values(s)) for s in schedules]
            if connections[alias].vendor == "mysql":
                # An upsert (ON DUPLICATE KEY UPDATE, here changing nothing) locks each row at
                # once, in name order, creating it if need be: racing syncs queue behind the
                # first. INSERT IGNORE's duplicate-key check would take a shared lock first,
                # and two syncs upgrading theirs for the updates below would deadlock.
                rows.bulk_create(new, update_conflicts=True, update_fields=["name"])
            else:
                rows.bulk_create(new, ignore_conflicts=True)
            for s in schedules:
                # A changed expression or zone counts again from now (next_tick cleared here,
                # set below); the rest is overwritten.
                rows.filter(name=s.name).exclude(cron=s.cron, timezone=s.timezone).update(
                    next_tick=None
                )
                rows.filter(name=s.name).update(
                    **_declared_values(s), declared=True, updated_at=DbNow()
                )
            rows.filter(declared=True).exclude(name__in=names).update(
                declared=False, updated_at=DbNow()
            )
            self._count_from_now(alias, rows.filter(name__in=names, next_tick__isnull=True))
            return list(rows.order_by("name"))

    def _count_from_now(self, alias: str, rows: models.QuerySet[WorkflowSchedule]) -> None:
        """Set ``next_tick`` of ``rows`` (locked) to their first tick after database now."""
        for row in _for_update(rows, alias).annotate(db_now=DbNow()).order_by("name"):
            now = to_aware(row.db_now, alias)
            self._rows(alias).filter(pk=row.pk).update(
                next_tick=to_stored(next_tick(row.cron, row.timezone, now), alias)
            )

    def set_paused(self, name: str, paused: bool) -> bool:
        """Pause (``True``) or resume (``False``) schedule ``name``; returns ``True`` if the
        flag changed. A paused schedule starts no run. Resuming counts from the next tick
        after database now: ticks that passed while it was paused never run (there is no
        catch-up for them).

        Raises :class:`UnknownScheduleError` for an unknown name and ``ValueError`` for a
        non-bool ``paused`` (nothing written)."""
        if not isinstance(paused, bool):
            raise ValueError(f"paused must be True or False, not {paused!r}")
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            changed = rows.filter(name=name, paused=not paused).update(
                paused=paused, updated_at=DbNow()
            )
            if not changed:
                if not rows.filter(name=name).exists():
                    raise UnknownScheduleError(name)
                return False
            if not paused:
                self._count_from_now(alias, rows.filter(name=name))
            return True

    def fire_due(self, *, start_task: TaskStarter | None = None) -> list[Fired]:
        """Start the run of every due tick of every due schedule, each exactly once across
        all callers (see the module docstring), under each schedule's overlap policy, and
        the buffered ticks whose previous run has ended; returns what was fired, oldest first.

        ``start_task`` (:data:`TaskStarter`) enqueues the task of a task schedule's tick;
        without it, task schedules are left due (another caller fires them).

        Safe to call from any number of threads and processes at once: each tick is taken
        by one guarded ``UPDATE`` and its run is started in the same transaction, with the
        tick as the run's idempotency key. Late ticks (within ``MISSED_AFTER``) are fired one
        by one, each with its own run; older ones follow the schedule's ``catch_up``.

        A schedule whose tick fails to start (its task refused by the backend, a value the
        database refuses) is rolled back alone — its tick stays due, tried again at the next
        call — and logged (once while it fails the same way); the others are fired all the
        same. An error of the connection (``OperationalError``, ``InterfaceError``)
        propagates (nothing of the failed transaction is kept).
        """
        alias = self.write_alias()
        fired: list[Fired] = []
        failed: set[str] = set()

        def attempt(
            row: WorkflowSchedule,
            fire: Callable[[str, WorkflowSchedule, TaskStarter | None], Fired | None],
        ) -> bool:
            """Fire ``row`` by ``fire`` (:meth:`_fire`, :meth:`_start_buffered`); whether it
            did. A failure of its own sets it aside for the rest of this call."""
            if row.name in failed:
                return False
            try:
                outcome = fire(alias, row, start_task)
            except _CONNECTION_FAULTS:
                raise
            except Exception as exc:
                failed.add(row.name)
                _say_failure(row.name, exc)
                return False
            _said_failures.pop(row.name, None)
            if outcome is None:
                return False
            fired.append(outcome)
            return True

        for _round in range(MAX_ROUNDS):
            rows = self._rows(alias).filter(declared=True, paused=False)
            if start_task is None:
                rows = rows.filter(task="")
            progress = False
            for row in rows.filter(buffered_tick__isnull=False).order_by("name"):
                if attempt(row, self._start_buffered):
                    progress = True
            due = list(rows.filter(next_tick__lte=DbNow()).annotate(db_now=DbNow()))
            for row in sorted(due, key=lambda row: (row.next_tick, row.name)):
                if attempt(row, self._fire):
                    progress = True
            if not progress:
                break
        return fired

    def _fire(
        self, alias: str, row: WorkflowSchedule, start_task: TaskStarter | None = None
    ) -> Fired | None:
        """Fire ``row``'s due tick (read with the ``db_now`` annotation), unless another
        caller did since it was read: then ``None``, and nothing is written."""
        assert row.next_tick is not None  # due rows have one
        now = to_aware(row.db_now, alias)  # type: ignore[attr-defined]  # the annotation
        due = to_aware(row.next_tick, alias)
        tick: datetime | None = due
        skipped = 0
        if (now - due).total_seconds() > MISSED_AFTER:
            latest = latest_tick(row.cron, row.timezone, now)
            fresh = latest is not None and (now - latest).total_seconds() <= MISSED_AFTER
            tick = latest if row.catch_up == "latest" or fresh else None
            skipped = _estimate_between(row, due, tick or now)
            following = next_tick(row.cron, row.timezone, now)
        else:
            following = next_tick(row.cron, row.timezone, due)
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            taken = rows.filter(
                pk=row.pk,
                next_tick=row.next_tick,
                cron=row.cron,
                timezone=row.timezone,
                catch_up=row.catch_up,
                # A caller without start_task leaves a schedule turned task meanwhile due.
                task=row.task,
                declared=True,
                paused=False,
            ).update(next_tick=to_stored(following, alias), updated_at=DbNow())
            if not taken:
                return None
            if skipped:
                # The latest missed one (the one before ``tick``, or before now).
                last_missed = latest_tick(row.cron, row.timezone, (tick or now) - _JUST_BEFORE)
                self._skipped(alias, row.pk, last_missed or due, "missed", skipped)
            if tick is None:
                return Fired(row.name, None, None, following, skipped, action="missed")
            # Read again under the row's lock (taken by the UPDATE): what ran last, what
            # waits, and what a tick starts (an edit committed since the first read counts).
            row = rows.get(pk=row.pk)
            policy = row.overlap
            previous = row.last_run_id
            live = previous is not None and policy != "allow" and self._live(alias, previous)
            if not live and row.buffered_tick is not None:
                # A waiting tick goes first; this one then meets its run.
                waited = to_aware(row.buffered_tick, alias)
                previous, _ = self._start_tick(alias, row, waited, start_task)
                live = True
            cancelled = None
            if live and policy == "skip":
                self._skipped(alias, row.pk, tick, "overlap")
                return Fired(row.name, tick, None, following, skipped, "skipped", "overlap")
            if live and policy == "buffer_one":
                if rows.filter(pk=row.pk, buffered_tick__isnull=True).update(
                    buffered_tick=to_stored(tick, alias)
                ):
                    return Fired(row.name, tick, None, following, skipped, "buffered")
                self._skipped(alias, row.pk, tick, "buffer_full")
                return Fired(row.name, tick, None, following, skipped, "skipped", "buffer_full")
            if live and policy == "cancel_other":
                assert previous is not None
                try:
                    WorkflowRun.objects.db_manager(alias).cancel(
                        previous,
                        message=(
                            f"The run was cancelled by the tick {tick.isoformat()} of schedule "
                            f"{row.name!r} (overlap cancel_other)"
                        ),
                    )
                    cancelled = previous
                except WorkflowRunStateError:
                    pass  # it ended meanwhile
            run_id, _ = self._start_tick(alias, row, tick, start_task)
        return Fired(row.name, tick, run_id, following, skipped, cancelled=cancelled)

    def _live(self, alias: str, run_id: uuid.UUID) -> bool:
        """Whether run ``run_id`` is running or suspended (a pruned run is not)."""
        runs = WorkflowRun.objects.db_manager(alias).filter(pk=run_id, status__in=_LIVE)
        return runs.exists()

    def _start_tick(
        self,
        alias: str,
        row: WorkflowSchedule,
        tick: datetime,
        start_task: TaskStarter | None,
    ) -> tuple[uuid.UUID, bool]:
        """Start (by its tick key) the run of ``row``'s ``tick`` inside the caller's
        transaction and make it the schedule's last run (no tick waits then);
        ``(run id, started)``."""
        run_id, started = self._start_keyed(alias, row, tick, start_task)
        self._rows(alias).filter(pk=row.pk).update(
            last_tick=to_stored(tick, alias),
            last_run_id=run_id,
            buffered_tick=None,
        )
        return run_id, started

    def _skipped(self, alias: str, pk: int, tick: datetime, reason: str, count: int = 1) -> None:
        """Record that ``count`` ticks of schedule ``pk``, the last at ``tick``, started no
        run, for ``reason`` (one of :data:`SKIP_REASONS`)."""
        self._rows(alias).filter(pk=pk).update(
            last_skipped_tick=to_stored(tick, alias),
            last_skip_reason=reason,
            skipped_ticks=F("skipped_ticks") + count,
        )

    def _start_buffered(
        self, alias: str, row: WorkflowSchedule, start_task: TaskStarter | None
    ) -> Fired | None:
        """Start ``row``'s buffered tick if its previous run has ended; ``None`` when it has
        not, or another caller started it (nothing written then)."""
        if row.last_run_id is not None and self._live(alias, row.last_run_id):
            return None
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            if not rows.filter(
                pk=row.pk,
                buffered_tick=row.buffered_tick,
                task=row.task,
                declared=True,
                paused=False,
            ).update(updated_at=DbNow()):
                return None
            row = rows.get(pk=row.pk)  # read again under the lock, as in _fire
            previous = row.last_run_id
            if previous is not None and self._live(alias, previous):
                return None  # a run started since it was read: the tick waits on
            assert row.buffered_tick is not None
            tick = to_aware(row.buffered_tick, alias)
            run_id, _ = self._start_tick(alias, row, tick, start_task)
            following = row.next_tick
        shown = None if following is None else to_aware(following, alias)
        return Fired(row.name, tick, run_id, shown)

    def backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        start_task: TaskStarter | None = None,
    ) -> Backfilled:
        """Start the run of every tick of schedule ``name`` from ``start`` (included) to
        ``end`` (excluded), each by its tick key: a tick that has a run (fired by the
        schedule, or by an earlier or concurrent backfill) gets no second one. The overlap
        policy does not apply (the operator asked for each tick), and the backfilled runs
        are not the schedule's "previous run". Records a :class:`WorkflowScheduleBackfill`
        (its counts updated as the ticks are started, ``finished_at`` set at the end).

        Args:
            name: the schedule's name (its row must exist: ``sync`` first).
            start: an aware ``datetime``.
            end: an aware ``datetime`` after ``start``, not after database now.
            start_task: enqueues a task schedule's ticks (:data:`TaskStarter`; required
                for one).

        Returns a :class:`Backfilled`. Raises :class:`UnknownScheduleError` for an unknown
        schedule and ``ValueError`` for a naive, reversed or future window, one of more
        than ``MAX_BACKFILL_TICKS`` ticks, or a task schedule without ``start_task`` —
        nothing written then.
        """
        for value, what in ((start, "start"), (end, "end")):
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise ValueError(f"the backfill's {what} must be an aware datetime, not {value!r}")
        alias = self.write_alias()
        rows = self._rows(alias)
        row = rows.filter(name=name).annotate(db_now=DbNow()).first()
        if row is None:
            raise UnknownScheduleError(name)
        if row.task and start_task is None:
            raise ValueError(f"schedule {name!r} enqueues a task: give start_task")
        now = to_aware(row.db_now, alias)
        if end > now:
            raise ValueError(
                f"the backfill's end ({end.isoformat()}) is after now ({now.isoformat()}): "
                "ticks to come are the schedule's own"
            )
        ticks = ticks_between(row.cron, row.timezone, start, end)
        stored_start, stored_end = to_stored(start, alias), to_stored(end, alias)
        assert stored_start is not None and stored_end is not None  # aware values given
        record = WorkflowScheduleBackfill.objects.db_manager(alias).create(
            schedule_id=row.pk, start=stored_start, end=stored_end, ticks=len(ticks)
        )
        started: list[uuid.UUID] = []
        existing: list[uuid.UUID] = []
        for offset in range(0, len(ticks), _BACKFILL_BATCH):
            batch = ticks[offset : offset + _BACKFILL_BATCH]
            with transaction.atomic(using=alias):
                new = 0
                for tick in batch:
                    run_id, fresh = self._start_keyed(alias, row, tick, start_task)
                    (started if fresh else existing).append(run_id)
                    new += fresh
                WorkflowScheduleBackfill.objects.db_manager(alias).filter(pk=record.pk).update(
                    started=F("started") + new, existing=F("existing") + len(batch) - new
                )
        WorkflowScheduleBackfill.objects.db_manager(alias).filter(pk=record.pk).update(
            finished_at=DbNow()
        )
        return Backfilled(name, ticks, started, existing, record.pk)

    def _start_keyed(
        self, alias: str, row: WorkflowSchedule, tick: datetime, start_task: TaskStarter | None
    ) -> tuple[uuid.UUID, bool]:
        """Start the run of ``row``'s ``tick`` by its tick key (a task schedule's through
        ``start_task``); ``(run id, started)``, ``started`` ``False`` when the key's run
        existed (nothing written then)."""
        key = run_key(row.name, tick)
        if not row.task:
            run = WorkflowRun.objects.db_manager(alias).start(row.workflow, row.input, key=key)
            return run.id, run.started
        if start_task is None:
            raise ValueError(f"schedule {row.name!r} enqueues a task: give start_task")
        arguments = row.input if isinstance(row.input, dict) else {}
        return start_task(
            alias,
            row.task,
            list(arguments.get("args", [])),
            dict(arguments.get("kwargs", {})),
            key,
        )


#: Ticks a backfill starts per transaction.
_BACKFILL_BATCH = 100
#: Just before an instant (for "the latest tick before").
_JUST_BEFORE = timedelta(microseconds=1)


def _estimate_between(row: WorkflowSchedule, first: datetime, last: datetime) -> int:
    """How many ticks of ``row`` lie in ``[first, last)`` (counted up to 1000; the ticks
    skipped for the log)."""
    count = 0
    moment: datetime | None = first
    while moment is not None and moment < last and count < 1000:
        count += 1
        moment = next_tick(row.cron, row.timezone, moment)
    return count


def _for_update(
    rows: models.QuerySet[WorkflowSchedule], alias: str
) -> models.QuerySet[WorkflowSchedule]:
    if connections[alias].features.has_select_for_no_key_update:
        return rows.select_for_update(no_key=True)
    return rows.select_for_update()


#: The catch-up policies' labels (the choices' labels are their names, marked for
#: translation: the same text, so the field's choices stay as they are).
CATCH_UP_LABELS = {"latest": _("latest"), "none": _("none")}
#: The overlap policies' labels.
OVERLAP_LABELS = {
    "skip": _("skip"),
    "buffer_one": _("buffer one"),
    "cancel_other": _("cancel other"),
    "allow": _("allow"),
}
#: Why a tick was skipped, as operators read it.
SKIP_REASON_LABELS = {
    "overlap": _("previous run still live"),
    "buffer_full": _("a tick was already waiting"),
    "missed": _("missed (no worker ran)"),
}


class WorkflowSchedule(models.Model):
    """A cron schedule of a workflow: a run per tick, started by the workflow workers.

    ``next_tick`` is the first tick not fired yet and ``last_tick`` the last one fired (both
    UTC instants; ``next_tick`` is ``NULL`` for an expression that never matches again).
    ``last_run_id`` is the id of the run ``last_tick`` started (kept as a plain id: pruning
    runs never touches schedules): the "previous run" the ``overlap`` policy looks at.
    ``buffered_tick`` is the tick waiting for it (``buffer_one``); ``last_skipped_tick``,
    ``last_skip_reason`` and ``skipped_ticks`` record the ticks that started no run.
    ``task``, when set, is the dotted path of the Django ``@task`` each tick enqueues
    (``input`` then holds its ``args`` and ``kwargs``). ``declared`` turns ``False`` when the
    declaration leaves the code or settings: the row stops firing and stays.
    """

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, unique=True)
    workflow = models.CharField(_("workflow"), max_length=MAX_NAME_LENGTH)
    cron = models.CharField(_("cron"), max_length=MAX_CRON_LENGTH)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    input = models.JSONField(_("input"), default=dict, blank=True)
    catch_up = models.CharField(
        _("catch up"),
        max_length=16,
        choices=[(policy, CATCH_UP_LABELS[policy]) for policy in CATCH_UP_POLICIES],
        default="latest",
    )
    overlap = models.CharField(
        _("overlap"),
        max_length=16,
        choices=[(policy, OVERLAP_LABELS[policy]) for policy in OVERLAP_POLICIES],
        default="skip",
        db_default="skip",
        help_text=_("What a tick does while the schedule's previous run is still live."),
    )
    task = models.CharField(
        _("task"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("The Django task each tick enqueues (empty: the workflow is started)."),
    )
    declared = models.BooleanField(_("declared"), default=True)
    paused = models.BooleanField(_("paused"), default=False)
    next_tick = models.DateTimeField(_("next tick"), null=True, blank=True)
    last_tick = models.DateTimeField(_("last tick"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run id"), null=True, blank=True)
    buffered_tick = models.DateTimeField(_("buffered tick"), null=True, blank=True)
    last_skipped_tick = models.DateTimeField(_("last skipped tick"), null=True, blank=True)
    last_skip_reason = models.CharField(
        _("last skip reason"),
        max_length=16,
        blank=True,
        default="",
        db_default="",
        choices=[(reason, SKIP_REASON_LABELS[reason]) for reason in SKIP_REASONS],
    )
    skipped_ticks = models.PositiveBigIntegerField(_("skipped ticks"), default=0, db_default=0)
    created_at = models.DateTimeField(_("created at"), db_default=DbNow())
    updated_at = models.DateTimeField(_("updated at"), db_default=DbNow())

    objects: ClassVar[WorkflowScheduleQuerySet] = WorkflowScheduleQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)
        verbose_name = _("workflow schedule")
        verbose_name_plural = _("workflow schedules")
        permissions = (("pause_workflowschedule", "Can pause and resume workflow schedules"),)
        indexes = (models.Index(fields=["next_tick"], name="dl_schedule_next_tick"),)

    def __str__(self) -> str:
        return self.name


class WorkflowScheduleBackfill(models.Model):
    """One backfill of a schedule (``workflow_schedules backfill``): its window, how many
    ticks it holds, how many runs it started and how many ticks already had one;
    ``finished_at`` is ``NULL`` while it runs (or if it was stopped midway: run it again,
    the ticks that have their run are not started twice)."""

    schedule = models.ForeignKey(
        WorkflowSchedule,
        on_delete=models.CASCADE,
        related_name="backfills",
        verbose_name=_("schedule"),
    )
    start = models.DateTimeField(_("start"))
    end = models.DateTimeField(_("end"))
    ticks = models.PositiveIntegerField(_("ticks"), default=0)
    started = models.PositiveIntegerField(_("runs started"), default=0)
    existing = models.PositiveIntegerField(_("ticks that had a run"), default=0)
    created_at = models.DateTimeField(_("created at"), db_default=DbNow())
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        app_label = "django_leases"
        ordering = ("-created_at", "-id")
        verbose_name = _("schedule backfill")
        verbose_name_plural = _("schedule backfills")

    def __str__(self) -> str:
        return f"{self.schedule_id}: {self.start} – {self.end}"
