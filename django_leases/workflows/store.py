"""The workflow store: QuerySet methods behind ``WorkflowRun.objects``, ``WorkflowStep.objects``
and ``WorkflowStepAttempt.objects`` (DESIGN §5, reference rules F1–F10).

Every method opens the transaction it needs (``transaction.atomic(using=...)``), never
assuming one from its caller, and every "live / lapsed / due" decision is made on the
database clock inside the statement (``Now()``; see :mod:`django_leases.clock`).

The fence of a step is its ``attempt`` number:

* a **claim** that starts a new attempt raises ``attempt`` in the same guarded ``UPDATE``
  that grants the step lease, so exactly one claimer can own an attempt;
* a result, an error or a lease renewal is one ``UPDATE … WHERE id = ? AND attempt = ? AND
  status = 'running'``; when it matches nothing, the writer was **superseded** and
  :class:`~django_leases.exceptions.WorkflowStepSupersededError` is raised with nothing
  written — neither the step nor its attempt row (the history);
* lease expiry is *not* the fence: a slow worker that nobody replaced may still finish.
"""

from __future__ import annotations

import decimal
import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now

from django_leases import clock
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.validation import ttl_seconds
from django_leases.workflows.states import (
    RUN_CANCELLED,
    STEP_FUNCTION_NOT_FOUND,
    STEP_LEASE_LAPSED,
    STEP_RESULT_NOT_JSON,
    AttemptStatus,
    RunStatus,
    StepStatus,
)
from django_leases.workflows.wakeup import notify_work_due

if TYPE_CHECKING:
    from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt

#: Longest workflow, step or step-function name, in characters (the column width).
MAX_NAME_LENGTH = 200


# -- values -------------------------------------------------------------------------------------


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class PassClaim:
    """A run picked for an orchestration pass: ``run_id`` (``uuid.UUID``).

    ``run``: the picked :class:`~django_leases.models.WorkflowRun` as the pick read it
    (``id``, ``workflow``, ``status``, ``input``, ``pass_requests`` loaded), and ``steps``
    its steps by name, where the pick returned them in the same statement (PostgreSQL);
    else ``None``.
    """

    run_id: uuid.UUID
    using: str
    run: Any = field(default=None, repr=False, compare=False)
    #: The run's steps by name, read with ``run`` (else ``None``).
    steps: Any = field(default=None, repr=False, compare=False)
    #: The run lease taken with the pick (``lease_holder`` given), else ``None``.
    lease: Any = field(default=None, repr=False, compare=False)
    #: ``time.monotonic()`` just before the pick was sent (the lease's local deadline start).
    sent: float = field(default=0.0, repr=False, compare=False)
    #: The pick asked for the run lease and another holder had it live.
    lease_refused: bool = field(default=False, repr=False, compare=False)


@dataclass(frozen=True)
class RunCompletion:
    """What :meth:`WorkflowStepQuerySet.set_result_completing_run` did.

    Attributes:
        written: the step's fence matched and its result was recorded (``bool``); when
            ``False`` nothing else was written either.
        completed: the run was ``running`` and is now ``completed`` (``bool``).
        lease_live: the run lease was released and had been live up to then (``True``),
            released but lapsed already (``False``), or not released (``None``: the fence
            refused, or the lease had passed on).
        next_pass: the next due pass picked with its lease, when asked for (else ``None``).
    """

    written: bool
    completed: bool
    lease_live: bool | None
    next_pass: PassClaim | None = None


@dataclass(frozen=True)
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


class WorkflowRunStateError(ValueError):
    """An operator operation was asked of a run (or step) whose state does not allow it.

    Nothing was written. ``.run_id`` and ``.status`` (the run's status) say which.
    """

    def __init__(self, run_id: uuid.UUID, status: str, verb: str, rule: str) -> None:
        super().__init__(f"Run {run_id} is {status}: {rule} {verb}")
        self.run_id = run_id
        self.status = status


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


def parse_run_id(run_id: object) -> uuid.UUID:
    """``run_id`` (a ``uuid.UUID`` or its text) as a ``uuid.UUID``; ``ValueError`` otherwise."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id).strip())
    except ValueError:
        raise ValueError(f"{run_id!r} is not a workflow run id (a UUID)") from None


# -- JSON -------------------------------------------------------------------------------------


#: Deepest nesting of lists and objects a stored JSON value may have.
MAX_JSON_DEPTH = 100

_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


def _string_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored in a JSON column on every backend, or ``None``."""
    if "\x00" in text:
        return "contains a NUL character (PostgreSQL's jsonb cannot hold one)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode; it cannot be stored as UTF-8)"
    return None


def _json_problem(value: Any, path: str, depth: int) -> str | None:
    """The first reason ``value`` is not storable JSON, as ``"<path> <reason>"``, or ``None``.

    Recursion is bounded by :data:`MAX_JSON_DEPTH`, so a deep or self-referencing value is
    refused rather than exhausting the stack.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        problem = _string_problem(value)
        return f"{path} {problem}" if problem else None
    if isinstance(value, int):
        try:
            str(value)
        except ValueError:  # beyond sys.get_int_max_str_digits()
            return f"{path} is an integer too large to write as JSON"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r} (not a JSON number)"
    if isinstance(value, list | tuple | dict):
        if depth >= MAX_JSON_DEPTH:
            return f"{path} nests deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(value, dict):
            for key, item in value.items():
                if key is not None and not isinstance(key, str | int | float | bool):
                    return f"{path} has a key of type {type(key).__name__} (keys must be str)"
                text = key if isinstance(key, str) else json.dumps(key, allow_nan=False)
                problem = _string_problem(text)
                if problem:
                    return f"{path} has a key that {problem}"
                found = _json_problem(item, f"{path}[{text!a}]", depth + 1)
                if found:
                    return found
            return None
        for index, item in enumerate(value):
            found = _json_problem(item, f"{path}[{index}]", depth + 1)
            if found:
                return found
        return None
    return f"{path} is of type {type(value).__name__}, which is not JSON"


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if it can be stored as JSON on every supported database, else raise.

    The one rule for every JSON value the workflow store writes (run input and output, step
    data and results): ``None``, ``bool``, ``int``, finite ``float``, ``str``, ``list`` /
    ``tuple`` and ``dict`` (keys ``str``, or what ``json.dumps`` turns into one), nested at
    most :data:`MAX_JSON_DEPTH` levels, with no string or key holding a NUL character
    (PostgreSQL's ``jsonb`` refuses ``\\u0000``) or a lone surrogate (not encodable as UTF-8).

    Raises ``ValueError`` naming ``what`` and where in the value the problem is (the message
    itself is always storable).
    """
    try:
        problem = _json_problem(value, "$", 0)
        if problem is None:
            json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        problem = f"$ cannot be written as JSON ({type(exc).__name__})"
    if problem is not None:
        raise ValueError(f"{what} must be storable JSON: {_clean_text(problem)}")
    return value


def _clean_text(text: str) -> str:
    """``text`` with NUL characters and lone surrogates replaced by U+FFFD (storable)."""
    return _UNSTORABLE_CHARS.sub("\ufffd", text)


def error_json(error: BaseException | Mapping[str, Any] | str) -> dict[str, Any]:
    """The JSON form of a step or run error: at least ``{"message": str}``; always storable.

    An exception gives ``{"type": <class name>, "message": str(exc)}`` (plus its ``code``
    attribute, if any); a mapping is kept when it is storable JSON (``message`` added if
    missing); a string becomes the message. NUL characters and lone surrogates in the
    message, type and code are replaced by U+FFFD, so the error can always be written.
    """
    if isinstance(error, BaseException):
        try:
            message = str(error)
        except Exception:  # a broken __str__ must not stop the error being recorded
            message = f"<{type(error).__name__}: str() failed>"
        out: dict[str, Any] = {
            "type": _clean_text(type(error).__name__),
            "message": _clean_text(message),
        }
        code = getattr(error, "code", None)
        if isinstance(code, str):
            out["code"] = _clean_text(code)
        elif isinstance(code, int) and not isinstance(code, bool):
            out["code"] = code
        return out
    if isinstance(error, Mapping):
        out = {str(k): v for k, v in error.items()}
        try:
            check_json(out, "error")
        except ValueError:
            out = {
                str(k): v
                for k, v in out.items()
                if _json_problem(v, "$", 1) is None and _string_problem(str(k)) is None
            }
            out["message"] = _clean_text(str(error.get("message", "")) or _safe_repr(error))
        if not isinstance(out.get("message"), str):
            out["message"] = _clean_text("" if out.get("message") is None else str(out["message"]))
        return out
    return {"message": _clean_text(str(error))}


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except (Exception, RecursionError):
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 2000 else text[:1997] + "..."


def check_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a usable workflow, step or step-function name (a non-empty
    ``str`` of at most 200 characters without NUL), else raise ``ValueError``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, not {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}")
    problem = _string_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def _check_attempt(attempt: object) -> int:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
    return attempt


