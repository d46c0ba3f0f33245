"""The demo's record of step executions, and the base of its attempt-fenced tables.

:class:`StepExecution` is one row per (run, step, attempt) as the step function saw it: the
worker process that ran it and how its own write ended. The library's attempt history
(``WorkflowStepAttempt``) says what the *store* accepted; this table says what the *worker*
did — together they show a stale worker doing the work and being refused.

:class:`AttemptFenced` is an abstract model for a step's side effect written under the step's
attempt number (see :meth:`AttemptFencedQuerySet.record`).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any, ClassVar

from django.db import IntegrityError, models, router, transaction
from django.utils import timezone


def worker_name() -> str:
    """``host:pid`` of the current process (``str``)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Outcome(models.TextChoices):
    RUNNING = "running", "running"
    DONE = "done", "finished (nothing to write)"
    LANDED = "landed", "write landed"
    REFUSED = "refused", "write refused (a later attempt wrote first)"
    STOPPED = "stopped", "stopped: step lease lost, nothing written"
    FAILED = "failed", "raised"


class StepExecutionQuerySet(models.QuerySet["StepExecution"]):
    def begin(self, ctx: Any, workflow: str) -> StepExecution:
        """Record that this process starts attempt ``ctx.attempt`` of step ``ctx.step_name``
        of run ``ctx.run_id`` (a ``StepContext``). Returns the row."""
        alias = router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            row, _ = self.using(alias).update_or_create(
                run_id=ctx.run_id,
                step_name=ctx.step_name,
                attempt=ctx.attempt,
                defaults={
                    "workflow": workflow,
                    "worker": worker_name(),
                    "pid": os.getpid(),
                    "outcome": Outcome.RUNNING,
                    "detail": "",
                    "finished_at": None,
                },
            )
        return row

    def finish(self, ctx: Any, outcome: str, detail: str = "") -> None:
        """Record how attempt ``ctx.attempt`` ended (an :class:`Outcome` value)."""
        alias = router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            self.using(alias).filter(
                run_id=ctx.run_id, step_name=ctx.step_name, attempt=ctx.attempt
            ).update(outcome=outcome, detail=detail[:500], finished_at=timezone.now())


class StepExecution(models.Model):
    """One execution of a demo step function: run, step, attempt, worker, outcome."""

    run_id = models.UUIDField(db_index=True)
    workflow = models.CharField(max_length=200)
    step_name = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=300, help_text="host:pid of the worker process")
    pid = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    detail = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[StepExecutionQuerySet] = StepExecutionQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ("started_at", "id")
        constraints = (
            models.UniqueConstraint(
                fields=["run_id", "step_name", "attempt"], name="journal_execution_unique"
            ),
        )

    def __str__(self) -> str:
        return f"{self.step_name} of {self.run_id} attempt {self.attempt} ({self.outcome})"


class AttemptFencedQuerySet(models.QuerySet[Any]):
    def record(self, run_id: uuid.UUID, attempt: int, **values: Any) -> bool:
        """Write ``values`` into the row of run ``run_id`` on behalf of step attempt ``attempt``
        (``int``), unless a *later* attempt already wrote it.

        The attempt number is the fencing number: the row keeps the attempt that wrote it, and
        a write from a lower attempt (a stale worker that was paused past its step lease while
        another worker ran the step again) changes nothing. The same or a later attempt
        overwrites, so a step that runs again is idempotent. One transaction; the row is
        locked while deciding (a concurrent first insert is resolved by the unique key).

        Returns ``True`` when the write landed, ``False`` when it was refused as stale.
        """
        alias = router.db_for_write(self.model)
        rows = self.using(alias)
        # A concurrent first insert ends this transaction and decides again in a new one:
        # InnoDB keeps the shared lock of the failed insert's duplicate-key check to the end
        # of the transaction, so locking the row in the same one would deadlock two writers.
        for _ in range(3):
            try:
                with transaction.atomic(using=alias):
                    row = rows.select_for_update().filter(run_id=run_id).first()
                    if row is None:
                        rows.create(run_id=run_id, attempt=attempt, **values)
                        return True
                    if row.attempt > attempt:
                        return False
                    rows.filter(pk=row.pk).update(attempt=attempt, **values)
                    return True
            except IntegrityError:  # another attempt inserted first: decide on its row
                continue
        raise RuntimeError(f"the row of run {run_id} could not be written")


class AttemptFenced(models.Model):
    """A step's side effect, one row per run, fenced by the step's attempt number."""

    run_id = models.UUIDField(unique=True)
    attempt = models.PositiveIntegerField(help_text="The step attempt that wrote this row.")
    written_by = models.CharField(max_length=300, help_text="host:pid of the worker")
    written_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[AttemptFencedQuerySet] = AttemptFencedQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        abstract = True


class DigestQuerySet(models.QuerySet["Digest"]):
    def write(self, name: str, token: int, holder: str, **values: Any) -> bool:
        """Write digest ``name`` on behalf of the lease holder with fencing token ``token``
        (``int``), unless a holder with a *higher* token already wrote it — the pattern a
        ``hold_lease`` child uses to fence its own writes. Returns whether it landed."""
        alias = router.db_for_write(self.model)
        rows = self.using(alias)
        # A concurrent first insert: decide again in a new transaction (see record() above).
        for _ in range(3):
            try:
                with transaction.atomic(using=alias):
                    row = rows.select_for_update().filter(name=name).first()
                    if row is None:
                        rows.create(name=name, token=token, holder=holder, **values)
                        return True
                    if row.token > token:
                        return False  # a newer holder wrote it: this one is stale
                    rows.filter(pk=row.pk).update(
                        token=token, holder=holder, updated_at=timezone.now(), **values
                    )
                    return True
            except IntegrityError:
                continue
        raise RuntimeError(f"digest {name!r} could not be written")


class Digest(models.Model):
    """A summary the demo's singleton job (``manage.py demo_digest`` under ``hold_lease``)
    keeps up to date, written only by the holder with the highest fencing token."""

    name = models.CharField(max_length=100, unique=True)
    token = models.PositiveBigIntegerField(
        help_text="Fencing token of the lease holder that wrote it"
    )
    holder = models.CharField(max_length=300)
    runs_completed = models.PositiveIntegerField(default=0)
    runs_running = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[DigestQuerySet] = DigestQuerySet.as_manager()  # type: ignore[assignment]

    def __str__(self) -> str:
        return f"{self.name} (token {self.token})"
