"""The values the workflow layers pass each other: statuses, error codes and result types.

A leaf module (it imports no model; only the settings' names and the checks of
:mod:`django_leases.validation`), so the models, the tuned statements
(:mod:`django_leases.workflows.sql`), the driver and the engine all speak the same words.
:mod:`django_leases.models` re-exports the statuses.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_LENGTH
from django_leases.frozen import frozen
from django_leases.validation import (
    check_backoff,
    check_name,
    check_priority,
    check_queue_key,
    check_retries,
    check_step_timeout,
)

if TYPE_CHECKING:  # for annotations only: this module imports no model
    from django_leases.models import Lease, WorkflowRun, WorkflowStep


class RunStatus(models.TextChoices):
    """A run is ``running`` until its workflow returns (``completed``) or raises (``failed``).

    ``suspended`` waits for an operator (e.g. a step function missing from the deployed code);
    ``cancelled`` was stopped by an operator.
    """

    # The labels are Django's default ones (the name, capitalised), marked for translation:
    # the same text, so the fields' choices (and their migrations) stay as they are.
    RUNNING = "running", _("Running")
    SUSPENDED = "suspended", _("Suspended")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class StepStatus(models.TextChoices):
    """``pending``: created by a pass, never claimed. ``scheduled``: waiting to be claimed again
    at the same attempt (e.g. after a resume). ``running``: claimed under a step lease.
    ``succeeded`` / ``failed``: the current attempt's outcome (a failed step with retries left
    is claimed again as attempt + 1 once ``available_at`` has passed). ``patch``: not a step
    but the run's recorded answer to ``run.patched(name)`` (``result`` is ``true`` or
    ``false``; no step function, never claimed).
    """

    PENDING = "pending", _("Pending")
    SCHEDULED = "scheduled", _("Scheduled")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    PATCH = "patch", _("Patch")


class AttemptStatus(models.TextChoices):
    """One attempt's outcome. A superseded attempt stays ``running`` for ever."""

    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")


class WaitKind(models.TextChoices):
    """What a run waits for at a wait (``run.sleep``, ``run.wait_for_event``, ``run.child``)."""

    SLEEP = "sleep", _("Sleep")
    EVENT = "event", _("Event")
    CHILD = "child", _("Child")


class WaitStatus(models.TextChoices):
    """``waiting``: the run reached the wait and its outcome is not known yet. ``done``: the
    sleep elapsed, the event arrived (possibly before the run reached the wait) or the child
    run finished. ``timed_out``: the event's timeout passed before it arrived (final)."""

    WAITING = "waiting", _("Waiting")
    DONE = "done", _("Done")
    TIMED_OUT = "timed_out", _("Timed Out")


#: Statuses of a step waiting to be claimed (a failed one only while it has attempts left).
WAITING_STEP_STATUSES = (StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.FAILED)

#: Statuses of a run that has finished for good (or until an operator resumes a failed one).
FINISHED_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def status_said(value: str) -> str:
    """A run's or step's status as a sentence says it, in the active language (``"completed"``,
    German ``"abgeschlossen"``): its label, lowercased; ``value`` itself when it is no status."""
    for choices in (RunStatus, StepStatus):
        if value in choices.values:
            return str(choices(value).label).lower()
    return value


def exhausted(attempt: int, retries: int) -> bool:
    """Whether attempt ``attempt`` (``int``, from 1) is a step's last: ``retries`` (``int``)
    allows ``retries + 1`` attempts. A failed step whose attempt is its last failed for
    good; one with attempts left is claimed again once due. The one rule, here and in SQL
    (:func:`exhausted_q`, ``sql.py``'s ``_failed_for_good``)."""
    return attempt >= retries + 1


def exhausted_q() -> Q:
    """:func:`exhausted` as a filter on ``WorkflowStep`` rows (``attempt >= retries + 1``)."""
    return Q(attempt__gte=F("retries") + 1)


def attempts_left_q() -> Q:
    """The steps whose attempt is not their last (``attempt < retries + 1``): a failed one
    is claimed again once due."""
    return Q(attempt__lt=F("retries") + 1)


def failed_for_good_q() -> Q:
    """The steps that failed on their last attempt: no claim retries them."""
    return Q(status=StepStatus.FAILED) & exhausted_q()


#: The columns of a step that its run's replay goes by: its names and its recorded outcome
#: (what a pass, a replay check and a fork all read of it).
REPLAYED_STEP_FIELDS = (
    "step_name",
    "function_name",
    "status",
    "result",
    "error",
    "attempt",
    "retries",
)

#: The columns of a step's retry delay (:class:`StepOptions`; ``retries`` is replayed).
RETRY_DELAY_FIELDS = ("retry_delay", "retry_backoff", "retry_delay_max")

