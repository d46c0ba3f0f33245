"""Every error django-leases raises, under one root: :class:`DjangoLeasesError`.

::

    DjangoLeasesError
    ├── LeaseError (.key)                      LeaseTakenError, LeaseLostError
    ├── FenceRefusedError (.key, .token)
    ├── WorkflowError                          WorkflowStepSupersededError
    │                                          └── WorkflowStepCancelledError
    │                                          WorkflowStepFailedError
    │                                          WorkflowStepTimedOutError
    │                                          StepNotIdempotentError (also an AssertionError)
    │                                          UnknownWorkflowError (also a LookupError)
    │                                          WorkflowRunStateError (also a ValueError)
    │                                          WorkflowFunctionsMissing
    │                                          UnknownScheduleError (also a LookupError)
    │                                          QueueConfigError (also ImproperlyConfigured)
    ├── TaskError                              TaskArgumentsError (also a TypeError)
    │                                          TaskAttemptError
    └── TriggerSourceError (.name)             UnknownTriggerSourceError (also a LookupError)
                                               SourceStillDeclared, SourceOrphaned, NoAddress,
                                               ProviderNotInstalled, NoReceiveURL, SourceBusy
                                               ProviderError, CredentialError
                                               ReceiveError (.status): SourceNotReceiving,
                                               PayloadTooLarge, SignatureMismatch,
                                               MalformedDelivery (also a ValueError)

Bad arguments are ``ValueError`` (never truncated or guessed at), raised before anything is
written. The errors are also importable where they are raised: ``django_leases`` (the lease
errors), ``django_leases.workflows`` and ``django_leases.triggers`` (and the trigger modules
that raised them before this module held them all). This module imports nothing of the
package.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext


class DjangoLeasesError(Exception):
    """The root of every error django-leases raises (bad arguments aside: ``ValueError``)."""


class MisuseError(DjangoLeasesError, RuntimeError):
    """Called where or how it cannot work: a worker or a lease grant inside
    ``transaction.atomic()``, a ``hold_lease`` entered twice, a handle used before its
    lease is held, ``drive()`` that never ran out of due work. A ``RuntimeError`` too, as
    such errors are in Python."""


# -- leases -------------------------------------------------------------------------------------


class LeaseError(DjangoLeasesError):
    """Base class of the lease errors; ``.key`` is the lease key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class LeaseTakenError(LeaseError):
    """The key is held, live, by another holder (``hold_lease`` does not wait unless asked)."""

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} is held by another holder")


