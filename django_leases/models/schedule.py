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

A tick fired more than :data:`~django_leases.workflows.schedules.MISSED_AFTER` seconds late
was missed (no worker ran at its time): ``catch_up="latest"`` starts one run for the latest
due tick, ``"none"`` starts none and waits for the next tick. A new schedule, a changed
expression or time zone, and a resumed schedule start counting from the next tick after
*now*: ticks before the schedule existed, or while it was paused, never run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from django.db import connections, models, transaction
from django.db.models import F
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.exceptions import UnknownScheduleError
from django_leases.models.workflow import WorkflowRun
from django_leases.validation import MAX_NAME_LENGTH
from django_leases.workflows.schedules import (
    CATCH_UP_POLICIES,
    MISSED_AFTER,
    ScheduleDeclaration,
    latest_tick,
    next_tick,
    run_key,
)

__all__ = ["Fired", "WorkflowSchedule", "WorkflowScheduleQuerySet"]

#: Most firing rounds one :meth:`WorkflowScheduleQuerySet.fire_due` call makes (a round fires
#: at most one tick of each due schedule; late ticks within ``MISSED_AFTER`` take a round each).
MAX_ROUNDS = 64


@dataclass(frozen=True)
class Fired:
    """What one firing did to a schedule.

    Attributes:
        name: the schedule.
        tick: the tick a run was started for (aware UTC), or ``None`` when missed ticks were
            skipped (``catch_up="none"``).
        run_id: the run of that tick (``None`` when skipped).
        next_tick: the schedule's next tick now (aware UTC; ``None``: it never matches again).
        skipped: ticks passed over without a run (missed ones; an estimate, at least 0).
    """

    name: str
    tick: datetime | None
    run_id: uuid.UUID | None
    next_tick: datetime | None
    skipped: int = 0


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

        Upserts each declared row (workflow, cron, time zone, input, catch-up,
        ``declared=True``); a new row, or one whose cron expression or time zone changed, gets
        its ``next_tick`` counted from database now. Every other row becomes undeclared (it
        stops firing; nothing is deleted). ``paused`` is never touched. Concurrent syncs
        leave one row per name. Returns every row, sorted by name.

        Raises ``ValueError`` for two declarations with one name (nothing written).
        """
        schedules = sorted(declared, key=lambda schedule: schedule.name)
        names = [schedule.name for schedule in schedules]
        if len(set(names)) != len(names):
            raise ValueError("sync() got two schedules with the same name")
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            rows.bulk_create(
                [
                    self.model(
                        name=s.name,
                        workflow=s.workflow,
                        cron=s.cron,
                        timezone=s.timezone,
                        input=s.input,
                        catch_up=s.catch_up,
                    )
                    for s in schedules
                ],
                ignore_conflicts=True,
            )
            for s in schedules:
                # A changed expression or zone counts again from now (next_tick cleared here,
                # set below); the rest is overwritten.
                rows.filter(name=s.name).exclude(cron=s.cron, timezone=s.timezone).update(
                    next_tick=None
                )
                rows.filter(name=s.name).update(
                    workflow=s.workflow,
                    cron=s.cron,
                    timezone=s.timezone,
                    input=s.input,
                    catch_up=s.catch_up,
                    declared=True,
                    updated_at=DbNow(),
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

    def fire_due(self) -> list[Fired]:
        """Start the run of every due tick of every due schedule, each exactly once across
        all callers (see the module docstring); returns what was fired, oldest first.

        Safe to call from any number of threads and processes at once: each tick is taken
        by one guarded ``UPDATE`` and its run is started in the same transaction, with the
        tick as the run's idempotency key. Late ticks (within ``MISSED_AFTER``) are fired one
        by one, each with its own run; older ones follow the schedule's ``catch_up``.
        Database errors propagate (nothing of the failed transaction is kept).
        """
        alias = self.write_alias()
        fired: list[Fired] = []
        for _round in range(MAX_ROUNDS):
            due = list(
                self._rows(alias)
                .filter(declared=True, paused=False, next_tick__lte=DbNow())
                .annotate(db_now=DbNow())
            )
            progress = False
            for row in sorted(due, key=lambda row: (row.next_tick, row.name)):
                outcome = self._fire(alias, row)
                if outcome is not None:
                    fired.append(outcome)
                    progress = True
            if not progress:
                break
        return fired

    def _fire(self, alias: str, row: WorkflowSchedule) -> Fired | None:
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
                declared=True,
                paused=False,
            ).update(
                next_tick=to_stored(following, alias),
                last_tick=to_stored(tick, alias) if tick is not None else F("last_tick"),
                updated_at=DbNow(),
            )
            if not taken:
                return None
            run_id = None
            if tick is not None:
                run = WorkflowRun.objects.db_manager(alias).start(
                    row.workflow, row.input, key=run_key(row.name, tick)
                )
                run_id = run.id
                rows.filter(pk=row.pk).update(last_run_id=run_id)
        return Fired(row.name, tick, run_id, following, skipped)


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


class WorkflowSchedule(models.Model):
    """A cron schedule of a workflow: a run per tick, started by the workflow workers.

    ``next_tick`` is the first tick not fired yet and ``last_tick`` the last one fired (both
    UTC instants; ``next_tick`` is ``NULL`` for an expression that never matches again).
    ``last_run_id`` is the id of the run ``last_tick`` started (kept as a plain id: pruning
    runs never touches schedules). ``declared`` turns ``False`` when the declaration leaves
    the code or settings: the row stops firing and stays.
    """

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, unique=True)
    workflow = models.CharField(_("workflow"), max_length=MAX_NAME_LENGTH)
    cron = models.CharField(_("cron"), max_length=200)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    input = models.JSONField(_("input"), default=dict, blank=True)
    catch_up = models.CharField(
        _("catch up"),
        max_length=16,
        choices=[(policy, CATCH_UP_LABELS[policy]) for policy in CATCH_UP_POLICIES],
        default="latest",
    )
    declared = models.BooleanField(_("declared"), default=True)
    paused = models.BooleanField(_("paused"), default=False)
    next_tick = models.DateTimeField(_("next tick"), null=True, blank=True)
    last_tick = models.DateTimeField(_("last tick"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run id"), null=True, blank=True)
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
