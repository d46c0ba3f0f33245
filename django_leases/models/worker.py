"""Workflow worker processes as their heartbeats recorded them: ``WorkflowWorker.objects``.

A worker process is alive while its heartbeat lease is live on the database clock
(:class:`~django_leases.models.lease.Lease`); its row says what it is and how busy it was at
its last beat. ``leases_check``, the health view and the admin's Workers page read it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from django.db import models
from django.db.models import Value
from django.utils.translation import gettext_lazy as _

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.models.lease import Lease
from django_leases.validation import MAX_KEY_LENGTH, seconds


class WorkerState(models.TextChoices):
    """What an operator sees of a worker process: its heartbeat lease is live, it said it
    stopped, or its lease lapsed without a word (killed, frozen or cut off)."""

    LIVE = "live", _("live")
    LAPSED = "lapsed", _("lapsed")
    STOPPED = "stopped", _("stopped")


class WorkflowWorkerQuerySet(db.RoutedQuerySet["WorkflowWorker"]):
    """Domain methods of ``WorkflowWorker.objects``: the worker processes and their heartbeat.

    A worker process is alive while its heartbeat lease (``lease_key``) is live on the
    database clock: the worker renews it every TTL/3 as any hold, and a killed worker's lease
    lapses after its TTL. The row says what the process is (host, pid, threads, queues, how it
    is woken) and how many units of work it had in flight at its last heartbeat.
    """

    def register(
        self,
        lease_key: str,
        *,
        host: str,
        pid: int,
        concurrency: int,
        queues: list[str],
        wakeup: str,
    ) -> WorkflowWorker:
        """Record (or re-record, for a reused pid) the worker holding ``lease_key``."""
        row, _ = self.rows().update_or_create(
            lease_key=lease_key,
            defaults={
                "host": host,
                "pid": pid,
                "concurrency": concurrency,
                "queues": list(queues),
                "wakeup": wakeup,
                "in_flight": 0,
                "started_at": DbNow(),
                "beat_at": DbNow(),
                "stopped_at": None,
            },
        )
        return row

    def beat(self, lease_key: str, in_flight: int) -> None:
        """The worker's units of work in flight now (``int``), with the heartbeat's time."""
        self.rows().filter(lease_key=lease_key).update(in_flight=in_flight, beat_at=DbNow())

    def stopped(self, lease_key: str) -> None:
        """The worker holding ``lease_key`` stopped (its heartbeat lease is released)."""
        self.rows().filter(lease_key=lease_key).update(
            in_flight=0, beat_at=DbNow(), stopped_at=DbNow()
        )

    @staticmethod
    def _alive() -> models.Exists:
        """The heartbeat lease is live on the database clock."""
        return models.Exists(
            Lease.objects.filter(
                key=models.OuterRef("lease_key"), released_at__isnull=True, expires_at__gt=DbNow()
            )
        )

    def with_liveness(self) -> WorkflowWorkerQuerySet:
        """Annotate ``live``: the heartbeat lease is live on the database clock."""
        return self.annotate(live=self._alive())

    def live(self) -> WorkflowWorkerQuerySet:
        """The worker processes alive now."""
        return self.filter(self._alive())

    def with_state(self) -> WorkflowWorkerQuerySet:
        """Annotate what an operator sees of each worker, on the database clock.

        ``state`` is a :class:`WorkerState` value: ``live`` while the heartbeat lease is
        live, ``stopped`` once the worker said it stopped (and its lease is not live), else
        ``lapsed`` (killed or cut off: its lease expired). ``heartbeat_expires_at`` is the
        heartbeat lease's expiry (``None`` when it has no lease row) and ``db_now`` the
        database's time. Live workers come first, then the most recently started.
        """
        lease = Lease.objects.filter(key=models.OuterRef("lease_key"))
        return self.annotate(
            state=models.Case(
                models.When(self._alive(), then=Value(WorkerState.LIVE.value)),
                models.When(stopped_at__isnull=False, then=Value(WorkerState.STOPPED.value)),
                default=Value(WorkerState.LAPSED.value),
                output_field=models.CharField(),
            ),
            heartbeat_expires_at=models.Subquery(lease.values("expires_at")[:1]),
            db_now=DbNow(),
        ).order_by(
            models.Case(
                models.When(self._alive(), then=Value(0)),
                default=Value(1),
                output_field=models.IntegerField(),
            ),
            "-started_at",
            "-pk",
        )

    def forget_gone(self, older_than: float | timedelta) -> int:
        """Delete the rows of workers whose heartbeat lease is not live and whose last beat
        was more than ``older_than`` (seconds ≥ 0, or a ``timedelta``) before database now;
        returns how many."""
        cutoff = seconds(older_than, "older_than")
        gone = self.filter(~self._alive(), beat_at__lte=clock.db_now_plus(-cutoff))
        deleted, _ = self.rows().filter(pk__in=list(gone.values_list("pk", flat=True))).delete()
        return int(deleted)


class WorkflowWorker(models.Model):
    """A workflow worker process, as its heartbeat recorded it (DESIGN §5; ``leases_check``
    and the admin's Workers page read it). Alive while its heartbeat lease is live."""

    lease_key = models.CharField(_("lease key"), max_length=MAX_KEY_LENGTH, unique=True)
    host = models.CharField(_("host"), max_length=MAX_KEY_LENGTH)
    pid = models.PositiveIntegerField(_("pid"))
    concurrency = models.PositiveIntegerField(_("concurrency"), default=1)
    queues = models.JSONField(default=list, blank=True, help_text=_("Empty: every queue."))
    wakeup = models.CharField(_("wakeup"), max_length=MAX_KEY_LENGTH, blank=True, default="")
    in_flight = models.PositiveIntegerField(_("in flight"), default=0)
    started_at = models.DateTimeField(db_default=DbNow())
    beat_at = models.DateTimeField(db_default=DbNow())
    stopped_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkflowWorkerQuerySet] = WorkflowWorkerQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("-started_at",)
        verbose_name = _("workflow worker")
        verbose_name_plural = _("workflow workers")

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


__all__ = ["WorkerState", "WorkflowWorker", "WorkflowWorkerQuerySet"]