class LeaseLostError(LeaseError):
    """The lease lapsed or passed to another holder before the body finished.

    Raised by ``hold_lease`` / ``ahold_lease`` when it cannot vouch that the body ran alone,
    by ``HeldLease.check()`` once the loss is seen, and by ``Lease.objects.fenced()`` when
    the lease is no longer held.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} was lost before the body finished")


# -- workflows ----------------------------------------------------------------------------------


class WorkflowError(DjangoLeasesError):
    """Base class of the workflow errors."""


class WorkflowStepSupersededError(WorkflowError):
    """A step write came from an attempt that a newer claim has replaced.

    Nothing was written. ``.step_id`` and ``.attempt`` name the refused write,
    ``.current_attempt`` the attempt that owns the step now (``None`` if unknown).
    """

    def __init__(self, step_id: object, attempt: int, current_attempt: int | None = None) -> None:
        detail = f" (current attempt is {current_attempt})" if current_attempt is not None else ""
        super().__init__(
            f"Attempt {attempt} of step {step_id} was superseded{detail}; its write was refused"
        )
        self.step_id = step_id
        self.attempt = attempt
        self.current_attempt = current_attempt


class WorkflowStepCancelledError(WorkflowStepSupersededError):
    """A step write came from an attempt that an operator's cancel of its run stopped.

    A :class:`WorkflowStepSupersededError`, so the engine drops it quietly; nothing was
    written.
    """

    def __init__(self, step_id: object, attempt: int) -> None:
        super().__init__(step_id, attempt, attempt)
        self.args = (
            f"Attempt {attempt} of step {step_id} was stopped: its run was cancelled; "
            "its write was refused",
        )


class WorkflowStepTimedOutError(WorkflowError):
    """A transactional step's attempt ran past its ``timeout`` (on the database clock): its
    transaction was rolled back and the attempt fails with this error, code
    ``STEP_TIMED_OUT`` (retried if attempts remain). ``.step_id``, ``.attempt`` name it."""

    code = "STEP_TIMED_OUT"

    def __init__(self, step_id: object, attempt: int, timeout: float | None = None) -> None:
        limit = f" of {timeout:g} s" if timeout is not None else ""
        super().__init__(
            f"Attempt {attempt} of step {step_id} ran longer than its timeout{limit}; "
            "its transaction was rolled back"
        )
        self.step_id = step_id
        self.attempt = attempt


class StepNotIdempotentError(WorkflowError, AssertionError):
    """``drive(..., duplicate_steps=True)`` found steps whose second run changed the database
    (:mod:`django_leases.testing.duplicates`). ``.steps`` lists them (each names the run,
    the step, its step function and what the second run changed). Also an
    ``AssertionError``, so a test fails with the list."""

    def __init__(self, steps: list[object]) -> None:
        listed = "\n".join(f"  - {step}" for step in steps)
        super().__init__(
            f"{len(steps)} step(s) changed the database again when run a second time "
            f"(not idempotent):\n{listed}"
        )
        self.steps = steps


class FenceRefusedError(DjangoLeasesError):
    """A fenced write to an application's own rows was refused: the lease or step attempt it
    was fenced to is no longer held, or a newer holder already wrote the row
    (:mod:`django_leases.fencing`). Nothing was written. ``.key`` names the lease key or
    step (``workflow-step:<id>``), ``.token`` the refused fencing token or attempt."""

    def __init__(self, key: str, token: int) -> None:
        super().__init__(f"Fenced write of {key!r} (fence {token}) was refused: a stale holder")
        self.key = key
        self.token = token


class WorkflowStepFailedError(WorkflowError):
    """Raised by ``run.step`` for a step that failed on its last attempt.

    Uncaught, it fails the run with code ``STEP_FAILED``. ``.step_name`` and ``.error`` (the
    step's JSON error) describe it.
    """

    def __init__(self, step_name: str, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        super().__init__(f"Step {step_name!r} failed on its last attempt: {message}")
        self.step_name = step_name
        self.error = error


class WorkflowEventTimeout(WorkflowError):
    """Raised by ``run.wait_for_event`` inside the workflow when its ``timeout`` passed
    before the event arrived. Catchable: a workflow may go on without the event; uncaught,
    it fails the run. ``.name`` is the wait's name, ``.timeout`` its timeout in seconds."""

    def __init__(self, name: str, timeout: float | None) -> None:
        after = "" if timeout is None else f" within {timeout:g} s"
        super().__init__(f"Event {name!r} did not arrive{after}")
        self.name = name
        self.timeout = timeout


class WorkflowEventRefusedError(WorkflowError, ValueError):
    """``send_event`` refused an event: the wait of that name already has its event, timed
    out, or is another kind of wait. Nothing was written. ``.run_id``, ``.name`` and
    ``.reason`` say which."""

    def __init__(self, run_id: uuid.UUID, name: str, reason: str) -> None:
        super().__init__(
            gettext("Event %(name)r for run %(run)s was refused: %(reason)s")
            % {"name": name, "run": run_id, "reason": reason}
        )
        self.run_id = run_id
        self.name = name
        self.reason = reason


class WorkflowChildFailedError(WorkflowError):
    """Raised by ``run.child`` in the parent when the child run failed or was cancelled.

    Uncaught, it fails the parent run. ``.name`` (the wait's name), ``.child_id``,
    ``.status`` (``"failed"`` or ``"cancelled"``) and ``.error`` (the child's JSON error)
    describe it."""

    def __init__(self, name: str, child_id: uuid.UUID | None, status: str, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        super().__init__(f"Child run {name!r} ({child_id}) ended {status}: {message}")
        self.name = name
        self.child_id = child_id
        self.status = status
        self.error = error


class WorkflowDeadlineExceeded(WorkflowError):
    """What a run that was not finished by its deadline (``start_workflow(...,
    deadline=)``, ``run.child(..., deadline=)``) failed with: its error records this type
    and code ``WORKFLOW_DEADLINE_EXCEEDED``. ``.run_id`` and ``.deadline_at`` (an aware
    ``datetime``, database clock, or ``None`` if unknown) say which run and when."""

    code = "WORKFLOW_DEADLINE_EXCEEDED"

    def __init__(self, run_id: uuid.UUID, deadline_at: Any = None) -> None:
        when = "" if deadline_at is None else f" ({deadline_at.isoformat()})"
        super().__init__(f"Run {run_id} was not finished by its deadline{when}")
        self.run_id = run_id
        self.deadline_at = deadline_at


class UnknownWorkflowError(WorkflowError, LookupError):
    """No ``@workflow`` is registered under that name; ``.name`` is the name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"No workflow named {name!r} is registered (is its module imported?)")
        self.name = name


class UnknownScheduleError(WorkflowError, LookupError):
    """No workflow schedule row has that name; ``.name`` is the name."""

    def __init__(self, name: object) -> None:
        super().__init__(
            f"No workflow schedule named {name!r} (declared schedules get their row when a "
            "workflow worker starts, or with `manage.py workflow_schedules list`)"
        )
        self.name = name


class WorkflowRunStateError(WorkflowError, ValueError):
    """An operator operation was asked of a run (or step) whose state does not allow it.

    Nothing was written. ``.run_id`` and ``.status`` (the run's status) say which.
    """

    def __init__(
        self, run_id: uuid.UUID, status: str, verb: str, rule: str, *, said: str | None = None
    ) -> None:
        """``verb`` and ``rule`` (what was asked, and what allows it) in the active language,
        as the caller's ``gettext`` gives them; ``said``: the status as the message says it
        (default ``status``)."""
        super().__init__(
            gettext("Run %(run)s is %(status)s: %(rule)s %(verb)s")
            % {"run": run_id, "status": said or status, "rule": rule, "verb": verb}
        )
        self.run_id = run_id
        self.status = status


class WorkflowFunctionsMissing(WorkflowError):
    """The database lacks what the workflow tables' migrations install (``.alias``): the
    worker refuses to start until it is repaired. ``repair`` says how (default: run
    ``manage.py migrate``)."""

    def __init__(self, alias: str, missing: str, repair: str | None = None) -> None:
        super().__init__(
            f"Database {alias!r} lacks {missing}: "
            + (repair or f"run 'manage.py migrate --database {alias}'")
            + " before starting workers"
        )
        self.alias = alias


class QueueConfigError(WorkflowError, ImproperlyConfigured):
    """``DJANGO_LEASES["QUEUES"]`` is not usable (a concurrency that is not an integer ≥ 1, a
    malformed rate, an unknown key), or a queue was named that it does not configure.
    Raised where the setting is used (a worker starting, a claim); system check
    ``django_leases.E016`` / ``E023`` reports the same at start-up."""


# -- Django Tasks -------------------------------------------------------------------------------


class TaskError(DjangoLeasesError):
    """Base class of the errors of the Django Tasks backend (``django_leases.tasks``)."""


class TaskArgumentsError(TaskError, TypeError):
    """A task's arguments (or its return value) are not JSON that reads back as it was
    written (a ``TypeError``, as Django's own check of task arguments raises). Enqueueing
    stores nothing then."""


class TaskAttemptError(TaskError):
    """Raised by the worker for an attempt whose task function raised ``exception``: it
    carries, for the attempt's error record, the exception's class path
    (``exception_class_path``, e.g. ``"builtins.ValueError"``), its traceback (``str``) and
    the worker's id — what ``TaskResult.errors`` and ``worker_ids`` are read from."""

    def __init__(self, exception: BaseException, traceback: str, worker_id: str) -> None:
        kind = type(exception)
        self.exception_class_path = f"{kind.__module__}.{kind.__qualname__}"
        self.traceback = traceback
        self.worker_id = worker_id
        try:
            message = str(exception)
        except Exception:  # an exception whose __str__ raises is still this attempt's error
            message = f"<{kind.__name__}: str() failed>"
        super().__init__(message)
        self.error_fields = {
            "type": kind.__name__,
            "exception_class_path": self.exception_class_path,
            "traceback": traceback,
            "worker_id": worker_id,
        }


# -- trigger sources ----------------------------------------------------------------------------


class TriggerSourceError(DjangoLeasesError):
    """Base class of the trigger-source errors. ``.name`` is the source (``None`` where the
    error is not about one source). The message is meant for operators (the admin's message, a
    command's stderr) and never holds a secret."""

    def __init__(self, name: str | None, message: str) -> None:
        super().__init__(message)
        self.name = name


class UnknownTriggerSourceError(TriggerSourceError, LookupError):
    """No ``TriggerSource`` row has that name. ``.name`` is the name asked for."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"Unknown trigger source: {name!r}")


class SourceStillDeclared(TriggerSourceError):
    """``forget`` of a source that is still declared in code (only orphans are forgotten)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} is still declared in code; only an orphan can be "
            "forgotten (disable it instead, or remove its declaration and reconcile first)",
        )


class SourceOrphaned(TriggerSourceError):
    """``enable`` of a source whose declaration left the code (an orphan)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} is an orphan (its declaration left the code); it can "
            "only be torn down or forgotten",
        )


class NoAddress(TriggerSourceError):
    """``enable`` of a source with no ``base_url``: there is no URL to register."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} has no address yet: run "
            "'manage.py reconcile_trigger_sources --base-url https://your.app' first",
        )


class ProviderNotInstalled(TriggerSourceError):
    """The source's provider is not installed in this process, and it is needed."""

    def __init__(self, name: str, provider: str) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} uses provider {provider!r}, which is not installed here",
        )
        self.provider = provider