#: Error code of a run suspended because a step function is not registered in this process.
STEP_FUNCTION_NOT_FOUND = "STEP_FUNCTION_NOT_FOUND"
#: Error code of a run suspended because its workflow is not registered in this process.
WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"
#: Error code of a step whose every attempt lost its worker (lease lapsed).
STEP_LEASE_LAPSED = "STEP_LEASE_LAPSED"
#: Error code of a step whose function returned something that is not JSON.
STEP_RESULT_NOT_JSON = "STEP_RESULT_NOT_JSON"
#: Error code of a step attempt that ran longer than the step's ``timeout``.
STEP_TIMED_OUT = "STEP_TIMED_OUT"
#: Error code of a transactional step attempt whose transaction a database error of the
#: library's own cut short (rolled back): given back, it does not count against ``retries``.
STEP_TRANSACTION_CUT_SHORT = "STEP_TRANSACTION_CUT_SHORT"
#: Error code of a run failed because a step failed on its last attempt.
STEP_FAILED = "STEP_FAILED"
#: Error code of a run whose workflow function raised.
WORKFLOW_ERROR = "WORKFLOW_ERROR"
#: Error code of a run stopped by an operator, and of the step attempt it stopped.
RUN_CANCELLED = "RUN_CANCELLED"

#: Prefix of the lease key an orchestration pass of a run holds.
RUN_LEASE_PREFIX = "workflow-run:"
#: Prefix of a worker's heartbeat lease: ``workflow-worker:<host>:<pid>:<id>`` (``<id>`` is
#: the worker's own, as host and pid need not be unique: containers on the host's network).
WORKER_LEASE_PREFIX = "workflow-worker:"


#: Length of a claimant's name (:func:`claimant_name`): a hex digest.
MAX_CLAIMANT_LENGTH = 32


def claimant_name(holder: str, token: int, step_id: int, attempt: int) -> str:
    """The name a write gives the claim of the step it creates (``WorkflowStep.claimant``),
    so that the same write tried again after a lost reply can tell its own claim from
    another worker's: derived from the run lease the writer holds (``holder``, ``token``)
    and the attempt whose result the write records (``step_id``, ``attempt``), so every try
    of one write names the same claimant and no other write does. A hex ``str`` of
    :data:`MAX_CLAIMANT_LENGTH` characters."""
    seed = f"{holder}\0{token}\0{step_id}\0{attempt}".encode()
    return hashlib.sha256(seed).hexdigest()[:MAX_CLAIMANT_LENGTH]


def fresh_claimant() -> str:
    """A name for one claim of a due step (``WorkflowStep.claimant``) that nothing else
    names: a caller whose claim's reply was lost finds the step it may hold by it, and
    hands it back. A hex ``str`` of :data:`MAX_CLAIMANT_LENGTH` characters."""
    return uuid.uuid4().hex[:MAX_CLAIMANT_LENGTH]


def run_lease_key(run_id: uuid.UUID | str) -> str:
    """The key of the lease an orchestration pass of run ``run_id`` holds:
    ``workflow-run:<id>``."""
    return f"{RUN_LEASE_PREFIX}{run_id}"


@frozen
class Claim:
    """A step claimed for execution: the claimer owns attempt ``attempt`` until superseded.

    Attributes:
        step_id: primary key of the :class:`~django_leases.models.WorkflowStep` (``int``).
        run_id: the run's ``uuid.UUID``.
        step_name: the step's name within its run.
        function_name: the ``@step_function`` to call.
        attempt: the fencing number every write of this claim must carry (``int`` ≥ 1).
        data: the step's JSON input.
        lease_ttl: the step lease's TTL in seconds (``float``).
        claimed_at: ``time.monotonic()`` taken just before the claim was sent (the start of
            the local lease deadline for the renewal loop).
        using: the database alias the claim was made on.
        run_created_at: when the run was created (database clock), where the claim read
            it; else ``None``.
        started_at: when this attempt started (database clock, its attempt row's
            ``started_at``), where the claim read it; else ``None``.
        run_workflow: the run's workflow name, where the claim read it; else ``None``.
        fence_floor: the epoch floor of the server that granted the claim, read in the
            claim's own statement or transaction (PostgreSQL: ``(timeline - 1) ×
            EPOCH_SPAN``, see :mod:`django_leases.models.lease`; 0 on a database that never
            failed over, and on SQLite and MariaDB / MySQL). The attempt's fence token is
            ``fence_floor + attempt`` (``StepContext.fence``), so an attempt claimed again
            after an asynchronous promotion lost its first claim fences above it.
    """

    step_id: int
    run_id: uuid.UUID
    step_name: str
    function_name: str
    attempt: int
    data: Any = field(repr=False)
    lease_ttl: float
    claimed_at: float
    using: str
    run_created_at: datetime | None = field(default=None, repr=False, compare=False)
    started_at: datetime | None = field(default=None, repr=False, compare=False)
    run_workflow: str | None = field(default=None, repr=False, compare=False)
    fence_floor: int = field(default=0, repr=False, compare=False)


