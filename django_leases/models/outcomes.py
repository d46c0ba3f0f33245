"""A step attempt's outcome, written through its fence (:class:`StepOutcomes`, the lowest
layer of ``WorkflowStep.objects``): the one guarded write of a result or an error with its
attempt row, refusals of superseded attempts, retries and their delay
(:func:`retry_delay_after`), lease renewal and the history.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import models, transaction
from django.db.models import Q, Value
from django.db.models.expressions import RawSQL

from django_leases import clock, db, signals
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowStepCancelledError, WorkflowStepSupersededError
from django_leases.models.workflow_base import (
    attempt_model,
    fence_q,
    fence_sql,
    finish_attempt,
    renewal_q,
    request_passes,
    run_model,
    run_reached,
    step_model,
    wake_workers,
)
from django_leases.renewal import UNKNOWN, Unknown
from django_leases.validation import (
    MAX_RETRY_DELAY,
    as_stored,
    check_attempt,
    error_json,
    ttl_seconds,
)
from django_leases.workflows.values import (
    STEP_FUNCTION_NOT_FOUND,
    AttemptStatus,
    PassState,
    PendingResult,
    RunStatus,
    StepStatus,
    StepWrite,
    exhausted,
)

#: Steps per statement of :meth:`StepOutcomes.refresh_leases` where each needs parameters of
#: its own in the SQL (MariaDB / MySQL, the portable path).
REFRESH_CHUNK = 500


def _fences(steps: Iterable[tuple[int, int]]) -> Q:
    """:func:`renewal_q` of each ``(step_id, attempt)`` of ``steps`` (at least one), or'd."""
    return functools.reduce(operator.or_, (renewal_q(s, a) for s, a in steps))


if TYPE_CHECKING:
    # WorkflowStep: the parameter of StepOutcomes' base, a string at run time.
    from django_leases.models.workflow import (
        WorkflowStep,  # noqa: F401
        WorkflowStepAttempt,
    )


def write_pending(alias: str, pending: PendingResult | None) -> bool:
    """Write ``pending`` — a step attempt's result that a pass handed to its workflow and
    did not write yet — through the step's fence, with its attempt row, inside the caller's
    transaction on ``alias``; the run is not asked for a pass (the caller's pass is that
    pass). Returns ``True`` if written, ``False`` for ``None`` or a repeat of this very write
    (its first try committed).

    Raises:
        WorkflowStepSupersededError: the attempt is no longer the step's running one.
    """
    if pending is None:
        return False
    steps = StepOutcomes(step_model(), using=alias)
    return steps._record_success(alias, pending.step_id, pending.attempt, pending.result)


def retry_delay_after(
    attempt: int,
    retry_delay: float,
    retry_backoff: float = 1.0,
    retry_delay_max: float | None = None,
) -> float:
    """The seconds between the failure of ``attempt`` (an ``int`` >= 1) of a step and its
    next attempt: ``min(retry_delay * retry_backoff ** (attempt - 1), cap)``, where the cap is
    ``retry_delay_max`` (seconds) or, when that is ``None``, :data:`MAX_RETRY_DELAY` (one
    day). With the default ``retry_backoff`` of 1.0 every delay is ``retry_delay``.

    The one rule of a step's retry delay (``retry_delay`` and ``retry_delay_max`` in seconds,
    ``retry_backoff`` a factor, as stored on the step): the store adds it to the database
    clock where a failed attempt is recorded (:meth:`WorkflowStepQuerySet.set_error`, a timed
    out attempt). Deterministic, without jitter: steps that fail together retry together,
    and a delay can be told in advance. The growth is compared with the cap in logarithms
    first, so a large factor raised to a large attempt number is capped without computing a
    power that would overflow a float. Values the checks refuse (a factor below 1 or not
    finite, a negative cap: a row edited by hand) read as no growth and no cap of their own.
    """
    cap = MAX_RETRY_DELAY
    if retry_delay_max is not None and 0.0 <= retry_delay_max < cap:
        cap = retry_delay_max
    if not retry_delay > 0.0 or cap == 0.0:
        return 0.0
    growths = attempt - 1
    if growths <= 0 or not 1.0 < retry_backoff < math.inf:
        return min(retry_delay, cap)
    exponent = growths * math.log(retry_backoff)  # the logarithm of the growth
    if math.log(retry_delay) + exponent >= math.log(cap):
        return cap
    try:
        grown = retry_delay * retry_backoff**growths
    except OverflowError:  # a subnormal retry_delay times a growth beyond any float
        grown = math.exp(math.log(retry_delay) + exponent)
    return min(grown, cap)