class NoReceiveURL(TriggerSourceError):
    """The project's URLconf does not include ``django_leases.urls``."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            f"Cannot build the receiving URL of trigger source {name!r}: add "
            "path('', include('django_leases.urls')) (any prefix) to your URLconf",
        )


class SourceBusy(TriggerSourceError):
    """Another operation on the source held its lease for longer than ``wait`` seconds."""

    def __init__(self, name: str, wait: float) -> None:
        super().__init__(
            name,
            f"Trigger source {name!r} is busy: another operation on it did not finish "
            f"within {wait:g} s; try again",
        )


class ProviderError(TriggerSourceError):
    """A provider step failed. The message is safe to show operators and to log: it never
    holds a secret or an API token (only the provider, the step and the HTTP status or
    network failure)."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class CredentialError(TriggerSourceError):
    """A stored secret cannot be decrypted with the configured keys (the key that encrypted
    it was dropped, or the row was altered). The message names the secret, never its value;
    ``.name`` is the secret's name (a source's signing secret: the source's)."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(name, message)


class ReceiveError(TriggerSourceError):
    """A delivery was refused; ``.status`` is the HTTP status to answer, nothing was recorded.

    The message (also ``.message``) is safe to send back to the sender: it never holds a
    secret. ``.reason`` says why, in the words of
    :data:`~django_leases.triggers.values.REFUSAL_REASONS` (each class has its usual one; a
    raise site may name another, as ``reason=``).
    """

    status = 400
    reason = "bad_request"

    def __init__(self, message: str, name: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(name, message)
        self.message = message
        if reason is not None:
            self.reason = reason


class SourceNotReceiving(ReceiveError):
    """Unknown, orphaned (no longer declared) or disabled source: 404."""

    status = 404
    reason = "not_receiving"


class SourceNotDeclaredHere(ReceiveError):
    """The source is declared and enabled (its row says so) but the process that received
    the delivery has no declaration of it: a web process of an older deploy, or one whose
    ``triggers.py`` failed to import. 503, so the sender delivers again later."""

    status = 503
    reason = "not_declared_here"


class PayloadTooLarge(ReceiveError):
    """The body is over ``DJANGO_LEASES["WEBHOOK_MAX_BODY"]``: 413."""

    status = 413
    reason = "too_large"


class SignatureMismatch(ReceiveError):
    """The signature header is missing or does not sign the body with the secret (or the
    source has no signing secret, ``reason="no_secret"``): 401."""

    status = 401
    reason = "bad_signature"


class MalformedDelivery(ReceiveError, ValueError):
    """Not a delivery we can read: 400. Signed, but its body, event or delivery id cannot be
    read (``reason="malformed"``); or, before the signature is checked, a ``Content-Length``
    that is not a number or a one-value header sent twice (``reason="bad_request"``)."""

    status = 400
    reason = "malformed"


__all__ = [
    "CredentialError",
    "DjangoLeasesError",
    "FenceRefusedError",
    "LeaseError",
    "LeaseLostError",
    "LeaseTakenError",
    "MalformedDelivery",
    "MisuseError",
    "NoAddress",
    "NoReceiveURL",
    "PayloadTooLarge",
    "ProviderError",
    "ProviderNotInstalled",
    "ReceiveError",
    "SignatureMismatch",
    "SourceBusy",
    "SourceNotDeclaredHere",
    "SourceNotReceiving",
    "SourceOrphaned",
    "SourceStillDeclared",
    "StepNotIdempotentError",
    "TaskArgumentsError",
    "TaskAttemptError",
    "TaskError",
    "TriggerSourceError",
    "UnknownScheduleError",
    "UnknownTriggerSourceError",
    "UnknownWorkflowError",
    "WorkflowChildFailedError",
    "WorkflowDeadlineExceeded",
    "WorkflowError",
    "WorkflowEventRefusedError",
    "WorkflowEventTimeout",
    "WorkflowFunctionsMissing",
    "WorkflowRunStateError",
    "WorkflowStepCancelledError",
    "WorkflowStepFailedError",
    "WorkflowStepSupersededError",
    "WorkflowStepTimedOutError",
]
