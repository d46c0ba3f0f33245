"""Queue rows: what a claim of a limited queue locks, and its rate log (DESIGN §5b):
``WorkflowQueue.objects``.

The limits themselves live in ``DJANGO_LEASES["QUEUES"]`` (:func:`~django_leases.conf.
queue_limits`); a queue's row exists so that claims of a limited queue have something to lock
and somewhere to keep the times of their recent starts. What a claim counts — the queue's
running steps — belongs to the steps (:mod:`django_leases.models.workflow`), which ask
:meth:`WorkflowQueueQuerySet.admit` with that count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import ClassVar

from django.apps import apps
from django.db import connections, models, transaction
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.clock import DbNow
from django_leases.conf import (
    MAX_QUEUE_KEY_LENGTH,
    MAX_QUEUE_LENGTH,
    QueueLimits,
    queue_limits,
)
from django_leases.frozen import frozen


@frozen
class Admission:
    """A limited queue's go-ahead for one claim (:meth:`WorkflowQueueQuerySet.admit`), taken
    under the queue row's lock: ``started_at`` is the start it will record (database clock)
    and ``starts`` the rate log to write once the claim is granted (``None``: no rate).
    In a queue with per-key limits, ``key`` is the claimed step's queue key and
    ``key_starts`` the key's rate log to write (``None``: no key rate)."""

    queue: str
    started_at: datetime
    starts: list[float] | None
    key: str | None = None
    key_starts: list[float] | None = None