class StepOutcomes(db.RoutedQuerySet["WorkflowStep"]):
    """Fenced writes of an attempt's outcome, retries, lease renewal, history."""

    def _state_after(self, alias: str, step_id: int, hold: float | None) -> PassState | None:
        """The pass state of the step's run after a write that took its pass (``hold``)."""
        if hold is None:
            return None
        run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
        state = run_model().objects.db_manager(alias).pass_state(run_id)
        return state if state is not None and state.run.status == RunStatus.RUNNING else None

    def set_error(
        self,
        step_id: int,
        error: BaseException | Mapping[str, Any] | str,
        attempt: int,
        *,
        hold_pass_seconds: float | None = None,
    ) -> StepWrite:
        """Record ``error`` for ``attempt`` of the step; returns a :class:`StepWrite` (status
        ``failed``).

        One conditional write through the fence. With attempts left, the next attempt becomes
        due the step's retry delay after DB now (``available_at``): ``retry_delay`` seconds
        times ``retry_backoff`` per earlier attempt, at most ``retry_delay_max``
        (:func:`retry_delay_after`); without, the run is asked
        for a pass (which fails it) — taken for the caller with ``hold_pass_seconds`` (seconds), who
        then gets the run's state in ``StepWrite.state``. The attempt row is updated in the
        same transaction. ``error`` is an exception, a JSON mapping or a message. Writing
        again the error this attempt already recorded returns ``written=False`` (safe to
        retry after a lost acknowledgement).

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
        """
        check_attempt(attempt)
        payload = error_json(error)
        hold = None if hold_pass_seconds is None else ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            config = (
                self.rows()
                .filter(pk=step_id)
                .values("retries", "retry_delay", "retry_backoff", "retry_delay_max")
                .first()
            )
            if config is None:
                raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
            last = exhausted(attempt, config["retries"])
            delay = retry_delay_after(
                attempt,
                config["retry_delay"],
                config["retry_backoff"],
                config["retry_delay_max"],
            )
            written = self._record_outcome(
                alias,
                step_id,
                attempt,
                step={
                    "status": StepStatus.FAILED,
                    "error": payload,
                    "result": None,
                    "lease_expires_at": None,
                    "available_at": None if last else clock.db_now_plus(delay),
                },
                history={"status": AttemptStatus.FAILED, "error": payload},
                repeat_of=(AttemptStatus.FAILED, payload),
            )
            if written and last:
                request_passes(alias, Q(steps__pk=step_id), hold=hold)
            elif not last and not delay:
                wake_workers(alias)  # the next attempt is due at once
        state = self._state_after(alias, step_id, hold) if written and last else None
        return StepWrite(StepStatus.FAILED, written, state)

    def suspend_for_missing_function(self, step_id: int, attempt: int, function_name: str) -> None:
        """The step function is not registered here: fail ``attempt`` with code
        ``STEP_FUNCTION_NOT_FOUND`` and suspend the run with the same error, fenced on
        ``attempt`` like :meth:`set_error`. The step is not due again until the run is resumed.

        Raises :class:`WorkflowStepSupersededError` (nothing written) for a stale attempt.
        """
        check_attempt(attempt)
        error = {
            "code": STEP_FUNCTION_NOT_FOUND,
            "message": f"No step function named {function_name!r} is registered in this process",
            "function_name": function_name,
        }
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            self._fail_attempt_for_good(alias, step_id, attempt, error)
            runs = (
                run_model()
                ._default_manager.using(alias)
                .filter(steps__pk=step_id, status=RunStatus.RUNNING)
            )
            run_id = runs.values_list("pk", flat=True).first()
            if run_id is not None and runs.update(
                status=RunStatus.SUSPENDED, error=error, pass_due_at=None, updated_at=DbNow()
            ):
                run_reached(alias, run_id, RunStatus.SUSPENDED, error=error)

    def refresh_lease(self, step_id: int, ttl: float | None, attempt: int) -> bool:
        """Extend the step lease to DB now + ``ttl`` seconds, or release it (``ttl=None``).

        Fenced: lands only while ``attempt`` is the step's running attempt. Lease expiry is
        not checked — a slow worker nobody replaced still owns its attempt — except that a
        lapsed lease of a step of a limited queue is not extended (:func:`renewal_q`: it
        holds no slot); a release always lands. Returns ``True`` if it landed, ``False`` for
        a superseded or finished attempt, or such a lapsed lease (nothing written). Raises
        ``ValueError`` for a bad TTL or attempt.
        """
        check_attempt(attempt)
        rule = fence_q(step_id, attempt) if ttl is None else renewal_q(step_id, attempt)
        expiry = None if ttl is None else clock.db_now_plus(ttl_seconds(ttl))
        # One statement: atomic on its own.
        return bool(self.rows().filter(rule).update(lease_expires_at=expiry))

    def refresh_leases(self, held: Sequence[tuple[int, int, float]]) -> list[bool | Unknown]:
        """Extend several step leases at once: :meth:`refresh_lease`'s rule for each
        ``(step_id, attempt, ttl)`` of ``held`` (``ttl`` in seconds > 0, its own for each),
        on the database clock, in **one statement** where the database allows.

        Returns one entry per item, in order: ``True`` if that attempt's lease was extended,
        ``False`` for a superseded or finished attempt (nothing written for it), or
        :data:`~django_leases.renewal.UNKNOWN` when its step row was locked by another
        transaction (a transactional step's own, on MariaDB): skipped, not waited for, so one
        locked row never holds up the renewal of the others (PostgreSQL, MariaDB >= 10.6,
        MySQL >= 8). A failure of the statement raises (Django's ``DatabaseError``): it says
        nothing of any step. Raises ``ValueError`` for a bad TTL or attempt, before anything
        is sent.

        The renewal loop of the process (:class:`~django_leases.renewal.Renewer`) sends this
        once per tick for every step lease of the alias whose renewal is due. Tuned
        PostgreSQL: one statement (the fenced rows read, the unlocked ones locked with ``SKIP
        LOCKED`` and updated, in ``WITH`` parts); tuned SQLite: one ``UPDATE … FROM
        json_each(…) RETURNING``; elsewhere (MariaDB / MySQL, the portable path): the fenced
        rows locked (``SKIP LOCKED``) and read, then updated per TTL, in one transaction, per
        :data:`REFRESH_CHUNK` steps.
        """
        items = [(step_id, check_attempt(attempt), ttl) for step_id, attempt, ttl in held]
        # In step order: two ticks never lock the same rows in opposite orders.
        checked = sorted({(s, a): ttl_seconds(ttl) for s, a, ttl in items}.items())
        if not checked:
            return []
        connection = self.connection()
        renewed: set[tuple[int, int]] = set()
        locked: set[tuple[int, int]] = set()
        if db.tuned(connection, "postgresql", "sqlite"):
            renewed, locked = self._refresh_leases_returning(checked)
        else:
            for start in range(0, len(checked), REFRESH_CHUNK):
                chunk = checked[start : start + REFRESH_CHUNK]
                with transaction.atomic(using=self.write_alias()):
                    done = self._refresh_leases_orm(chunk)
                    renewed |= done
                    if len(done) < len(chunk):
                        fence = _fences(key for key, _ in chunk if key not in done)
                        found = self.rows().filter(fence).values_list("pk", "attempt")
                        locked |= {(int(s), int(a)) for s, a in found}
        return [
            UNKNOWN if (step_id, attempt) in locked else (step_id, attempt) in renewed
            for step_id, attempt, _ttl in items
        ]

    def _refresh_leases_returning(
        self, held: Sequence[tuple[tuple[int, int], float]]
    ) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
        """PostgreSQL and SQLite: one guarded ``UPDATE`` of every step of ``held`` joined to
        its values; returns the steps it extended and those it skipped, locked elsewhere.
        PostgreSQL: the fenced rows read (``fenced``, no lock), those no other transaction
        has locked locked (``SKIP LOCKED``), and updated, in one statement; SQLite locks the
        whole database, never a row."""
        connection = self.connection()
        table = self.table()
        alias = self.write_alias()
        fence, fence_params = fence_sql(
            alias, RawSQL("v.id", ()), RawSQL("v.attempt", ()), renewal=True
        )
        expiry = clock.now_plus_sql(connection).replace("%s", "v.ttl")
        pk, attempt_column = map(connection.ops.quote_name, ("id", "attempt"))
        if connection.vendor == "postgresql":
            values = "unnest(%s::bigint[], %s::bigint[], %s::float8[]) AS v(id, attempt, ttl)"
            statement = (
                f"WITH v AS (SELECT * FROM {values}), "
                f"fenced AS (SELECT {table}.{pk} AS id, {table}.{attempt_column} AS attempt "
                f"FROM {table}, v WHERE {fence}), "
                f"locked AS (SELECT fenced.id FROM fenced JOIN {table} ON {table}.{pk} = "
                f"fenced.id FOR NO KEY UPDATE OF {table} SKIP LOCKED), "
                f"renewed AS (UPDATE {table} SET lease_expires_at = {expiry} FROM locked "
                f"JOIN v USING (id) WHERE {fence} "
                f"RETURNING {table}.{pk} AS id, {table}.{attempt_column} AS attempt) "
                "SELECT id, attempt, true FROM renewed UNION ALL SELECT id, attempt, false "
                "FROM fenced WHERE id NOT IN (SELECT id FROM renewed)"
            )
            params: list[Any] = [
                [step_id for (step_id, _), _ in held],
                [attempt for (_, attempt), _ in held],
                [ttl for _, ttl in held],
                *fence_params,
                *fence_params,
            ]
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                rows = [((int(s), int(a)), bool(done)) for s, a, done in cursor.fetchall()]
            return {key for key, done in rows if done}, {key for key, done in rows if not done}
        values = (
            "(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS "
            "attempt, json_extract(value, '$[2]') AS ttl FROM json_each(%s)) AS v"
        )
        rows_json = [
            [step_id, attempt, clock.seconds_param(connection, ttl)]
            for (step_id, attempt), ttl in held
        ]
        statement = (
            f"UPDATE {table} SET lease_expires_at = {expiry} FROM {values} "
            f"WHERE {fence} RETURNING {table}.{pk}, {table}.{attempt_column}"
        )
        with connection.cursor() as cursor:
            cursor.execute(statement, [json.dumps(rows_json), *fence_params])
            return {(int(step_id), int(attempt)) for step_id, attempt in cursor.fetchall()}, set()

    def _refresh_leases_orm(
        self, held: Sequence[tuple[tuple[int, int], float]]
    ) -> set[tuple[int, int]]:
        """The portable path (MariaDB / MySQL too), inside the caller's transaction: lock
        and read the steps of ``held`` still at their attempt (:func:`fence_q`; ``SKIP
        LOCKED`` where the database has it: a row locked elsewhere is left out), then extend
        theirs, one ``UPDATE`` per TTL. Returns the steps extended."""
        skip = self.connection().features.has_select_for_update_skip_locked
        fence = _fences(key for key, _ in held)
        locked = self.rows().filter(fence).select_for_update(skip_locked=skip).order_by("pk")
        renewed = {(int(s), int(a)) for s, a in locked.values_list("pk", "attempt")}
        by_ttl: dict[float, list[int]] = {}
        for key, ttl in held:
            if key in renewed:
                by_ttl.setdefault(ttl, []).append(key[0])
        for ttl, step_ids in by_ttl.items():
            self.rows().filter(pk__in=step_ids).update(lease_expires_at=clock.db_now_plus(ttl))
        return renewed

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

    def _record_success(self, alias: str, step_id: int, attempt: int, result: Any) -> bool:
        """:meth:`_record_outcome` of ``attempt`` succeeding with JSON ``result`` (its lease
        ended, any error cleared): ``True`` when written, ``False`` for a repeat of this very
        write; a refusal raises as there."""
        return self._record_outcome(
            alias,
            step_id,
            attempt,
            step={
                "status": StepStatus.SUCCEEDED,
                "result": Value(result, output_field=models.JSONField()),
                "error": None,
                "lease_expires_at": None,
            },
            history={"status": AttemptStatus.SUCCEEDED},
            repeat_of=(AttemptStatus.SUCCEEDED, result),
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
        """Write ``attempt``'s outcome through the fence: ``step`` values on the step row,
        then ``history`` values on the attempt row (``finished_at`` set; a result is the
        step's alone: :class:`WorkflowStepAttempt`), inside the caller's transaction.
        Returns ``True`` when written, ``False`` when the attempt had already recorded
        exactly ``repeat_of`` (``(attempt status, result or error)``: a retried write whose
        acknowledgement was lost). Otherwise nothing is written and
        :class:`WorkflowStepSupersededError` (or ``DoesNotExist``) is raised."""
        fenced = step_model()._default_manager.using(alias).filter(fence_q(step_id, attempt))
        # The attempt leaves ``running``: its claim's name goes with it (hand_back_claimed).
        if not fenced.update(**{"claimant": "", **step}, updated_at=DbNow()):
            if repeat_of is not None and self._already_recorded(
                alias, step_id, attempt, *repeat_of
            ):
                return False
            self._refuse(alias, step_id, attempt)
        finish_attempt(alias, step_id, attempt, history)
        return True

    def _already_recorded(
        self, alias: str, step_id: int, attempt: int, status: str, outcome: Any
    ) -> bool:
        """Whether ``attempt`` already recorded exactly this outcome (``status`` with this
        result / error): a retried write whose first try committed but whose acknowledgement
        was lost (a dropped connection). Decided on the attempt row, which only the owner of
        the attempt writes and which keeps its outcome after the step moves on (a result on
        the step, which keeps the result of the one attempt that succeeded); a superseded
        attempt's row stays ``running``, so it never matches."""
        field = "step__result" if status == AttemptStatus.SUCCEEDED else "error"
        row = (
            attempt_model()
            ._default_manager.using(alias)
            .filter(step_id=step_id, attempt=attempt)
            .values("status", field)
            .first()
        )
        if row is None or row["status"] != status:
            return False
        return bool(row[field] == json.loads(json.dumps(outcome)))

    def _refuse(self, alias: str, step_id: int, attempt: int) -> None:
        row = (
            step_model()
            ._default_manager.using(alias)
            .filter(pk=step_id)
            .values_list("attempt", "run__status")
            .first()
        )
        if row is None:
            raise self.model.DoesNotExist(f"No workflow step with id {step_id}")
        current, run_status = row
        signals.step_attempt_superseded.send_robust(
            sender=step_model(),
            step_id=step_id,
            attempt=attempt,
            current_attempt=current,
            using=alias,
        )
        if current == attempt and run_status == RunStatus.CANCELLED:
            raise WorkflowStepCancelledError(step_id, attempt)
        raise WorkflowStepSupersededError(step_id, attempt, current)

    def stored_json(self, value: Any) -> Any:
        """JSON ``value`` as this database gives it back once stored: PostgreSQL's ``jsonb``
        orders keys and rewrites numbers (:func:`~django_leases.validation.as_stored`);
        elsewhere the JSON text round-trips. A pass that replays a result in memory must see
        what a pass reading it would."""
        if self.connection().vendor == "postgresql":
            return as_stored(value)
        return json.loads(json.dumps(value))

    def history(self, run_id: uuid.UUID | str) -> list[WorkflowStepAttempt]:
        """The run's history: one :class:`WorkflowStepAttempt` per claim, oldest first.

        Each entry has its ``step`` loaded (``entry.step.step_name``). A superseded attempt
        keeps ``status == "running"`` and never shows the result or error it was refused.
        """
        return list(attempt_model().objects.db_manager(self.write_alias()).for_run(run_id))