@frozen
class PassState:
    """What an orchestration pass reads: the run (``id``, ``workflow``, ``status``, ``input``,
    ``pass_requests`` loaded) and its steps by name, as one statement read them."""

    run: WorkflowRun = field(repr=False)
    steps: dict[str, WorkflowStep] = field(repr=False)


@frozen
class PassClaim:
    """A run picked for an orchestration pass.

    Attributes:
        run_id: the run's ``uuid.UUID``.
        using: the database alias.
        state: the run and its steps, read with the pick (:class:`PassState`).
        lease: the run lease taken with the pick (a ``Lease``), when the pick asked for it
            and got it; else ``None``.
        lease_refused: the pick asked for the run lease and another holder had it live.
        sent: ``time.monotonic()`` just before the pick was sent (the lease's local deadline
            starts there).
    """

    run_id: uuid.UUID
    using: str
    state: PassState = field(repr=False, compare=False)
    lease: Lease | None = field(default=None, repr=False, compare=False)
    lease_refused: bool = field(default=False, repr=False, compare=False)
    sent: float = field(default=0.0, repr=False, compare=False)


@frozen
class StepWrite:
    """What a step's fenced result or error write did.

    Attributes:
        status: the step's status now (``"succeeded"`` or ``"failed"``).
        written: ``False`` when the write repeated what this attempt had already recorded
            (its first try committed but its acknowledgement was lost); nothing was written.
        state: with ``hold_pass_seconds``, the run and its steps as the write left them, for
            the pass the caller runs next (``None`` where none was taken or the run is not
            running).
        pass_requested: the write asked the run for its next pass (taken for the caller
            with ``hold_pass_seconds``); ``False`` for a parallel step that was not the last
            of its siblings to finish, or a run no longer running: the caller has no pass to
            run.
    """

    status: str
    written: bool = True
    state: PassState | None = field(default=None, repr=False)
    pass_requested: bool = True