@frozen
class KeyRefusal:
    """Why a claim of a keyed queue's step was refused: its key (``queue``, ``key``) is at
    its ``key_concurrency`` or out of its ``key_rate`` (only that key is passed over), or
    another key's turn comes first (``turn``: a step run inline waits in the queue)."""

    queue: str
    key: str
    turn: bool = False


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
        targets = connections[alias].features.supports_update_conflicts_with_target
        for _try in range(2):
            found = rows.select_for_update().filter(name=name).first()
            if found is not None:
                return found
            # An upsert, not INSERT IGNORE: on InnoDB the duplicate-key check of an ignored
            # insert takes a shared lock on the row another claim has just inserted, and two
            # such claims, each then asking for the row's lock above, deadlock. The upsert
            # waits for the exclusive lock instead, and holds it.
            rows.bulk_create(
                [self.model(name=name)],
                update_conflicts=True,
                unique_fields=["name"] if targets else None,
                update_fields=["name"],
            )
        raise self.model.DoesNotExist(f"Queue {name!r} has no row")  # pragma: no cover

    def admit(
        self,
        alias: str,
        limits: QueueLimits,
        running: Callable[[], int],
        *,
        key: str = "",
        key_running: Callable[[], int] | None = None,
        turn: Callable[[datetime | None], bool] | None = None,
    ) -> Admission | KeyRefusal | None:
        """Whether one more step of the queue ``limits`` describes may start now; inside the
        caller's claim transaction on ``alias``, whose lock of the queue row it takes.
        ``running`` counts the queue's running steps (live leases, database clock); it is
        called only once the lock is held.

        In a queue with per-key limits (:attr:`QueueLimits.keyed`), ``key`` is the step's
        queue key, ``key_running`` counts the key's running steps and ``turn`` (given the
        time the key was last claimed, ``None``: never) says whether the key's turn has come
        (round-robin; ``None``: not asked, the caller picked by turn). All are asked under the
        same lock, so per-key limits are exact across every worker.

        Returns an :class:`Admission` (pass it to :meth:`record_start` once the claim is
        granted), ``None``: the queue is at its concurrency limit or its rate for the
        current window is used up (the claim must not start the step), or a
        :class:`KeyRefusal`: the step's key may not start now.
        """
        row = self._locked(alias, limits.name)
        if limits.concurrency is not None and running() >= limits.concurrency:
            return None
        key_row = None
        if limits.keyed:
            key_row = WorkflowQueueKey.objects.using(alias).of(limits.name, key)
            if turn is not None and not turn(None if key_row is None else key_row.claimed_at):
                return KeyRefusal(limits.name, key, turn=True)
            if (
                limits.key_concurrency is not None
                and key_running is not None
                and key_running() >= limits.key_concurrency
            ):
                return KeyRefusal(limits.name, key)
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
        key_starts = None
        if limits.key_rate is not None:
            moment = _epoch(now)
            logged = [] if key_row is None else key_row.starts or []
            key_starts = [float(t) for t in logged if float(t) > moment - limits.key_rate_window]
            if len(key_starts) >= limits.key_rate_starts:
                return KeyRefusal(limits.name, key)
            key_starts.append(moment)
        return Admission(limits.name, now, starts, key if limits.keyed else None, key_starts)

    def record_start(self, alias: str, admission: Admission) -> None:
        """Write the rate log of a granted claim (inside its transaction, the lock held),
        and in a keyed queue the key's last claim and rate log."""
        if admission.starts is not None:
            self.model._default_manager.using(alias).filter(name=admission.queue).update(
                starts=admission.starts, updated_at=DbNow()
            )
        if admission.key is not None:
            WorkflowQueueKey.objects.using(alias).claimed(
                admission.queue, admission.key, admission.started_at, admission.key_starts
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


class WorkflowQueueKeyQuerySet(db.RoutedQuerySet["WorkflowQueueKey"]):
    """Domain methods of ``WorkflowQueueKey.objects``: a keyed queue's keys, when each was
    last claimed (the round-robin order) and its rate log. Written only by claims of the
    queue, under the queue row's lock (:meth:`WorkflowQueueQuerySet.admit`)."""

    def of(self, queue: str, key: str) -> WorkflowQueueKey | None:
        """The row of ``key`` in ``queue`` (``None``: never claimed)."""
        return self.rows().filter(queue=queue, key=key).first()

    def rate_used_up(self, limits: Mapping[str, QueueLimits]) -> Sequence[WorkflowQueueKey]:
        """The key rows, of the queues in ``limits`` with a ``key_rate``, whose rate for the
        current window looks used up now (database clock; unlocked reads: a hint, the claim
        decides under the queue's lock)."""
        rated = {name: queue for name, queue in limits.items() if queue.key_rate is not None}
        full = []
        for row in self.rows().filter(queue__in=sorted(rated)).annotate(db_now=DbNow()):
            queue = rated[row.queue]
            moment = _epoch(row.db_now)
            recent = [t for t in row.starts or [] if float(t) > moment - queue.key_rate_window]
            if len(recent) >= queue.key_rate_starts:
                full.append(row)
        return full

    def claimed(self, queue: str, key: str, moment: datetime, starts: list[float] | None) -> None:
        """Record a claim of ``key`` in ``queue`` at ``moment`` (database clock), and the
        key's rate log ``starts`` (``None``: left as it is); inside the claim's transaction,
        the queue's lock held (so no other claim writes the row meanwhile)."""
        values: dict[str, object] = {"claimed_at": moment}
        if starts is not None:
            values["starts"] = starts
        if not self.rows().filter(queue=queue, key=key).update(**values):
            self.rows().bulk_create(
                [self.model(queue=queue, key=key, **values)], ignore_conflicts=True
            )

    def prune_idle(self, *, batch_size: int = 500) -> int:
        """Delete the rows of keys with nothing running or waiting and an empty rate window:
        no step of the key in its queue that is ``running``, ``pending``, ``scheduled`` or
        ``failed`` in a running run, and none of the key's rate log (its queue's
        ``key_rate``, if it still has one) within the last window on the database clock.
        Each queue's keys are looked at and deleted under the queue row's lock, in
        transactions of at most ``batch_size`` (int ≥ 1) rows, so no claim of the queue
        writes a key row meanwhile. A pruned key that comes back counts as never claimed:
        its turn comes first, as a new key's does. Returns how many rows were deleted.
        Called by ``WorkflowRun.objects.prune`` (retention). Raises ``ValueError`` for a
        bad ``batch_size``."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int ≥ 1, not {batch_size!r}")
        alias = self.write_alias()
        steps = apps.get_model("django_leases", "WorkflowStep")._default_manager.using(alias)
        busy = steps.filter(
            queue=models.OuterRef("queue"),
            queue_key=models.OuterRef("key"),
            status__in=("running", "pending", "scheduled", "failed"),
            run__status="running",
        )
        limits = queue_limits()
        deleted = 0
        for queue in sorted(set(self.rows().values_list("queue", flat=True))):
            window = limits[queue].key_rate_window if queue in limits else 0.0
            rated = queue in limits and limits[queue].key_rate is not None
            last = 0
            while True:
                with transaction.atomic(using=alias):
                    WorkflowQueue.objects.using(alias)._locked(alias, queue)
                    rows = list(
                        self.rows()
                        .filter(queue=queue, pk__gt=last)
                        .filter(~models.Exists(busy))
                        .annotate(db_now=DbNow())
                        .order_by("pk")[:batch_size]
                    )
                    if not rows:
                        break
                    last = rows[-1].pk
                    idle = [
                        row.pk
                        for row in rows
                        if not rated
                        or not any(float(t) > _epoch(row.db_now) - window for t in row.starts or [])
                    ]
                    deleted += self.rows().filter(pk__in=idle).delete()[0]
        return deleted


class WorkflowQueueKey(models.Model):
    """A key of a queue with per-key limits (DESIGN §5c): when a step of the key was last
    claimed (``claimed_at``, database clock: keys are served least recently claimed first)
    and its rate log (epoch seconds of its starts within the last ``key_rate`` window).
    Rows are created by the key's first claim."""

    queue = models.CharField(max_length=MAX_QUEUE_LENGTH)
    key = models.CharField(max_length=MAX_QUEUE_KEY_LENGTH, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    starts = models.JSONField(default=list, blank=True)

    objects: ClassVar[WorkflowQueueKeyQuerySet] = WorkflowQueueKeyQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("queue", "key")
        verbose_name = _("workflow queue key")
        verbose_name_plural = _("workflow queue keys")
        constraints = (
            models.UniqueConstraint(fields=["queue", "key"], name="dl_queue_key_unique"),
        )

    def __str__(self) -> str:
        return f"{self.queue}:{self.key}"


__all__ = [
    "Admission",
    "KeyRefusal",
    "WorkflowQueue",
    "WorkflowQueueKey",
    "WorkflowQueueKeyQuerySet",
    "WorkflowQueueQuerySet",
]
