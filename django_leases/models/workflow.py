"""Workflow runs, their steps and each step's attempts (DESIGN §5).

The domain methods live on the QuerySets in :mod:`django_leases.workflows.store`
(``WorkflowRun.objects``, ``WorkflowStep.objects``, ``WorkflowStepAttempt.objects``); this
module holds the tables so the migration stays in one place.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from django_leases.workflows.states import AttemptStatus, RunStatus, StepStatus
from django_leases.workflows.store import (
    WorkflowRunQuerySet,
    WorkflowStepAttemptQuerySet,
    WorkflowStepQuerySet,
)

__all__ = [
    "AttemptStatus",
    "RunStatus",
    "StepStatus",
    "WorkflowRun",
    "WorkflowStep",
    "WorkflowStepAttempt",
]


class WorkflowRun(models.Model):
    """One execution of a ``@workflow``; replayed from the start on each orchestration pass.

    ``pass_due_at`` is set while the run needs an orchestration pass (``NULL`` otherwise); a
    worker that picks the pass pushes it one run-lease TTL ahead, so a pass whose worker died
    is picked again. ``pass_requests`` rises each time the run is asked for a pass, so a pass
    clears ``pass_due_at`` only if no new request arrived while it ran.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(max_length=200, db_index=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    input = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    pass_due_at = models.DateTimeField(null=True, blank=True)
    pass_requests = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkflowRunQuerySet] = WorkflowRunQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("-created_at",)
        permissions = (("operate_workflowrun", "Can resume, cancel and retry workflow runs"),)
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


class WorkflowStep(models.Model):
    """A step of a run, claimed by one worker at a time under a lease and an ``attempt``.

    ``attempt`` is the step's fencing number: a result, error or lease renewal lands only
    for the current attempt. ``retries`` allows at most ``retries + 1`` attempts.
    ``lease_expires_at`` and ``available_at`` are set from the database clock.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    step_name = models.CharField(max_length=200)
    function_name = models.CharField(max_length=200)
    data = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    retries = models.PositiveIntegerField(default=5)
    retry_delay = models.FloatField(default=0.0, help_text="Seconds between attempts.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[WorkflowStepQuerySet] = WorkflowStepQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("created_at", "id")
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
            # …and running steps by when their lease lapses.
            models.Index(
                fields=["lease_expires_at"],
                name="dl_step_running",
                condition=Q(status="running"),
            ),
        )

    def __str__(self) -> str:
        return f"{self.step_name} (attempt {self.attempt}, {self.status})"

    @property
    def max_attempts(self) -> int:
        """``retries + 1``: how many attempts the step may have."""
        return self.retries + 1


class WorkflowStepAttempt(models.Model):
    """One claim of a step: the run history. A superseded attempt keeps ``running``.

    ``started_at`` and ``finished_at`` come from the database clock.
    """

    step = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkflowStepAttemptQuerySet] = WorkflowStepAttemptQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("id",)
        constraints = (
            models.UniqueConstraint(fields=["step", "attempt"], name="dl_attempt_unique"),
        )

    def __str__(self) -> str:
        return f"attempt {self.attempt} of {self.step_id} ({self.status})"
