"""Workflow runs, their steps and each step's attempts, with the rules that govern them
(DESIGN §5, reference rules F1–F10): ``WorkflowRun.objects``, ``WorkflowStep.objects``,
``WorkflowStepAttempt.objects``.

The QuerySets are composed here of layers, one module per job, each building on the one
below: a run's :mod:`~django_leases.models.passes` then its
:mod:`~django_leases.models.operations`; a step's :mod:`~django_leases.models.outcomes`,
:mod:`~django_leases.models.claims`, :mod:`~django_leases.models.scheduling` and
:mod:`~django_leases.models.results`. What they share is
:mod:`~django_leases.models.workflow_base`.

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

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import models
from django.db.models import BooleanField, ExpressionWrapper, F, Q
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.clock import AutoTimeField, DbNow
from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_KEY_LENGTH, MAX_QUEUE_LENGTH
from django_leases.ids import uuid7
from django_leases.models.claims import QueueCounts
from django_leases.models.forks import RunForks
from django_leases.models.operations import RunOutcome
from django_leases.models.outcomes import retry_delay_after, write_pending
from django_leases.models.progress import StepProgress
from django_leases.models.recorded import RecordedJSONField
from django_leases.models.results import ResultWithNext
from django_leases.models.scheduling import Scheduled
from django_leases.models.workflow_base import (
    FUNCTIONS_MIGRATION,
    fence_q,
    functions,
    refused_in_state,
    request_passes,
)
from django_leases.validation import MAX_KEY_LENGTH, MAX_NAME_LENGTH, parse_run_id

if TYPE_CHECKING:
    from django.core.checks import CheckMessage
    from django.utils.functional import _StrPromise

from django_leases.workflows.values import (
    MAX_CLAIMANT_LENGTH,
    AttemptStatus,
    RunStatus,
    StepStatus,
    run_lease_key,
)

__all__ = [
    "FUNCTIONS_MIGRATION",
    "AttemptStatus",
    "QueueCounts",
    "ResultWithNext",
    "RunOutcome",
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
    "write_pending",
]


class WorkflowRunQuerySet(RunForks):
    """Domain methods of ``WorkflowRun.objects``: start, passes, finish, operators'
    operations, delayed and debounced starts, deadlines, what a replay check reads, forks
    (:class:`~django_leases.models.passes.RunPasses`,
    :class:`~django_leases.models.operations.RunOperations`,
    :class:`~django_leases.models.timing.RunTiming`,
    :class:`~django_leases.models.patches.RunReplays`,
    :class:`~django_leases.models.forks.RunForks`)."""


class WorkflowStepQuerySet(StepProgress):
    """Domain methods of ``WorkflowStep.objects``: schedule, claim, fenced writes, history,
    patch decisions, results in a step's own transaction, progress
    (:class:`~django_leases.models.outcomes.StepOutcomes`,
    :class:`~django_leases.models.claims.StepClaims`,
    :class:`~django_leases.models.scheduling.StepScheduling`,
    :class:`~django_leases.models.results.StepResults`,
    :class:`~django_leases.models.patches.StepPatches`,
    :class:`~django_leases.models.exactly.StepTransactions`,
    :class:`~django_leases.models.progress.StepProgress`)."""


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


def _queue_key_field(help_text: _StrPromise) -> models.CharField[str, str]:
    """The ``queue_key`` column of a run and of a step: a key of at most
    ``MAX_QUEUE_KEY_LENGTH`` characters, empty (also in the database's default) for none."""
    return models.CharField(
        _("queue key"),
        max_length=MAX_QUEUE_KEY_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text=help_text,
    )


class WorkflowRun(models.Model):
    """One execution of a ``@workflow``, run in passes (each replays what the run recorded).

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
    queue_key = _queue_key_field(
        _("The key its steps count under for a queue's per-key limits (empty: none).")
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        help_text=_("The run that started this one with run.child."),
    )
    deadline_at = models.DateTimeField(
        _("deadline"),
        null=True,
        blank=True,
        help_text=_("A run not finished by then is failed (database clock)."),
    )
    first_pass_at = models.DateTimeField(
        _("first pass at"),
        null=True,
        blank=True,
        help_text=_(
            "When a delayed or debounced start's first pass is due; the run is pending "
            "while its next pass is due then."
        ),
    )
    debounce_key = models.CharField(
        _("debounce key"),
        max_length=MAX_KEY_LENGTH,
        null=True,
        blank=True,
        help_text=_("Set while a debounced start is pending: one per workflow and key."),
    )
    tags = models.JSONField(
        _("tags"),
        null=True,
        blank=True,
        help_text=_("Names and values the run was started with, to find it by."),
    )
    forked_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="forks",
        verbose_name=_("forked from"),
        help_text=_("The run this one was forked from (fork_run)."),
    )
    created_at = AutoTimeField(_("created at"), auto_now_add=True)
    updated_at = AutoTimeField(_("updated at"), auto_now=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    #: Set by ``WorkflowRun.objects.start``: whether that call created the run (``False``:
    #: a run with the same key existed, or a pending debounced run took the start).
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
            # At most one pending debounced run per workflow and debounce key: the key is
            # set only while the run is pending (NULLs never collide).
            models.UniqueConstraint(
                fields=["workflow", "debounce_key"], name="dl_run_unique_debounce"
            ),
        )
        indexes = (
            models.Index(
                fields=["pass_due_at"],
                name="dl_run_pass_due",
                condition=Q(pass_due_at__isnull=False),
            ),
            models.Index(fields=["status", "created_at"], name="dl_run_status"),
            models.Index(
                fields=["deadline_at"],
                name="dl_run_deadline",
                condition=Q(deadline_at__isnull=False),
            ),
            # The admin's search by key (equal, or starts with): on PostgreSQL with the
            # pattern operator class, so a prefix LIKE is served whatever the collation.
            models.Index(fields=["key"], name="dl_run_key", opclasses=["varchar_pattern_ops"]),
        )

    def __str__(self) -> str:
        return f"{self.workflow} {self.id}"

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        """Django's model checks, but ``models.W037`` (MariaDB and MySQL ignore the partial
        indexes' conditions; the full indexes serve: :func:`db.without_partial_index_warning`)."""
        return db.without_partial_index_warning(super().check(**kwargs))

    #: Which operator operation a run in each status allows, and the rule that says so.
    OPERATIONS: ClassVar[dict[str, tuple[tuple[str, ...], _StrPromise, _StrPromise]]] = {
        "resume": (
            (RunStatus.SUSPENDED, RunStatus.FAILED),
            _("resumed"),
            _("only a suspended or failed run can be"),
        ),
        "cancel": (
            (RunStatus.RUNNING, RunStatus.SUSPENDED),
            _("cancelled"),
            _("only a running or suspended run can be"),
        ),
        "retry": (
            (RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.FAILED),
            _("retried"),
            _("a step of a finished run cannot be"),
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
            raise refused_in_state(self.pk, self.status, str(verb), str(rule))

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
    # What a pass reads of the step carries its result as JSON text, decoded when read.
    result = RecordedJSONField(null=True, blank=True)
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
    given_back = models.PositiveIntegerField(
        _("given back"),
        default=0,
        db_default=0,
        help_text=_(
            "Attempts a library error cut short and gave back since an operator last retried "
            "the step (the first 10 are not counted against its retries)."
        ),
    )
    # Stored by every claim: a step fence is live only under the claim that ran it
    # (``attempt_running``), even when a promoted server hands the same attempt out again.
    fence_floor = models.BigIntegerField(
        _("fence floor"),
        default=0,
        db_default=0,
        help_text=_(
            "The epoch floor of the server that granted the running attempt's claim "
            "(0: a database that never failed over)."
        ),
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
    progress = models.JSONField(
        _("progress"),
        null=True,
        blank=True,
        help_text=_("What the running attempt last said of its progress (ctx.set_progress)."),
    )
    queue_key = _queue_key_field(
        _("The key it counts under for its queue's per-key limits (empty: none).")
    )
    created_at = AutoTimeField(auto_now_add=True)
    updated_at = AutoTimeField(auto_now=True)

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
            # A limited queue's claim (``claim_queue``): its waiting steps key by key (a skip
            # scan over the keys, then each key's first step in the claim order).
            models.Index(
                fields=["queue", "queue_key", "-priority", "available_at", "id"],
                name="dl_step_key_waiting",
                condition=Q(status__in=["pending", "scheduled", "failed"]),
            ),
        )

    def __str__(self) -> str:
        return gettext("%(name)s (attempt %(attempt)d, %(status)s)") % {
            "name": self.step_name,
            "attempt": self.attempt,
            "status": StepStatus(self.status).label if self.status in StepStatus else self.status,
        }

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        """Django's model checks, but ``models.W037`` (MariaDB and MySQL ignore the partial
        indexes' conditions; the full indexes serve: :func:`db.without_partial_index_warning`)."""
        return db.without_partial_index_warning(super().check(**kwargs))

    @property
    def max_attempts(self) -> int:
        """``retries + 1``: how many attempts the step may have."""
        return self.retries + 1


class WorkflowStepAttempt(models.Model):
    """One claim of a step: the run history. A superseded attempt keeps ``running``.

    ``started_at`` and ``finished_at`` come from the database clock.

    A result is stored once, on the step: a step succeeds at most once (a succeeded step is
    never claimed again) and keeps the result of the attempt that succeeded, so that
    attempt's :attr:`result` is read from its step (loaded with it by
    :meth:`WorkflowStepAttemptQuerySet.for_run`) and the attempt row holds none. A failed
    attempt keeps its ``error`` here: the step's ``error`` is only its latest attempt's.

    The table keeps a ``result`` column the model no longer has (migration
    ``0038_results_once`` emptied it): the previous release's workers still write it while a
    rolling deploy runs both; a later release drops it.
    """

    # Served by the unique (step, attempt) index, whose leading column it is.
    step = models.ForeignKey(
        WorkflowStep, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING
    )
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

    @property
    def result(self) -> Any:
        """The attempt's result (JSON): its step's for the attempt that succeeded, ``None``
        for any other (failed, running or superseded). Reads ``self.step``: load it with
        the attempt (``select_related("step")``, as :meth:`~WorkflowStepAttemptQuerySet.for_run`
        does) to read many without a query each."""
        if self.status != AttemptStatus.SUCCEEDED:
            return None
        return self.step.result
