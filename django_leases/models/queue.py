"""Queue rows: what a claim of a limited queue locks, and its rate log (DESIGN §5b):
``WorkflowQueue.objects``.

The limits themselves live in ``DJANGO_LEASES["QUEUES"]`` (:func:`~django_leases.conf.
queue_limits`); a queue's row exists so that claims of a limited queue have something to lock
and somewhere to keep the times of their recent starts. What a claim counts — the queue's
running steps — belongs to the steps (:mod:`django_leases.models.workflow`), which ask
:meth:`WorkflowQueueQuerySet.admit` with that count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.clock import DbNow
from django_leases.conf import MAX_QUEUE_LENGTH, QueueLimits


@dataclass(frozen=True)
class Admission:
    """A limited queue's go-ahead for one claim (:meth:`WorkflowQueueQuerySet.admit`), taken
    under the queue row's lock: ``started_at`` is the start it will record (database clock)
    and ``starts`` the rate log to write once the claim is granted (``None``: no rate)."""

    queue: str
    started_at: datetime
    starts: list[float] | None


def _epoch(moment: datetime) -> float:
    """``moment`` (a database-clock datetime, aware or naive UTC) as epoch seconds."""
    if moment.tzinfo is None:
        return (moment - datetime(1970, 1, 1)).total_seconds()
    return moment.timestamp()


class WorkflowQueueQuerySet(db.RoutedQuerySet["WorkflowQueue"]):
    """Domain methods of ``WorkflowQueue.objects``: the queue limits a claim enforces.

    **Concurrency** (at most N of a queue's steps running across every worker) and **rate**
    (at most N starts in any window of a second, a minute or an hour) are decided inside the
    claim's transaction, under the lock of the queue's row (``SELECT … FOR UPDATE``; SQLite
    serialises writers): the claim counts the queue's running steps whose lease is live on
    the database clock, and reads the queue's rate log, only once it holds the lock; the
    lock is held until the claim commits. The next claimer of the queue waits for it and
    then, under READ COMMITTED, counts in a new statement that sees the committed claim. A
    running step whose lease lapsed is not counted (it is claimable again, as a new attempt).

    The rate log (``starts``) keeps the database-clock times of the queue's starts within
    the last window (at most N of them): a claim is admitted while fewer than N lie within
    the window before its own time, and its time is appended (older ones dropped) in the
    same transaction. Claims of a queue are serialised by the lock and take their time in a
    statement after the lock was granted, so the log is in order and exact: no window of
    the rate's length ever holds more than N starts, whichever workers made them. The
    attempt row records the same time as its ``started_at``. Queues without limits take no
    lock and write nothing here.
    """

    def _locked(self, alias: str, name: str) -> WorkflowQueue:
        """The queue's row, locked until the transaction ends (created if missing)."""
        rows = self.model._default_manager.using(alias)
        for _try in range(2):
            found = rows.select_for_update().filter(name=name).first()
            if found is not None:
                return found
            rows.bulk_create([self.model(name=name)], ignore_conflicts=True)
        raise self.model.DoesNotExist(f"Queue {name!r} has no row")  # pragma: no cover

    def admit(
        self, alias: str, limits: QueueLimits, running: Callable[[], int]
    ) -> Admission | None:
        """Whether one more step of the queue ``limits`` describes may start now; inside the
        caller's claim transaction on ``alias``, whose lock of the queue row it takes.
        ``running`` counts the queue's running steps (live leases, database clock); it is
        called only once the lock is held.

        Returns an :class:`Admission` (pass it to :meth:`record_start` once the claim is
        granted), or ``None``: the queue is at its concurrency limit or its rate for the
        current window is used up (the claim must not start the step).
        """
        row = self._locked(alias, limits.name)
        if limits.concurrency is not None and running() >= limits.concurrency:
            return None
        # The start's time is read after the count: a step that finished before this claim
        # counted (and so is not counted) finished before this start, on the same clock.
        now: datetime = (
            self.model._default_manager.using(alias)
            .filter(pk=row.pk)
            .annotate(db_now=DbNow())
            .values_list("db_now", flat=True)[0]
        )
        starts = None
        if limits.rate is not None:
            moment = _epoch(now)
            starts = [
                float(t) for t in (row.starts or []) if float(t) > moment - limits.rate_window
            ]
            if len(starts) >= limits.rate_starts:
                return None
            starts.append(moment)
        return Admission(limits.name, now, starts)

    def record_start(self, alias: str, admission: Admission) -> None:
        """Write the rate log of a granted claim (inside its transaction, the lock held)."""
        if admission.starts is not None:
            self.model._default_manager.using(alias).filter(name=admission.queue).update(
                starts=admission.starts, updated_at=DbNow()
            )

    def rate_used_up(self, alias: str, limits: Mapping[str, QueueLimits]) -> set[str]:
        """Of the queues in ``limits`` with a rate, those whose rate for the current window
        looks used up now (unlocked reads: a hint; the claim decides under the lock)."""
        rated = {name: queue for name, queue in limits.items() if queue.rate is not None}
        full = set()
        if rated:
            for row in (
                self.model._default_manager.using(alias)
                .filter(name__in=sorted(rated))
                .annotate(db_now=DbNow())
            ):
                queue = rated[row.name]
                moment = _epoch(row.db_now)  # type: ignore[attr-defined]
                recent = [t for t in (row.starts or []) if float(t) > moment - queue.rate_window]
                if len(recent) >= queue.rate_starts:
                    full.add(row.name)
        return full


class WorkflowQueue(models.Model):
    """A queue's row: what a claim of a limited queue locks, and its rate log (the
    database-clock times, epoch seconds, of its starts within the last rate window). The
    limits themselves live in ``DJANGO_LEASES["QUEUES"]``; rows are created on first use."""

    name = models.CharField(max_length=MAX_QUEUE_LENGTH, unique=True)
    starts = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(db_default=DbNow())

    objects: ClassVar[WorkflowQueueQuerySet] = WorkflowQueueQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)
        verbose_name = _("workflow queue")
        verbose_name_plural = _("workflow queues")

    def __str__(self) -> str:
        return self.name


__all__ = ["Admission", "WorkflowQueue", "WorkflowQueueQuerySet"]