@frozen
class StepOptions:
    """How a step runs, recorded with it when it is created (DESIGN §5, §5b): one value that
    ``run.step``, the store's writes and the tuned statements all take.

    Attributes:
        retries: attempts after the first (``int``, 0 to 1000): at most ``retries + 1``.
        retry_delay: seconds before the first retry (``float``, 0 to 86 400).
        retry_backoff: the factor each later retry delay is multiplied by (``float`` ≥ 1;
            1.0: every delay is ``retry_delay``).
        retry_delay_max: seconds no retry delay exceeds (``float``, 0 to 86 400; ``None``:
            one day).
        timeout: seconds an attempt may run before it is failed (``float`` > 0; ``None``:
            no limit).
        queue: the queue the step is claimed from (a name of 1–200 characters).
        priority: higher is claimed first (``int`` of 32 bits; first due first within one).
        queue_key: the key the step counts under for its queue's per-key limits (``str`` of
            1–255 characters; ``None``: the run's ``queue_key``, if any).

    Every value is checked (and numbers made ``float``) when the options are made: a bad
    one is a ``ValueError`` naming it.
    """

    retries: int = 5
    retry_delay: float = 0.0
    retry_backoff: float = 1.0
    retry_delay_max: float | None = None
    timeout: float | None = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    queue_key: str | None = None

    def __post_init__(self) -> None:
        retries, retry_delay = check_retries(self.retries, self.retry_delay)
        retry_backoff, retry_delay_max = check_backoff(self.retry_backoff, self.retry_delay_max)
        checked = {
            "retries": retries,
            "retry_delay": retry_delay,
            "retry_backoff": retry_backoff,
            "retry_delay_max": retry_delay_max,
            "timeout": check_step_timeout(self.timeout),
            "queue": check_name(self.queue, "A queue name", max_length=MAX_QUEUE_LENGTH),
            "priority": check_priority(self.priority, "Step priority"),
            "queue_key": check_queue_key(self.queue_key),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def placed(self, queue: str, priority: int) -> StepOptions:
        """These options with the step's ``queue`` and ``priority`` (its step function's
        declaration, or the call's)."""
        return replace(self, queue=queue, priority=priority)

    def one_statement(self, limited: bool) -> bool:
        """Whether the tuned statements that insert a step already claimed may write it:
        they set no deadline, write the columns' defaults for queue and priority and enforce
        no queue limit — so only a step of the default queue, with no timeout, priority 0,
        whose queue has no limits (``limited``: whether it has any)."""
        return (
            self.timeout is None
            and self.queue == DEFAULT_QUEUE
            and self.priority == 0
            and not self.queue_key
            and not limited
        )


@frozen
class NextStep:
    """A step a workflow asks for (``run.step``), as it is to be created: ``step_name``,
    ``function_name``, JSON ``data`` and its :class:`StepOptions`."""

    step_name: str
    function_name: str
    data: Any
    options: StepOptions = field(default_factory=StepOptions)


@frozen
class PendingResult:
    """A step attempt's result that a pass has handed to its workflow and not written yet
    (DESIGN §5: deferred recording): ``step_id``, the fencing ``attempt`` and the JSON
    ``result``. The write that records what the workflow does next writes it too."""

    step_id: int
    attempt: int
    result: Any = field(repr=False)


def nothing_owed() -> None:
    """What :attr:`RunCompletion.notify` is when the write sent its signals itself."""


@frozen
class RunCompletion:
    """What ``WorkflowStep.objects.set_result_completing_run`` did.

    Attributes:
        written: the step's fence matched and its result was recorded (``bool``); when
            ``False`` nothing else was written either.
        completed: the run was ``running`` and is now ``completed`` (``bool``).
        lease_live: the run lease was released and had been live up to then (``True``),
            released but lapsed already (``False``), or not released (``None``: the fence
            refused, or the lease had passed on).
        next_pass: the next due pass picked with its lease, when asked for (else ``None``).
        finished_at: the run's ``finished_at`` (database clock, ``datetime``) when this
            write completed it and read it back (the tuned path), else ``None``.
        pass_asked: without a held run lease, the result was written but a pass held the
            run lease, so the run's pass was asked for instead of completing it.
        next_step: the next due step claimed with its step lease, when asked for (else
            ``None``).
        notify: sends the signals this write owes (``lease_acquired`` and
            ``lease_released`` of the instant grant, ``step_attempt_finished``,
            ``run_completed``): a write that claimed ``next_step`` leaves them to its caller,
            who renews that step's lease while their receivers (user code) run; otherwise
            they were sent and this does nothing. Once only.
    """

    written: bool
    completed: bool
    lease_live: bool | None
    next_pass: PassClaim | None = None
    finished_at: datetime | None = None
    pass_asked: bool = False
    next_step: Claim | None = None
    notify: Callable[[], None] = field(default=nothing_owed, repr=False, compare=False)


@frozen
class RunChange:
    """What an operator operation (``resume``, ``cancel``, ``retry_step``) did to a run.

    Attributes:
        run_id: the run's ``uuid.UUID``.
        before: the run's status before the operation (``str``).
        after: its status now (``str``).
        steps: names of the steps made due again (resume, retry) or stopped (cancel).
    """

    run_id: uuid.UUID
    before: str
    after: str
    steps: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"Run {self.run_id}: {self.before} → {self.after}"
        if self.steps:
            verb = "stopped" if self.after == RunStatus.CANCELLED else "due again as a new attempt"
            text += f"; step(s) {', '.join(repr(s) for s in self.steps)} {verb}"
        return text


#: The built-in workflow each Django task (``django_leases.tasks``) runs as, its step function
#: and its one step's name: how the admin tells task runs from workflow runs.
TASK_WORKFLOW = "django_leases.task"
TASK_FUNCTION = "django_leases.task"
TASK_STEP = "task"


__all__ = [
    "FINISHED_RUN_STATUSES",
    "MAX_CLAIMANT_LENGTH",
    "REPLAYED_STEP_FIELDS",
    "RETRY_DELAY_FIELDS",
    "RUN_CANCELLED",
    "RUN_LEASE_PREFIX",
    "STEP_FAILED",
    "STEP_FUNCTION_NOT_FOUND",
    "STEP_LEASE_LAPSED",
    "STEP_RESULT_NOT_JSON",
    "STEP_TIMED_OUT",
    "STEP_TRANSACTION_CUT_SHORT",
    "TASK_FUNCTION",
    "TASK_STEP",
    "TASK_WORKFLOW",
    "WAITING_STEP_STATUSES",
    "WORKER_LEASE_PREFIX",
    "WORKFLOW_ERROR",
    "WORKFLOW_NOT_FOUND",
    "AttemptStatus",
    "Claim",
    "NextStep",
    "PassClaim",
    "PassState",
    "PendingResult",
    "RunChange",
    "RunCompletion",
    "RunStatus",
    "StepOptions",
    "StepStatus",
    "StepWrite",
    "WaitKind",
    "WaitStatus",
    "attempts_left_q",
    "claimant_name",
    "exhausted",
    "exhausted_q",
    "failed_for_good_q",
    "fresh_claimant",
    "nothing_owed",
    "run_lease_key",
    "status_said",
]