#: Most retries a step may ask for (``retries + 1`` attempts).
MAX_RETRIES = 1000
#: Longest delay between two attempts of a step, seconds (one day).
MAX_RETRY_DELAY = 86400.0


def check_retries(retries: object, retry_delay: object) -> tuple[int, float]:
    """Validate a step's ``retries`` and ``retry_delay``; returns them as ``(int, float)``.

    ``retries`` is an ``int`` (not ``bool``) with ``0 <= retries <=`` :data:`MAX_RETRIES`;
    ``retry_delay`` is a finite number of seconds with ``0 <= retry_delay <=``
    :data:`MAX_RETRY_DELAY`. Raises ``ValueError`` otherwise.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ValueError(f"retries must be an int from 0 to {MAX_RETRIES}, not {retries!r}")
    if (
        isinstance(retry_delay, bool)
        or not isinstance(retry_delay, int | float)
        or not 0 <= retry_delay <= MAX_RETRY_DELAY  # also refuses NaN and infinities
    ):
        raise ValueError(
            f"retry_delay must be a number of seconds from 0 to {MAX_RETRY_DELAY:.0f}, "
            f"not {retry_delay!r}"
        )
    return retries, float(retry_delay)


def _models() -> tuple[type[WorkflowRun], type[WorkflowStep], type[WorkflowStepAttempt]]:
    from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt

    return WorkflowRun, WorkflowStep, WorkflowStepAttempt


def _live() -> ExpressionWrapper:
    """``lease_expires_at > now`` on the database clock."""
    return ExpressionWrapper(Q(lease_expires_at__gt=Now()), output_field=BooleanField())


def _due() -> ExpressionWrapper:
    """``available_at`` unset or passed, on the database clock."""
    return ExpressionWrapper(
        Q(available_at__isnull=True) | Q(available_at__lte=Now()), output_field=BooleanField()
    )


class _Store(models.QuerySet[Any]):
    def _alias(self) -> str:
        return self._db or router.db_for_write(self.model)  # type: ignore[attr-defined]


# -- runs -------------------------------------------------------------------------------------


class WorkflowRunQuerySet(_Store):
    """Domain methods of ``WorkflowRun.objects``. Each opens whatever transaction it needs."""

    def start(self, workflow: str, input: Any = None) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` with JSON ``input``, due for its first pass.

        Does not check that the workflow is registered (``start_workflow`` does). Safe inside an
        outer transaction. Raises ``ValueError`` for a bad name or non-JSON input.
        """
        check_identifier(workflow, "Workflow name")
        check_json(input, "Workflow input")
        alias = self._alias()
        connection = connections[alias]
        if connection.vendor == "postgresql":
            # One statement (atomic on its own, or part of the caller's transaction): the
            # run, due for its first pass, and the notification (sent when it commits).
            from django_leases.workflows.wakeup import channel_name

            run = self.model(
                workflow=workflow,
                input={} if input is None else input,
                status=RunStatus.RUNNING,
                pass_requests=1,
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    WITH run AS (
                        INSERT INTO {self.model._meta.db_table} (
                            id, workflow, status, input, pass_due_at, pass_requests,
                            created_at, updated_at
                        )
                        VALUES (%s, %s, %s, %s::jsonb, statement_timestamp(), 1,
                                statement_timestamp(), statement_timestamp())
                        RETURNING created_at
                    )
                    SELECT created_at, pg_notify(%s, '') FROM run
                    """,
                    [
                        run.id,
                        workflow,
                        RunStatus.RUNNING.value,
                        json.dumps(run.input),
                        channel_name(alias),
                    ],
                )
                created_at = cursor.fetchone()[0]
            run.created_at = run.updated_at = run.pass_due_at = created_at
            run._state.adding = False
            run._state.db = alias
            return run
        with transaction.atomic(using=alias):
            run = self.model._default_manager.using(alias).create(
                workflow=workflow,
                input={} if input is None else input,
                pass_due_at=Now(),
                pass_requests=1,
            )
            _wake(alias)
            return run

    def request_pass(self, run_id: uuid.UUID | str, delay: float = 0.0) -> bool:
        """Mark a running run due for an orchestration pass ``delay`` seconds from DB now.

        Returns ``True`` if the run is running (and now due), ``False`` otherwise.
        """
        alias = self._alias()
        with transaction.atomic(using=alias):
            return bool(_request_pass(alias, Q(pk=run_id), delay))

    def claim_due_pass(self, ttl: float, lease_holder: str | None = None) -> PassClaim | None:
        """Pick one running run whose pass is due (``pass_due_at <= DB now``), or ``None``.

        The pick pushes ``pass_due_at`` to DB now + ``ttl`` seconds in the same transaction:
        no other worker picks the run meanwhile, and if this worker dies before the pass
        ends, the run is picked again after ``ttl``. On PostgreSQL the row is picked with
        ``SELECT … FOR UPDATE SKIP LOCKED`` so concurrent workers pick different runs.

        ``lease_holder`` (PostgreSQL): also take the run lease ``workflow-run:<id>`` for
        that holder for ``ttl`` seconds in the same statement (the acquire rule of
        ``Lease.objects.acquire``, ``lease_acquired`` is sent); ``PassClaim.lease`` is the
        granted lease, or ``None`` when another holder has it live (the caller then asks
        for the pass again later, as a pass that finds the lease taken does). Elsewhere
        the argument is ignored and the caller takes the lease itself.
        """
        seconds = ttl_seconds(ttl)
        alias = self._alias()
        connection = connections[alias]
        if connection.vendor == "postgresql":
            sent = time.monotonic()
            with connection.cursor() as cursor:
                cursor.execute(
                    *_pick_pass_sql(connection, self.model._meta.db_table, seconds, lease_holder)
                )
                row = cursor.fetchone()
            if row is None:
                return None
            return _pass_claim_from_row(alias, row, lease_holder, sent)
        with transaction.atomic(using=alias):
            qs = self.model._default_manager.using(alias).filter(
                status=RunStatus.RUNNING, pass_due_at__lte=Now()
            )
            if connection.features.has_select_for_update_skip_locked:
                qs = qs.select_for_update(skip_locked=True)
            run_id = qs.order_by("pass_due_at").values_list("pk", flat=True).first()
            if run_id is None:
                return None
            # Guarded, so the pick stays exclusive even where the SELECT locks nothing.
            picked = (
                self.model._default_manager.using(alias)
                .filter(pk=run_id, status=RunStatus.RUNNING, pass_due_at__lte=Now())
                .update(pass_due_at=clock.db_now_plus(seconds))
            )
        return PassClaim(run_id=run_id, using=alias) if picked else None

    def work_due_within(self, seconds: float) -> bool:
        """Whether a pass or a waiting step of a running run is due within ``seconds`` of DB now.

        Waiting steps are ``pending`` / ``scheduled`` / ``failed`` with attempts left (running
        steps become due only when their lease lapses, which is not foreseen here).
        """
        alias = self._alias()
        horizon = clock.db_now_plus(seconds)
        if (
            self.model._default_manager.using(alias)
            .filter(status=RunStatus.RUNNING, pass_due_at__lte=horizon)
            .exists()
        ):
            return True
        _, step_model, _ = _models()
        return (
            step_model._default_manager.using(alias)
            .filter(
                run__status=RunStatus.RUNNING,
                status__in=[StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.FAILED],
                available_at__lte=horizon,
            )
            .exclude(status=StepStatus.FAILED, attempt__gte=F("retries") + 1)
            .exists()
        )

    def finish_pass(self, run_id: uuid.UUID | str, pass_requests: int) -> bool:
        """Clear ``pass_due_at`` unless the run was asked for another pass since ``pass_requests``
        was read. Returns ``True`` if cleared."""
        alias = self._alias()
        # One statement: atomic on its own (autocommit), no transaction around it.
        return bool(
            self.model._default_manager.using(alias)
            .filter(pk=run_id, pass_requests=pass_requests)
            .update(pass_due_at=None)
        )

    def complete(self, run_id: uuid.UUID | str, output: Any) -> bool:
        """Mark a running run ``completed`` with JSON ``output``; ``True`` if it was running.

        A non-JSON ``output`` fails the run instead, with a clear error.
        """
        try:
            check_json(output, "Workflow output")
        except ValueError as exc:
            return self._finish(run_id, RunStatus.FAILED, error=error_json(exc))
        return self._finish(run_id, RunStatus.COMPLETED, output=output)

    def fail(self, run_id: uuid.UUID | str, error: BaseException | Mapping[str, Any] | str) -> bool:
        """Mark a running run ``failed`` with ``error``; ``True`` if it was running."""
        return self._finish(run_id, RunStatus.FAILED, error=error_json(error))

    def suspend(
        self, run_id: uuid.UUID | str, error: BaseException | Mapping[str, Any] | str
    ) -> bool:
        """Mark a running run ``suspended`` (waits for an operator); ``True`` if it was running."""
        return self._finish(run_id, RunStatus.SUSPENDED, error=error_json(error))

    def _finish(
        self, run_id: uuid.UUID | str, status: str, *, output: Any = None, error: Any = None
    ) -> bool:
        alias = self._alias()
        values: dict[str, Any] = {
            "status": status,
            "error": error,
            "pass_due_at": None,
            "updated_at": Now(),
        }
        if status == RunStatus.COMPLETED:
            values["output"] = Value(output, output_field=models.JSONField())
        if status in (RunStatus.COMPLETED, RunStatus.FAILED):
            values["finished_at"] = Now()
        # One statement: atomic on its own (autocommit), no transaction around it.
        return bool(
            self.model._default_manager.using(alias)
            .filter(pk=run_id, status=RunStatus.RUNNING)
            .update(**values)
        )

    # -- operators ------------------------------------------------------------------------------
    #
    # resume / cancel / retry_step, used by the admin actions and ``manage.py workflow_runs``.
    # Each opens one transaction and locks, in this order, the run's steps (by id) and then
    # the run row: the same order as a worker's writes (a step, then its run), so an operator
    # and a worker never deadlock, and a claim or fenced write committed just before is seen.

    def resume(self, run_id: uuid.UUID | str) -> RunChange:
        """Set a ``suspended`` or ``failed`` run running again, due for a pass at once.

        * **suspended** (a step function or the workflow was missing from the deployed
          code): every step suspended for a missing step function (code
          ``STEP_FUNCTION_NOT_FOUND``) becomes due again as a **new attempt**, and is granted
          one extra attempt (``retries + 1``), since the attempt that found no function never
          ran it;
        * **failed**: the run is replayed; every step that failed on its last attempt (a
          raised error, or a lost worker) gets one more attempt and is due at once. A run that
          failed because its workflow function raised is simply replayed (after a deploy that
          fixed it). ``error``, ``output`` and ``finished_at`` are cleared.

        Returns a :class:`RunChange`. Raises ``WorkflowRun.DoesNotExist`` for an unknown id,
        ``ValueError`` for something that is not a run id, and :class:`WorkflowRunStateError`
        for a run that is ``running``, ``completed`` or ``cancelled`` (nothing written).
        """
        alias = self._alias()
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            if run.status not in (RunStatus.SUSPENDED, RunStatus.FAILED):
                raise WorkflowRunStateError(
                    run.pk, run.status, "resumed", "only a suspended or failed run can be"
                )
            steps = _reopen_missing_function_steps(alias, run.pk)
            if run.status == RunStatus.FAILED:
                steps += _grant_last_attempts(alias, Q(run_id=run.pk))
            _reopen_run(alias, run.pk)
            _wake(alias)
        return RunChange(run.pk, run.status, RunStatus.RUNNING, tuple(steps))

    def cancel(self, run_id: uuid.UUID | str) -> RunChange:
        """Stop a ``running`` or ``suspended`` run for good: status ``cancelled``.

        No further pass runs and no step of it is claimed again. A step **running** at that
        moment is stopped: the step and its attempt are marked ``failed`` with code
        ``RUN_CANCELLED``, so the worker's renewals return ``False`` (its
        ``ctx.lease_lost`` is set) and its result or error is refused with
        :class:`WorkflowStepCancelledError` — which the engine, as for any superseded
        write, logs and drops. A worker's write that committed just before the cancel stays
        recorded on its step (the work was done) but starts no pass. Waiting steps are taken
        out of the due-work index (``available_at`` cleared). Cancelled is final: such a run
        cannot be resumed.

        Returns a :class:`RunChange` (``steps``: the running steps stopped). Raises
        ``WorkflowRun.DoesNotExist`` / ``ValueError`` for an unknown or malformed id and
        :class:`WorkflowRunStateError` for a ``completed``, ``failed`` or ``cancelled`` run.
        """
        alias = self._alias()
        _, step_model, _ = _models()
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            if run.status not in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                raise WorkflowRunStateError(
                    run.pk, run.status, "cancelled", "only a running or suspended run can be"
                )
            error = {"code": RUN_CANCELLED, "message": "The run was cancelled by an operator"}
            steps = step_model._default_manager.using(alias).filter(run_id=run.pk)
            running = list(
                steps.filter(status=StepStatus.RUNNING)
                .order_by("id")
                .values_list("pk", "attempt", "step_name")
            )
            fence = step_model._default_manager.db_manager(alias).all()
            for step_id, attempt, _name in running:  # locked above: the fence matches
                fence._fail_attempt_for_good(alias, step_id, attempt, error)
            steps.exclude(available_at=None).update(available_at=None, updated_at=Now())
            self.model._default_manager.using(alias).filter(pk=run.pk).update(
                status=RunStatus.CANCELLED,
                error=error,
                pass_due_at=None,
                finished_at=Now(),
                updated_at=Now(),
            )
        return RunChange(
            run.pk, run.status, RunStatus.CANCELLED, tuple(name for _, _, name in running)
        )

    def retry_step(self, run_id: uuid.UUID | str, step_name: str) -> RunChange:
        """Run the ``failed`` step ``step_name`` again as a new attempt, due at once.

        A step that failed on its last attempt is granted one more. A ``failed`` or
        ``suspended`` run is set running again as by :meth:`resume` (the other steps of a
        suspended run that miss their step function are made due too, or the run could
        never finish); a ``running`` run just gets its step due now (ahead of its retry
        delay).

        Returns a :class:`RunChange`. Raises ``WorkflowRun.DoesNotExist`` / ``ValueError``
        for an unknown or malformed run id, ``WorkflowStep.DoesNotExist`` for an unknown
        step, and :class:`WorkflowRunStateError` when the step is not ``failed`` or the run
        is ``completed`` or ``cancelled`` (nothing written).
        """
        check_identifier(step_name, "Step name")
        alias = self._alias()
        _, step_model, _ = _models()
        with transaction.atomic(using=alias):
            run = self._lock_for_operator(alias, run_id)
            step = (
                step_model._default_manager.using(alias)
                .filter(run_id=run.pk, step_name=step_name)
                .values("status")
                .first()
            )
            if step is None:
                raise step_model.DoesNotExist(f"Run {run.pk} has no step named {step_name!r}")
            if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
                raise WorkflowRunStateError(
                    run.pk, run.status, "retried", "a step of a finished run cannot be"
                )
            if step["status"] != StepStatus.FAILED:
                raise WorkflowRunStateError(
                    run.pk,
                    run.status,
                    "retried",
                    f"step {step_name!r} is {step['status']}; only a failed step can be",
                )
            others: list[str] = []
            if run.status == RunStatus.SUSPENDED:
                others = _reopen_missing_function_steps(alias, run.pk)
            _grant_last_attempts(alias, Q(run_id=run.pk, step_name=step_name))
            step_model._default_manager.using(alias).filter(
                run_id=run.pk, step_name=step_name, status=StepStatus.FAILED
            ).update(available_at=Now(), updated_at=Now())
            if run.status != RunStatus.RUNNING:
                _reopen_run(alias, run.pk)
            _wake(alias)
        steps = (step_name, *(name for name in others if name != step_name))
        return RunChange(run.pk, run.status, RunStatus.RUNNING, steps)

    def prune(self, older_than: float | timedelta, *, batch_size: int = 500) -> int:
        """Delete finished runs (``completed``, ``failed``, ``cancelled``) that finished more
        than ``older_than`` (seconds ≥ 0, or a ``timedelta``) before database now, with their
        steps, attempts and run leases (``workflow-run:<id>``). Returns how many runs.

        Retention, for an operator (``manage.py workflow_runs prune``): a run's lease keeps
        its row once released, so without pruning the lease table grows by one row per run.
        Running and suspended runs are never touched, nor a run whose lease is live (a
        worker still finishing with it; a later prune takes it). Webhook deliveries that
        started a pruned run stay, their ``run`` emptied, so a redelivery is still known.
        Works in transactions of ``batch_size`` runs (int ≥ 1): a failure keeps every batch
        before it done and leaves its own batch whole. Raises ``ValueError`` for a bad
        ``older_than`` or ``batch_size``.
        """
        from django_leases.models import Lease
        from django_leases.workflows.engine import run_lease_key

        if isinstance(older_than, timedelta):
            seconds = older_than.total_seconds()
        elif isinstance(older_than, bool) or not isinstance(older_than, int | float):
            raise ValueError(f"older_than must be seconds or a timedelta, not {older_than!r}")
        else:
            seconds = float(older_than)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"older_than must be a finite number of seconds ≥ 0, not {seconds}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int ≥ 1, not {batch_size!r}")
        alias = self._alias()
        runs = self.model._default_manager.using(alias)
        leases = Lease.objects.db_manager(alias)
        finished = runs.filter(
            status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED],
            finished_at__lte=clock.db_now_plus(-seconds),
        )
        deleted = 0
        skipped: set[uuid.UUID] = set()
        while True:
            with transaction.atomic(using=alias):
                ids = list(
                    _for_update(finished.exclude(pk__in=skipped), alias)
                    .order_by("finished_at")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not ids:
                    return deleted
                keys = {run_lease_key(run_id): run_id for run_id in ids}
                live = set(
                    leases.filter(
                        key__in=keys, released_at__isnull=True, expires_at__gt=Now()
                    ).values_list("key", flat=True)
                )
                skipped.update(keys[key] for key in live)
                gone = [run_id for key, run_id in keys.items() if key not in live]
                leases.filter(key__in=[run_lease_key(run_id) for run_id in gone]).delete()
                runs.filter(pk__in=gone).delete()
                deleted += len(gone)

    def _lock_for_operator(self, alias: str, run_id: uuid.UUID | str) -> WorkflowRun:
        """Lock the run's steps, then the run (inside the caller's transaction); the run."""
        pk = parse_run_id(run_id)
        _, step_model, _ = _models()
        list(
            _for_update(step_model._default_manager.using(alias).filter(run_id=pk), alias)
            .order_by("id")
            .values_list("pk", flat=True)
        )
        run = _for_update(self.model._default_manager.using(alias).filter(pk=pk), alias).first()
        if run is None:
            raise self.model.DoesNotExist(f"No workflow run with id {pk}")
        return run


# -- steps ------------------------------------------------------------------------------------


class WorkflowStepQuerySet(_Store):
    """Domain methods of ``WorkflowStep.objects``: schedule, claim, fenced writes, history."""

    def schedule(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
    ) -> WorkflowStep:
        """Create step ``step_name`` of a run, due now, unless it exists; return the row.

        Idempotent: a second call returns the existing step untouched. Raises ``ValueError``
        for bad names, non-JSON ``data``, bad ``retries`` / ``retry_delay`` (seconds), or an
        existing step recorded with a different ``function_name``.
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        check_json(data, "Step data")
        retries, retry_delay = check_retries(retries, retry_delay)
        return self._schedule(run_id, step_name, function_name, data, retries, retry_delay)[0]

    def _schedule(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any,
        retries: int,
        retry_delay: float,
    ) -> tuple[WorkflowStep, bool]:
        """:meth:`schedule` on checked arguments; ``(step, created by this call)``."""
        alias = self._alias()
        with transaction.atomic(using=alias):
            step, _created = self.model._default_manager.using(alias).get_or_create(
                run_id=run_id,
                step_name=step_name,
                defaults={
                    "function_name": function_name,
                    "data": {} if data is None else data,
                    "retries": retries,
                    "retry_delay": retry_delay,
                    "available_at": Now(),
                },
            )
            if _created:
                _wake(alias)
        if step.function_name != function_name:
            raise ValueError(
                f"Step {step_name!r} of run {run_id} was recorded with step function "
                f"{step.function_name!r}, not {function_name!r}"
            )
        return step, _created

    def schedule_claimed(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        lease_ttl_seconds: float,
        finish_pass: int | None = None,
    ) -> tuple[WorkflowStep, Claim | None]:
        """:meth:`schedule`, and claim the step for the caller if this call created it.

        For a worker that drives a run itself: the step it schedules is due now, so it runs
        it straight away instead of leaving it to the queue (no notification is sent). The
        claim follows :meth:`claim_for_execution`'s rules for a new step — ``running`` at
        attempt 1 with a ``lease_ttl_seconds`` lease on the database clock, plus its attempt
        row; if its worker dies, the lease lapses and any worker claims attempt 2. On
        PostgreSQL creating and claiming is one statement (inserted only while the run is
        ``running``); elsewhere :meth:`schedule` then :meth:`claim_for_execution`.

        Returns ``(step, claim)``; ``claim`` is ``None`` when the step already existed, the
        run is not running, or another worker claimed it first. Raises ``ValueError`` as
        :meth:`schedule` does.

        ``finish_pass``: the ``pass_requests`` the calling pass read; with it, a claim on
        PostgreSQL also ends the pass in the same statement
        (:meth:`WorkflowRunQuerySet.finish_pass`'s rule), and ``step.pass_finished`` says
        whether it did (else the caller finishes the pass itself).
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        check_json(data, "Step data")
        retries, retry_delay = check_retries(retries, retry_delay)
        seconds = ttl_seconds(lease_ttl_seconds)
        alias = self._alias()
        connection = connections[alias]
        data = {} if data is None else data
        sent = time.monotonic()
        if connection.vendor == "postgresql":
            step_id = self._insert_claimed_pg(
                alias,
                run_id,
                step_name,
                function_name,
                data,
                retries,
                retry_delay,
                seconds,
                finish_pass,
            )
            if step_id is None:  # it exists, or the run is not running: the ordinary path
                return self._schedule(run_id, step_name, function_name, data, retries, retry_delay)[
                    0
                ], None
            step = self.model(
                pk=step_id,
                run_id=parse_run_id(run_id),
                step_name=step_name,
                function_name=function_name,
                data=data,
                status=StepStatus.RUNNING,
                attempt=1,
                retries=retries,
                retry_delay=retry_delay,
            )
            step._state.adding = False
            step._state.db = alias
            step.pass_finished = finish_pass is not None
            claim = Claim(
                step_id=step_id,
                run_id=step.run_id,
                step_name=step_name,
                function_name=function_name,
                attempt=1,
                data=data,
                lease_ttl=seconds,
                claimed_at=sent,
                using=alias,
            )
            return step, claim
        step, created = self._schedule(run_id, step_name, function_name, data, retries, retry_delay)
        if not created:
            return step, None
        claimed = self.claim_for_execution(run_id, step_name, function_name, seconds)
        if claimed is not None:
            step.status = StepStatus.RUNNING
        return step, claimed

    def _insert_claimed_pg(
        self,
        alias: str,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any,
        retries: int,
        retry_delay: float,
        seconds: float,
        finish_pass: int | None = None,
    ) -> int | None:
        """PostgreSQL: insert the step ``running`` at attempt 1 with its lease and its attempt
        row, in one statement, if the run is running and the step does not exist yet; with
        ``finish_pass`` (``pass_requests`` read by the pass), end the pass in it too when the
        step was inserted. Returns the new step's id, or ``None``."""
        from django_leases.workflows import pgfunctions

        args = (
            parse_run_id(run_id),
            step_name,
            function_name,
            json.dumps(data),
            retries,
            retry_delay,
            seconds,
            finish_pass,
        )
        connection = connections[alias]
        with connection.cursor() as cursor:
            if finish_pass is not None and pgfunctions.ready(connection):
                cursor.execute(pgfunctions.call(pgfunctions.INSERT_CLAIMED, connection), args)
            else:
                cursor.execute(*_insert_claimed_sql(*args))
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # -- claims ---------------------------------------------------------------------------------

    def claim_for_execution(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        lease_ttl_seconds: float,
    ) -> Claim | None:
        """Claim step ``step_name`` of a run for execution under a ``lease_ttl_seconds`` lease.

        Rules (DESIGN §5, all judged on the database clock, one transaction, row locked):

        * ``function_name`` differs from the recorded one → ``ValueError`` before any write;
        * the run is not ``running``, the step ``succeeded``, the step ``running`` with a live
          lease, or not yet due (``available_at`` in the future) → ``None``;
        * ``pending`` / ``scheduled`` → ``running`` at the **same** attempt, lease granted;
        * ``failed`` with attempts left, or ``running`` with a **lapsed** lease →
          ``attempt + 1`` in the same guarded ``UPDATE`` that grants the lease, plus an
          attempt row; every write of an earlier attempt is refused from then on;
        * ``failed`` with no attempts left → ``None``; ``running``, lapsed and out of attempts
          → the step fails with a "lost its worker on every attempt" error and the run is
          asked for a pass; ``None``.

        Exactly one of many concurrent claimers gets a :class:`Claim`.

        Raises:
            ValueError: bad names or TTL, or a function name mismatch (nothing written).
            WorkflowStep.DoesNotExist: no such step.
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        seconds = ttl_seconds(lease_ttl_seconds)
        alias = self._alias()
        sent = time.monotonic()
        with transaction.atomic(using=alias):
            step = (
                self._locking(alias, skip_locked=False)
                .filter(run_id=run_id, step_name=step_name)
                .first()
            )
            if step is None:
                raise self.model.DoesNotExist(f"Run {run_id} has no step named {step_name!r}")
            if step.function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} of run {run_id} runs step function "
                    f"{step.function_name!r}, not {function_name!r}"
                )
            return self._claim_locked(alias, step, seconds, sent)

    def claim_due(self, lease_ttl_seconds: float) -> Claim | None:
        """Claim one due step of a running run for a worker, or ``None`` if none is due.

        Due: ``running`` with a lapsed lease (taken first), or ``pending`` / ``scheduled`` /
        ``failed``-with-attempts-left whose ``available_at`` has passed. On PostgreSQL rows
        are picked with ``SKIP LOCKED``. The claim follows :meth:`claim_for_execution`'s
        rules; a lapsed step out of attempts is failed on the way and the next one tried.
        """
        seconds = ttl_seconds(lease_ttl_seconds)
        alias = self._alias()
        for _ in range(20):
            sent = time.monotonic()
            with transaction.atomic(using=alias):
                step = self._next_due(alias)
                if step is None:
                    return None
                claim = self._claim_locked(alias, step, seconds, sent)
            if claim is not None:
                return claim
        return None

    def _locking(self, alias: str, *, skip_locked: bool) -> models.QuerySet[Any]:
        qs = self.model._default_manager.using(alias).annotate(
            lease_live=_live(), due=_due(), run_status=F("run__status")
        )
        features = connections[alias].features
        if skip_locked and features.has_select_for_update_skip_locked:
            return qs.select_for_update(skip_locked=True, of=("self",))
        if features.has_select_for_update_of:
            return qs.select_for_update(of=("self",))
        return qs.select_for_update()

    def _next_due(self, alias: str) -> WorkflowStep | None:
        base = self._locking(alias, skip_locked=True).filter(run__status=RunStatus.RUNNING)
        lapsed = (
            base.filter(
                Q(lease_expires_at__lte=Now()) | Q(lease_expires_at__isnull=True),
                status=StepStatus.RUNNING,
            )
            .order_by("lease_expires_at")
            .first()
        )
        if lapsed is not None:
            return lapsed
        return (
            base.filter(
                status__in=[StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.FAILED],
                available_at__lte=Now(),
            )
            .exclude(status=StepStatus.FAILED, attempt__gte=F("retries") + 1)
            .order_by("available_at")
            .first()
        )

    def _claim_locked(self, alias: str, step: Any, seconds: float, sent: float) -> Claim | None:
        """Decide and write a claim of the locked, annotated ``step`` (inside a transaction)."""
        if step.run_status != RunStatus.RUNNING or step.status == StepStatus.SUCCEEDED:
            return None
        if step.status == StepStatus.RUNNING and step.lease_live:
            return None
        # Guarded on what was read, and on the run still running: a cancel that committed
        # while this claim waited for the step row is seen here (a new statement).
        rows = self.model._default_manager.using(alias).filter(
            pk=step.pk, attempt=step.attempt, status=step.status, run__status=RunStatus.RUNNING
        )
        lease = clock.db_now_plus(seconds)
        if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED):
            if not step.due:
                return None
            attempt = step.attempt
            granted = rows.filter(_due_q()).update(
                status=StepStatus.RUNNING, lease_expires_at=lease, updated_at=Now()
            )
        else:  # failed, or running with a lapsed lease
            exhausted = step.attempt >= step.retries + 1
            lapsed_q = Q(lease_expires_at__lte=Now()) | Q(lease_expires_at__isnull=True)
            if exhausted:
                if step.status == StepStatus.RUNNING:
                    self._fail_lost_worker(alias, step, rows.filter(lapsed_q))
                return None
            if step.status == StepStatus.FAILED and not step.due:
                return None
            guard = _due_q() if step.status == StepStatus.FAILED else lapsed_q
            attempt = step.attempt + 1
            # The new attempt and the lease in one guarded UPDATE: from here on, every write
            # carrying an earlier attempt matches no row.
            granted = rows.filter(guard).update(
                status=StepStatus.RUNNING,
                attempt=F("attempt") + 1,
                lease_expires_at=lease,
                result=None,
                error=None,
                updated_at=Now(),
            )
        if granted != 1:
            return None
        _, _, attempt_model = _models()
        attempt_model._default_manager.using(alias).update_or_create(
            step_id=step.pk,
            attempt=attempt,
            defaults={
                "status": AttemptStatus.RUNNING,
                "result": None,
                "error": None,
                "finished_at": None,
            },
        )
        return Claim(
            step_id=step.pk,
            run_id=step.run_id,
            step_name=step.step_name,
            function_name=step.function_name,
            attempt=attempt,
            data=step.data,
            lease_ttl=seconds,
            claimed_at=sent,
            using=alias,
        )

    def _fail_lost_worker(self, alias: str, step: Any, rows: models.QuerySet[Any]) -> None:
        error = {
            "code": STEP_LEASE_LAPSED,
            "message": (
                f"Step {step.step_name!r} lost its worker on every attempt "
                f"({step.attempt} of {step.retries + 1}): its lease lapsed each time"
            ),
        }
        failed = rows.update(
            status=StepStatus.FAILED,
            error=error,
            lease_expires_at=None,
            available_at=None,
            updated_at=Now(),
        )
        if failed:
            _, _, attempt_model = _models()
            attempt_model._default_manager.using(alias).filter(
                step_id=step.pk, attempt=step.attempt, status=AttemptStatus.RUNNING
            ).update(status=AttemptStatus.FAILED, error=error, finished_at=Now())
            _request_pass(alias, Q(pk=step.run_id))

    # -- fenced writes --------------------------------------------------------------------------

    def set_result(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        hold_pass: float | None = None,
        pass_state: dict[str, Any] | None = None,
    ) -> str:
        """Record ``result`` (JSON) for ``attempt`` of the step; returns the step's new status.

        One conditional ``UPDATE`` on ``attempt`` and ``status = running``; the attempt row
        is updated in the same transaction, and the run is asked for a pass. A result that is
        not JSON is not stored: the attempt fails with a ``STEP_RESULT_NOT_JSON`` error
        instead (as :meth:`set_error`, so retries apply) and ``"failed"`` is returned.
        Writing again the result this attempt already recorded returns ``"succeeded"`` again
        (safe to retry after a lost acknowledgement).

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` is not an int ≥ 1.
        """
        _check_attempt(attempt)
        try:
            check_json(result, "Step result")
        except ValueError as exc:
            return self.set_error(
                step_id,
                {"code": STEP_RESULT_NOT_JSON, "type": "ValueError", "message": str(exc)},
                attempt,
                hold_pass=hold_pass,
            )
        alias = self._alias()
        if connections[alias].vendor == "postgresql":
            if self._set_result_pg(alias, step_id, result, attempt, hold_pass, pass_state):
                return StepStatus.SUCCEEDED
            # Nothing matched the fence: a repeat of this very write, or a refusal.
            if self._already_recorded(alias, step_id, attempt, AttemptStatus.SUCCEEDED, result):
                return StepStatus.SUCCEEDED
            self._refuse(alias, step_id, attempt)
        json_result = Value(result, output_field=models.JSONField())
        with transaction.atomic(using=alias):
            if self._record_outcome(
                alias,
                step_id,
                attempt,
                step={
                    "status": StepStatus.SUCCEEDED,
                    "result": json_result,
                    "error": None,
                    "lease_expires_at": None,
                },
                history={"status": AttemptStatus.SUCCEEDED, "result": json_result},
                repeat_of=(AttemptStatus.SUCCEEDED, result),
            ):
                _request_pass(alias, Q(steps__pk=step_id), hold=hold_pass)
        return StepStatus.SUCCEEDED

    def _set_result_pg(
        self,
        alias: str,
        step_id: int,
        result: Any,
        attempt: int,
        hold_pass: float | None,
        pass_state: dict[str, Any] | None = None,
    ) -> bool:
        """PostgreSQL: :meth:`set_result`'s writes in one statement (atomic on its own): the
        step through the fence (:meth:`_fence`'s rule: this attempt, still ``running``), its
        attempt row, and the run's pass request (held for the caller with ``hold_pass``,
        else due now with a notification). ``True`` if the fence matched; else nothing was
        written. With ``hold_pass`` and a ``pass_state`` dict, the run and its steps as this
        write left them are put in it (``"run"``, ``"steps"``) for the pass that follows."""
        run_model, _, _ = _models()
        connection = connections[alias]
        payload = json.dumps(result)
        hold = 0.0 if hold_pass is None else ttl_seconds(hold_pass)
        notify = ", (SELECT pg_notify(%s, '') FROM run) AS woke" if hold_pass is None else ""
        want_state = hold_pass is not None and pass_state is not None
        run_table = run_model._meta.db_table
        returned = _pass_state_sql(run_table) if want_state else "id"
        state = ", r.* FROM (SELECT 1) AS one LEFT JOIN run AS r ON true" if want_state else ""
        written_ctes, params = _result_ctes(step_id, payload, attempt)
        sql = f"""
            WITH {written_ctes}, run AS (
                UPDATE {run_table}
                SET pass_due_at = statement_timestamp() + make_interval(secs => %s),
                    pass_requests = pass_requests + 1, updated_at = statement_timestamp()
                WHERE id = (SELECT run_id FROM step) AND status = %s
                RETURNING {returned}
            )
            SELECT (SELECT count(*) FROM step) AS written{notify}{state}
        """
        params += [hold, RunStatus.RUNNING.value]
        if hold_pass is None:
            from django_leases.workflows.wakeup import channel_name

            params.append(channel_name(alias))
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        written = bool(row and row[0])
        if written and want_state and row[1] is not None:
            assert pass_state is not None
            run, steps = _pass_state_from_row(alias, row[1:])
            # The steps were read in the statement's snapshot: before its own write.
            for step in steps.values():
                if step.pk == step_id:
                    step.status = StepStatus.SUCCEEDED
                    step.result = as_stored(result)
                    step.error = None
            pass_state.update(run=run, steps=steps)
        return written

    def set_result_completing_run(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        output: Any,
        lease: Any,
        next_pass_holder: str | None = None,
        next_pass_ttl: float = 30.0,
    ) -> RunCompletion | None:
        """PostgreSQL: record ``result`` (JSON) for ``attempt`` of the step **and** complete
        its run with ``output`` (JSON) **and** release the run lease ``lease`` (a
        :class:`~django_leases.models.Lease` held by the caller), in one statement.

        For the worker that drives the run: it replayed the run with this result in memory
        and the workflow returned ``output``, so the pass that would follow the result is
        already known. Everything is conditional on the step's fence (this attempt, still
        ``running``, as :meth:`set_result`): when it refuses, nothing is written, the lease
        is not released, and the caller goes the ordinary way (:meth:`set_result`, which
        raises or recognises a repeat). The run is completed only while it is ``running``.

        ``next_pass_holder``: also pick the next due pass with its run lease for that
        holder (``next_pass_ttl`` seconds), as :meth:`WorkflowRunQuerySet.claim_due_pass`
        does, in the same statement; it is picked whatever the fence said, and is never
        this step's run (a pass asked for it while the step ran is made moot by the
        completion).

        Returns a :class:`RunCompletion`, or ``None`` on other databases (nothing done: use
        :meth:`set_result`). Raises ``ValueError`` for a bad attempt or non-JSON ``result``
        or ``output`` (nothing written).
        """
        from django_leases.models import Lease
        from django_leases.signals import lease_released

        _check_attempt(attempt)
        check_json(result, "Step result")
        check_json(output, "Workflow output")
        alias = self._alias()
        connection = connections[alias]
        if connection.vendor != "postgresql":
            return None
        from django_leases.workflows import pgfunctions

        args: tuple[Any, ...] = (
            step_id,
            json.dumps(result),
            attempt,
            json.dumps(output),
            lease.key,
            lease.holder,
            lease.token,
        )
        # Two statements, not one whose pick a NULL holder switches off: such a pick is
        # planned (custom plans: a fresh connection's first calls) as a sort of nothing,
        # which the function's settings (sorts off) cost at ~1e10, and PostgreSQL then
        # JIT-compiled it: 1 to 4.5 s per call.
        function = pgfunctions.COMPLETE_RUN
        if next_pass_holder is not None:
            args += (next_pass_holder, ttl_seconds(next_pass_ttl))
            function = pgfunctions.COMPLETE_RUN_PICKING
        sent = time.monotonic()
        with connection.cursor() as cursor:
            if pgfunctions.ready(connection):
                cursor.execute(pgfunctions.call(function, connection), args)
            else:
                cursor.execute(*_completion_sql(connection, *args))
            row = cursor.fetchone()
        next_pass = None
        if next_pass_holder is not None and row[_COMPLETION_COLUMNS] is not None:
            next_pass = _pass_claim_from_row(
                alias, row[_COMPLETION_COLUMNS:], next_pass_holder, sent
            )
        if row[2] is not None:
            lease_released.send_robust(sender=Lease, lease=lease)
        return RunCompletion(
            written=bool(row[0]),
            completed=bool(row[1]),
            lease_live=None if row[2] is None else bool(row[2]),
            next_pass=next_pass,
        )

    def set_error(
        self,
        step_id: int,
        error: BaseException | Mapping[str, Any] | str,
        attempt: int,
        *,
        hold_pass: float | None = None,
    ) -> str:
        """Record ``error`` for ``attempt`` of the step; returns the step's new status (``failed``).

        One conditional ``UPDATE`` on ``attempt`` and ``status = running``. With attempts left,
        the next attempt becomes due ``retry_delay`` seconds from DB now (``available_at``);
        without, the run is asked for a pass (which fails it). The attempt row is updated in
        the same transaction. ``error`` is an exception, a JSON mapping or a message.
        Writing again the error this attempt already recorded returns ``"failed"`` again
        (safe to retry after a lost acknowledgement).

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
        """
        _check_attempt(attempt)
        payload = error_json(error)
        alias = self._alias()
        with transaction.atomic(using=alias):
            config = (
                self.model._default_manager.using(alias)
                .filter(pk=step_id)
                .values("retries", "retry_delay")
                .first()
            )
            if config is None:
                raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
            exhausted = attempt >= config["retries"] + 1
            if (
                self._record_outcome(
                    alias,
                    step_id,
                    attempt,
                    step={
                        "status": StepStatus.FAILED,
                        "error": payload,
                        "result": None,
                        "lease_expires_at": None,
                        "available_at": (
                            None if exhausted else clock.db_now_plus(config["retry_delay"])
                        ),
                    },
                    history={"status": AttemptStatus.FAILED, "error": payload},
                    repeat_of=(AttemptStatus.FAILED, payload),
                )
                and exhausted
            ):
                _request_pass(alias, Q(steps__pk=step_id), hold=hold_pass)
            elif not exhausted and not config["retry_delay"]:
                _wake(alias)  # the next attempt is due at once
        return StepStatus.FAILED

    def suspend_for_missing_function(self, step_id: int, attempt: int, function_name: str) -> None:
        """The step function is not registered here: fail ``attempt`` with code
        ``STEP_FUNCTION_NOT_FOUND`` and suspend the run with the same error, fenced on
        ``attempt`` like :meth:`set_error`. The step is not due again until the run is resumed.

        Raises :class:`WorkflowStepSupersededError` (nothing written) for a stale attempt.
        """
        _check_attempt(attempt)
        error = {
            "code": STEP_FUNCTION_NOT_FOUND,
            "message": f"No step function named {function_name!r} is registered in this process",
            "function_name": function_name,
        }
        alias = self._alias()
        run_model, _, _ = _models()
        with transaction.atomic(using=alias):
            self._fail_attempt_for_good(alias, step_id, attempt, error)
            run_model._default_manager.using(alias).filter(
                steps__pk=step_id, status=RunStatus.RUNNING
            ).update(status=RunStatus.SUSPENDED, error=error, pass_due_at=None, updated_at=Now())

    def refresh_lease(self, step_id: int, ttl: float | None, attempt: int) -> bool:
        """Extend the step lease to DB now + ``ttl`` seconds, or release it (``ttl=None``).

        Fenced: lands only while ``attempt`` is the step's running attempt (lease expiry is
        not checked — a slow worker nobody replaced still owns its attempt). Returns ``True``
        if it landed, ``False`` for a superseded or finished attempt (nothing written).
        Raises ``ValueError`` for a bad TTL or attempt.
        """
        _check_attempt(attempt)
        expiry = None if ttl is None else clock.db_now_plus(ttl_seconds(ttl))
        alias = self._alias()
        with transaction.atomic(using=alias):
            return bool(self._fence(alias, step_id, attempt).update(lease_expires_at=expiry))

    # -- the fence ------------------------------------------------------------------------------

    def _fence(self, alias: str, step_id: int, attempt: int) -> models.QuerySet[Any]:
        """The fence rule, in one place: the step row, only while ``attempt`` is its
        **running** attempt. Every write a claim makes after the claim (result, error,
        suspension, lease renewal or release) is one ``UPDATE`` through this filter, so a
        superseded attempt — or a finished one, or one stopped by a cancel — matches no row.
        Lease expiry is deliberately not part of it."""
        return self.model._default_manager.using(alias).filter(
            pk=step_id, attempt=attempt, status=StepStatus.RUNNING
        )

    def _fail_attempt_for_good(
        self, alias: str, step_id: int, attempt: int, error: dict[str, Any]
    ) -> bool:
        """Fail ``attempt`` with ``error`` and no retry due (step and history), through the
        fence like every outcome; returns what :meth:`_record_outcome` returns."""
        return self._record_outcome(
            alias,
            step_id,
            attempt,
            step={
                "status": StepStatus.FAILED,
                "error": error,
                "lease_expires_at": None,
                "available_at": None,
            },
            history={"status": AttemptStatus.FAILED, "error": error},
        )

    def _record_outcome(
        self,
        alias: str,
        step_id: int,
        attempt: int,
        *,
        step: dict[str, Any],
        history: dict[str, Any],
        repeat_of: tuple[str, Any] | None = None,
    ) -> bool:
        """Write ``attempt``'s outcome through :meth:`_fence`: ``step`` values on the step row,
        then ``history`` values on the attempt row (``finished_at`` set), inside the caller's
        transaction. Returns ``True`` when written, ``False`` when the attempt had already
        recorded exactly ``repeat_of`` (``(attempt status, result or error)``: a retried write
        whose acknowledgement was lost). Otherwise nothing is written and
        :class:`WorkflowStepSupersededError` (or ``DoesNotExist``) is raised."""
        if not self._fence(alias, step_id, attempt).update(**step, updated_at=Now()):
            if repeat_of is not None and self._already_recorded(
                alias, step_id, attempt, *repeat_of
            ):
                return False
            self._refuse(alias, step_id, attempt)
        _, _, attempt_model = _models()
        attempt_model._default_manager.using(alias).filter(step_id=step_id, attempt=attempt).update(
            **history, finished_at=Now()
        )
        return True

    def _already_recorded(
        self, alias: str, step_id: int, attempt: int, status: str, outcome: Any
    ) -> bool:
        """Whether ``attempt`` already recorded exactly this outcome (``status`` with this
        result / error): a retried write whose first try committed but whose acknowledgement
        was lost (a dropped connection). Decided on the attempt row, which only the owner of
        the attempt writes and which keeps its outcome after the step moves on; a superseded
        attempt's row stays ``running``, so it never matches."""
        _, _, attempt_model = _models()
        field = "result" if status == AttemptStatus.SUCCEEDED else "error"
        row = (
            attempt_model._default_manager.using(alias)
            .filter(step_id=step_id, attempt=attempt)
            .values("status", field)
            .first()
        )
        if row is None or row["status"] != status:
            return False
        return bool(row[field] == json.loads(json.dumps(outcome)))

    def _refuse(self, alias: str, step_id: int, attempt: int) -> None:
        row = (
            self.model._default_manager.using(alias)
            .filter(pk=step_id)
            .values_list("attempt", "run__status")
            .first()
        )
        if row is None:
            raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
        current, run_status = row
        if current == attempt and run_status == RunStatus.CANCELLED:
            raise WorkflowStepCancelledError(step_id, attempt)
        raise WorkflowStepSupersededError(step_id, attempt, current)

    # -- reading --------------------------------------------------------------------------------

    def history(self, run_id: uuid.UUID | str) -> list[WorkflowStepAttempt]:
        """The run's history: one :class:`WorkflowStepAttempt` per claim, oldest first.

        Each entry has its ``step`` loaded (``entry.step.step_name``). A superseded attempt
        keeps ``status == "running"`` and never shows the result or error it was refused.
        """
        _, _, attempt_model = _models()
        return list(
            attempt_model._default_manager.using(self._alias())
            .filter(step__run_id=run_id)
            .select_related("step")
            .order_by("id")
        )


def _due_q() -> Q:
    return Q(available_at__isnull=True) | Q(available_at__lte=Now())


def _for_update(qs: models.QuerySet[Any], alias: str) -> models.QuerySet[Any]:
    """``qs`` locking its rows; ``FOR NO KEY UPDATE`` where the database has it (it does not
    block the key-share lock an insert of a step takes on its run)."""
    if connections[alias].features.has_select_for_no_key_update:
        return qs.select_for_update(no_key=True)
    return qs.select_for_update()


def _reopen_missing_function_steps(alias: str, run_id: uuid.UUID) -> list[str]:
    """Make the run's steps suspended for a missing step function due again, each granted one
    extra attempt (the attempt that found no function never ran it). Returns their names."""
    _, step_model, _ = _models()
    steps = step_model._default_manager.using(alias).filter(
        run_id=run_id, status=StepStatus.FAILED, error__code=STEP_FUNCTION_NOT_FOUND
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("retries") + 1, available_at=Now(), updated_at=Now())
    return names


def _grant_last_attempts(alias: str, where: Q) -> list[str]:
    """Give each failed step matching ``where`` that is out of attempts one more, due now.
    Returns their names."""
    _, step_model, _ = _models()
    steps = step_model._default_manager.using(alias).filter(
        where, status=StepStatus.FAILED, attempt__gte=F("retries") + 1
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True))
    steps.update(retries=F("attempt"), available_at=Now(), updated_at=Now())
    return names


def _reopen_run(alias: str, run_id: uuid.UUID) -> None:
    """Set the run ``running``, its error, output and end cleared, due for a pass now."""
    run_model, _, _ = _models()
    run_model._default_manager.using(alias).filter(pk=run_id).update(
        status=RunStatus.RUNNING,
        error=None,
        output=None,
        finished_at=None,
        pass_due_at=Now(),
        pass_requests=F("pass_requests") + 1,
        updated_at=Now(),
    )


def _wake(alias: str) -> None:
    """Tell idle workers that work is due now (inside the transaction that made it due: the
    notification is delivered only if it commits; a no-op where nothing listens)."""
    notify_work_due(alias)


def _request_pass(alias: str, where: Q, delay: float = 0.0, *, hold: float | None = None) -> int:
    """Ask every running run matching ``where`` for a pass ``delay`` seconds from DB now.

    Runs inside the caller's transaction (the store methods that finish a step use it so the
    step's outcome and the run's wake-up commit together). ``hold`` (seconds): the caller
    runs the pass itself straight away, so the pass is taken for it as
    :meth:`WorkflowRunQuerySet.claim_due_pass` takes one — due only ``hold`` seconds from
    DB now (when another worker picks it should the caller die) — and nobody is woken.
    """
    run_model, _, _ = _models()
    if hold is not None:
        delay = ttl_seconds(hold)
    requested = (
        run_model._default_manager.using(alias)
        .filter(where, status=RunStatus.RUNNING)
        .update(
            pass_due_at=clock.db_now_plus(delay) if delay else Now(),
            pass_requests=F("pass_requests") + 1,
            updated_at=Now(),
        )
    )
    if requested and not delay:
        _wake(alias)  # due now (work due later is found by polling)
    return requested


class Arg:
    """A placeholder's value that is a PL/pgSQL function's argument (by ``name``) instead of
    a value: the SQL builders below take either, so one builder gives both the statement
    sent as such and the body of the function that caches its plan (see ``pgfunctions``)."""

    def __init__(self, name: str, sql_type: str) -> None:
        self.name = name
        self.sql_type = sql_type


def _insert_claimed_sql(
    run_id: Any,
    step_name: Any,
    function_name: Any,
    data: Any,
    retries: Any,
    retry_delay: Any,
    seconds: Any,
    finish_pass: Any,
) -> tuple[str, list[Any]]:
    """PostgreSQL: :meth:`WorkflowStepQuerySet._insert_claimed_pg`'s statement (``data`` as
    JSON text; ``finish_pass`` ``None`` leaves the pass alone) and its parameters."""
    run_model, step_model, attempt_model = _models()
    run_table = run_model._meta.db_table
    finished = ""
    if finish_pass is not None:
        finished = f""", finished AS (
            UPDATE {run_table} SET pass_due_at = NULL
            WHERE id = %s AND pass_requests = %s AND EXISTS (SELECT 1 FROM step)
        )"""
    sql = f"""
        WITH step AS (
            INSERT INTO {step_model._meta.db_table} (
                run_id, step_name, function_name, data, status, attempt, retries,
                retry_delay, lease_expires_at, available_at, created_at, updated_at
            )
            SELECT r.id, %s, %s, %s::jsonb, %s, 1, %s, %s,
                   statement_timestamp() + make_interval(secs => %s),
                   statement_timestamp(), statement_timestamp(), statement_timestamp()
            FROM {run_table} r
            WHERE r.id = %s AND r.status = %s
            ON CONFLICT (run_id, step_name) DO NOTHING
            RETURNING id
        ), history AS (
            INSERT INTO {attempt_model._meta.db_table} (step_id, attempt, status, started_at)
            SELECT id, 1, %s, statement_timestamp() FROM step
        ){finished}
        SELECT id FROM step
    """
    params: list[Any] = [
        step_name,
        function_name,
        data,
        StepStatus.RUNNING.value,
        retries,
        retry_delay,
        seconds,
        run_id,
        RunStatus.RUNNING.value,
        AttemptStatus.RUNNING.value,
    ]
    if finish_pass is not None:
        params += [run_id, finish_pass]
    return sql, params


def _completion_sql(
    connection: Any,
    step_id: Any,
    payload: Any,
    attempt: Any,
    output: Any,
    key: Any,
    holder: Any,
    token: Any,
    next_holder: Any = None,
    next_ttl: Any = None,
) -> tuple[str, list[Any]]:
    """PostgreSQL: :meth:`WorkflowStepQuerySet.set_result_completing_run`'s statement
    (``payload`` and ``output`` as JSON text; the lease by ``key``, ``holder``, ``token``;
    ``next_holder`` ``None`` picks no next pass) and its parameters. Its row: written,
    completed, live (``_COMPLETION_COLUMNS``), then :func:`_pick_pass_ctes`' columns."""
    from django_leases.models import Lease
    from django_leases.models.lease import release_held_statement

    run_model, _, _ = _models()
    run_table = run_model._meta.db_table
    written_ctes, params = _result_ctes(step_id, payload, attempt)
    release = release_held_statement(
        connection.ops.quote_name(Lease._meta.db_table),
        "key = %s AND EXISTS (SELECT 1 FROM step)",
    )
    ctes = f"""{written_ctes}, done AS (
        UPDATE {run_table}
        SET status = %s, output = %s::jsonb, error = NULL, pass_due_at = NULL,
            updated_at = statement_timestamp(), finished_at = statement_timestamp()
        WHERE id = (SELECT run_id FROM step) AND status = %s
        RETURNING id
    ), released AS ({release})"""
    params += [
        RunStatus.COMPLETED.value,
        output,
        RunStatus.RUNNING.value,
        key,
        holder,
        token,
    ]
    columns = (
        "(SELECT count(*) FROM step), (SELECT count(*) FROM done), (SELECT live FROM released)"
    )
    joined = "(SELECT 1) AS one"
    if next_holder is not None:
        pick, pick_params, pick_columns, pick_joined = _pick_pass_ctes(
            connection, run_table, next_ttl, next_holder, besides="SELECT run_id FROM step"
        )
        ctes += f", {pick}"
        params += pick_params
        columns += f", {pick_columns}"
        joined += f" LEFT JOIN ({pick_joined}) ON true"
    return f"WITH {ctes} SELECT {columns} FROM {joined}", params


#: Columns of a :func:`_completion_sql` row before the next pass's.
_COMPLETION_COLUMNS = 3


def as_stored(value: Any) -> Any:
    """JSON ``value`` as PostgreSQL's ``jsonb`` gives it back once stored: object keys in
    jsonb's order (shorter first, then bytewise) and a number written with an exponent read
    back as jsonb prints it (``1e+16`` comes back as the integer ``10000000000000000``). A
    pass that replays a result in memory must see what a pass reading it would see."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: (len(key.encode()), key.encode()))
        return {key: as_stored(value[key]) for key in keys}
    if isinstance(value, list):
        return [as_stored(item) for item in value]
    if isinstance(value, float):
        text = repr(value)
        if "e" in text:
            plain = format(decimal.Decimal(text), "f")
            return float(plain) if "." in plain else int(plain)
    return value


def _result_ctes(step_id: int, payload: str, attempt: int) -> tuple[str, list[Any]]:
    """PostgreSQL: a step's result ``payload`` (JSON text) written through the fence
    (:meth:`WorkflowStepQuerySet._fence`'s rule: this ``attempt``, still ``running``) and on
    its attempt row, as CTEs ``step`` (the written step's ``id, run_id``; empty when the
    fence refused) and ``history``, with their parameters. Nothing else in the statement
    may land when ``step`` is empty: later CTEs test it."""
    _, step_model, attempt_model = _models()
    sql = f"""step AS (
        UPDATE {step_model._meta.db_table}
        SET status = %s, result = %s::jsonb, error = NULL, lease_expires_at = NULL,
            updated_at = statement_timestamp()
        WHERE id = %s AND attempt = %s AND status = %s
        RETURNING id, run_id
    ), history AS (
        UPDATE {attempt_model._meta.db_table}
        SET status = %s, result = %s::jsonb, finished_at = statement_timestamp()
        WHERE step_id = (SELECT id FROM step) AND attempt = %s
    )"""
    params: list[Any] = [
        StepStatus.SUCCEEDED.value,
        payload,
        step_id,
        attempt,
        StepStatus.RUNNING.value,
        AttemptStatus.SUCCEEDED.value,
        payload,
        attempt,
    ]
    return sql, params


def _pick_pass_ctes(
    connection: Any, run_table: str, seconds: Any, lease_holder: Any, *, besides: str = ""
) -> tuple[str, list[Any], str, str]:
    """PostgreSQL: the pick of :meth:`WorkflowRunQuerySet.claim_due_pass` as CTEs for a
    statement of its own or a larger one: ``picked`` (the run and its pass state, see
    :func:`_pass_state_sql`) and, with ``lease_holder``, ``granted`` (the run lease, taken by
    ``Lease``'s acquire rule). ``besides``: SQL for a run id never to pick (the run the
    larger statement writes: PostgreSQL applies only one of two updates of a row in one
    statement). Returns ``(ctes, params, columns, joined)``: what goes after ``SELECT`` and
    what goes after ``FROM`` to read them (``picked.*`` then ``granted.*``)."""
    from django_leases.models import Lease
    from django_leases.models.lease import acquire_statement, grant_sql
    from django_leases.workflows.engine import run_lease_key

    guard = f" AND id IS DISTINCT FROM ({besides})" if besides else ""
    ctes = f"""picked AS (
        UPDATE {run_table}
        SET pass_due_at = statement_timestamp() + make_interval(secs => %s)
        WHERE id = (
            SELECT id FROM {run_table}
            WHERE status = %s AND pass_due_at <= statement_timestamp(){guard}
            ORDER BY pass_due_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AND status = %s AND pass_due_at <= statement_timestamp()
        RETURNING {_pass_state_sql(run_table)}
    )"""
    params: list[Any] = [seconds, RunStatus.RUNNING.value, RunStatus.RUNNING.value]
    if lease_holder is None:
        return ctes, params, "picked.*", "picked"
    lease_table = connection.ops.quote_name(Lease._meta.db_table)
    rows = f"SELECT %s || picked.id::text, %s, {grant_sql(connection)} FROM picked"
    ctes += f", granted AS ({acquire_statement(connection, lease_table, rows)})"
    params += [run_lease_key(""), lease_holder, seconds]
    return ctes, params, "picked.*, granted.*", "picked LEFT JOIN granted ON true"


def _pick_pass_sql(
    connection: Any, run_table: str, seconds: float, lease_holder: str | None
) -> tuple[str, list[Any]]:
    """PostgreSQL: :func:`_pick_pass_ctes` as a statement of its own."""
    ctes, params, columns, joined = _pick_pass_ctes(connection, run_table, seconds, lease_holder)
    return f"WITH {ctes} SELECT {columns} FROM {joined}", params


#: Columns of the pass state in a row read through :func:`_pick_pass_ctes`.
_PASS_STATE_COLUMNS = 6


def _pass_claim_from_row(alias: str, row: Any, lease_holder: str | None, sent: float) -> PassClaim:
    """The :class:`PassClaim` from a row of :func:`_pick_pass_ctes`' columns."""
    from django_leases.models import Lease
    from django_leases.signals import lease_acquired

    run, steps = _pass_state_from_row(alias, row[:_PASS_STATE_COLUMNS])
    lease = None
    if lease_holder is not None and row[_PASS_STATE_COLUMNS] is not None:
        leases = Lease.objects.db_manager(alias)
        lease = leases.from_returned(connections[alias], row[_PASS_STATE_COLUMNS:])
        lease_acquired.send_robust(sender=Lease, lease=lease)
    return PassClaim(
        run_id=run.id,
        using=alias,
        run=run,
        steps=steps,
        lease=lease,
        sent=sent,
        lease_refused=lease_holder is not None and lease is None,
    )


def _pass_state_sql(run: str) -> str:
    """PostgreSQL: what a pass reads, for a ``RETURNING`` or select list over the run table
    (or alias) ``run``: the run's ``id, workflow, status, input, pass_requests`` and its
    steps as one JSON array (the fields replay needs), read in the same statement."""
    _, step_model, _ = _models()
    fields = ", ".join(
        f"'{name}', s.{name}"
        for name in (
            "id",
            "step_name",
            "function_name",
            "status",
            "result",
            "error",
            "attempt",
            "retries",
            "retry_delay",
        )
    )
    return (
        f"{run}.id, {run}.workflow, {run}.status, {run}.input::text, {run}.pass_requests, "
        f"(SELECT coalesce(json_agg(json_build_object({fields}) ORDER BY s.id), '[]')::text "
        f"FROM {step_model._meta.db_table} s WHERE s.run_id = {run}.id)"
    )


def _pass_state_from_row(alias: str, row: Any) -> tuple[WorkflowRun, dict[str, WorkflowStep]]:
    """The run and its steps (by name) from the columns of :func:`_pass_state_sql`."""
    run_model, step_model, _ = _models()
    run = run_model(
        id=parse_run_id(row[0]),
        workflow=row[1],
        status=row[2],
        input=json.loads(row[3]),
        pass_requests=row[4],
    )
    run._state.adding = False
    run._state.db = alias
    steps = {}
    for values in json.loads(row[5]):
        step = step_model(run_id=run.id, **values)
        step._state.adding = False
        step._state.db = alias
        steps[step.step_name] = step
    return run, steps


class WorkflowStepAttemptQuerySet(_Store):
    """``WorkflowStepAttempt.objects``: read through :meth:`WorkflowStepQuerySet.history`."""

    def for_run(self, run_id: uuid.UUID | str) -> WorkflowStepAttemptQuerySet:
        """The run's attempts, oldest first, with their steps loaded."""
        return self.filter(step__run_id=run_id).select_related("step").order_by("id")


__all__ = [
    "Claim",
    "PassClaim",
    "RunChange",
    "WorkflowRunQuerySet",
    "WorkflowRunStateError",
    "WorkflowStepAttemptQuerySet",
    "WorkflowStepCancelledError",
    "WorkflowStepQuerySet",
    "check_json",
    "check_retries",
    "error_json",
    "parse_run_id",
]
