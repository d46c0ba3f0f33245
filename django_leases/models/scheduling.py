"""New steps (:class:`StepScheduling`): a pass schedules the steps its workflow reached —
one, several in parallel, or one inserted already claimed for the caller
(:meth:`StepScheduling.schedule_claimed`) — each at most once by its name.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from django_leases import clock
from django_leases.clock import DbNow
from django_leases.conf import DEFAULT_QUEUE
from django_leases.frozen import frozen
from django_leases.models.claims import StepClaims
from django_leases.models.lease import Lease
from django_leases.models.outcomes import write_pending
from django_leases.models.workflow_base import (
    attempt_started,
    call_function,
    claim_of_step,
    falls_back,
    in_one_statement,
    run_model,
    slot_kept_q,
    step_model,
    wake_workers,
)
from django_leases.validation import check_identifier, check_json, parse_run_id, ttl_seconds
from django_leases.workflows.values import (
    Claim,
    NextStep,
    PendingResult,
    RunStatus,
    StepOptions,
    StepStatus,
    run_lease_key,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowStep


#: Steps of a fan-out per insert statement: within SQLite's bound parameters and a
#: statement MariaDB takes whole (``max_allowed_packet``), for steps of small data.
FAN_OUT_BATCH = 500


def check_step(step: NextStep, using: str | None = None) -> NextStep:
    """``step`` with its names and data checked (``ValueError``; its options are checked
    when they are made), its data for the database ``using`` (an alias) where given;
    returns it."""
    check_identifier(step.step_name, "Step name")
    check_identifier(step.function_name, "Step function name")
    check_json(step.data, "Step data", using=using)
    return step


def step_columns(step: NextStep) -> dict[str, Any]:
    """The columns a new step row is created with, from ``step`` and its options."""
    options = step.options
    return {
        "step_name": step.step_name,
        "function_name": step.function_name,
        "data": {} if step.data is None else step.data,
        "retries": options.retries,
        "retry_delay": options.retry_delay,
        "retry_backoff": options.retry_backoff,
        "retry_delay_max": options.retry_delay_max,
        "timeout": options.timeout,
        "queue": options.queue,
        "priority": options.priority,
        "queue_key": options.queue_key or "",
    }


def claimed_insert_params(step: NextStep, ttl: float) -> list[Any]:
    """The parameters the tuned inserts of a claimed step take after the run's id (see
    :func:`sql.insert_claimed`): names, data as JSON text, retry settings, lease TTL."""
    options = step.options
    return [
        step.step_name,
        step.function_name,
        json.dumps({} if step.data is None else step.data),
        options.retries,
        options.retry_delay,
        options.retry_backoff,
        options.retry_delay_max,
        ttl,
    ]


@frozen
class Scheduled:
    """What :meth:`WorkflowStepQuerySet.schedule_claimed` did.

    Attributes:
        step: the step row (``WorkflowStep``), created by this call or found.
        claim: the claim of the step for the caller (:class:`~values.Claim`), when this call
            created it and claimed it; else ``None``.
        pass_finished: the claim also ended the caller's pass (``finish_pass``).
        created: this call created the step (``False``: it existed).
    """

    step: WorkflowStep
    claim: Claim | None
    pass_finished: bool = False
    created: bool = True


def inserted_claimed(
    alias: str,
    step_id: int,
    run_id: uuid.UUID,
    step: NextStep,
    ttl: float,
    sent: float,
    claimant: str = "",
    fence_floor: int = 0,
) -> Scheduled:
    """The :class:`Scheduled` of a step a tuned statement inserted claimed (``running`` at
    attempt 1 under a ``ttl``-second lease for ``claimant``, the statement sent at ``sent``,
    monotonic, on a server whose epoch floor was ``fence_floor``)."""
    row = step_model()(
        pk=step_id,
        run_id=run_id,
        status=StepStatus.RUNNING,
        attempt=1,
        claimant=claimant,
        fence_floor=int(fence_floor),
        **step_columns(step),
    )
    row._state.adding = False
    row._state.db = alias
    claim = claim_of_step(alias, row, ttl, sent, attempt=1, fence_floor=int(fence_floor))
    return Scheduled(row, attempt_started(claim), True)


class StepScheduling(StepClaims):
    """New steps, each at most once by its name; inserted claimed where it can."""

    def schedule(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        timeout: float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        queue_key: str | None = None,
    ) -> WorkflowStep:
        """Create step ``step_name`` of a run, due now, unless it exists; return the row.

        ``retries`` (``int``, 0 to 1000) allows ``retries + 1`` attempts. After attempt *n*
        fails, attempt *n* + 1 is due ``min(retry_delay * retry_backoff ** (n - 1),
        retry_delay_max)`` seconds later on the database clock (:func:`retry_delay_after`):
        ``retry_delay`` in seconds (0 to 86 400), ``retry_backoff`` a factor ≥ 1 (1.0, the
        default: every delay is ``retry_delay``), ``retry_delay_max`` in seconds (0 to
        86 400; ``None``: one day).

        ``queue`` (``str``) is the queue it is claimed from and ``priority`` (``int``) its
        place among due steps: higher first, first due first within a priority (the engine
        passes its step function's declaration). ``queue_key`` (``str`` of 1–255 characters,
        or ``None``: none) is the key it counts under for the queue's per-key limits.

        ``timeout`` (seconds > 0, or ``None``): an attempt running longer is failed with a
        ``STEP_TIMED_OUT`` error (and retried if attempts remain) by the next claim that
        looks for due work; its late writes are refused by the attempt fence.

        Idempotent: a second call returns the existing step untouched. Raises ``ValueError``
        for bad names, non-JSON ``data``, bad options (:class:`~values.StepOptions`), or an
        existing step recorded with a different ``function_name``.
        """
        options = StepOptions(
            retries=retries,
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
            timeout=timeout,
            queue=queue,
            priority=priority,
            queue_key=queue_key,
        )
        return self.schedule_step(run_id, NextStep(step_name, function_name, data, options))

    def schedule_step(
        self, run_id: uuid.UUID | str, step: NextStep, *, pending: PendingResult | None = None
    ) -> WorkflowStep:
        """:meth:`schedule` for a :class:`~values.NextStep`, with ``pending`` — a result the
        caller's pass carries, written first, fenced (:func:`write_pending`) — in the same
        transaction.

        Raises:
            ValueError: as :meth:`schedule` (nothing written).
            WorkflowStepSupersededError: ``pending``'s attempt was superseded (nothing
                written).
        """
        check_step(step, self.write_alias())
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            return self._schedule(run_id, step)[0]

    def schedule_many(
        self,
        run_id: uuid.UUID | str,
        calls: Sequence[tuple[str, str, Any]],
        options: StepOptions | None = None,
        *,
        options_of: Mapping[str, StepOptions] | None = None,
        pending: PendingResult | None = None,
    ) -> dict[str, WorkflowStep]:
        """:meth:`schedule` for many steps at once (``run.parallel``): each ``(step_name,
        function_name, data)`` of ``calls`` not recorded yet is created, due now, in one
        insert (existing ones are left untouched); idle workers are woken once. Returns
        every step of ``calls`` by name, as now stored. Each step gets ``options_of[name]``
        where given, else ``options`` (:class:`~values.StepOptions`; ``None``: the defaults).
        ``pending``: a result the caller's pass carries, written first in the same
        transaction (:func:`write_pending`).

        Raises ``ValueError`` as :meth:`schedule` does (nothing written), also for a name
        given twice; :class:`WorkflowStepSupersededError` when ``pending``'s attempt was
        superseded (nothing written).
        """
        names = [call[0] for call in calls]
        if len(set(names)) != len(names):
            raise ValueError("run.parallel: a step name is given twice")
        default = StepOptions() if options is None else options
        wanted = [
            check_step(
                NextStep(name, function, data, (options_of or {}).get(name, default)),
                self.write_alias(),
            )
            for name, function, data in calls
        ]
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        rows = self.rows()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            rows.bulk_create(
                [self.model(run_id=pk, **step_columns(step)) for step in wanted],
                batch_size=FAN_OUT_BATCH,
                ignore_conflicts=True,  # recorded already (by another pass): left as it is
            )
            # Due on the database clock (bulk_create writes values, not expressions).
            rows.filter(
                run_id=pk, step_name__in=names, status=StepStatus.PENDING, available_at=None
            ).update(available_at=DbNow())
            wake_workers(alias)
            found = {step.step_name: step for step in rows.filter(run_id=pk, step_name__in=names)}
        for step_name, function_name, _data in calls:
            if found[step_name].function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} of run {run_id} was recorded with step function "
                    f"{found[step_name].function_name!r}, not {function_name!r}"
                )
        return found

    def _schedule(self, run_id: uuid.UUID | str, step: NextStep) -> tuple[WorkflowStep, bool]:
        """:meth:`schedule` on a checked step; ``(step row, created by this call)``."""
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            row, created = self.rows().get_or_create(
                run_id=parse_run_id(run_id),
                step_name=step.step_name,
                defaults={
                    **step_columns(step),
                    "available_at": DbNow(),
                },
            )
            if created:
                wake_workers(alias)
        if row.function_name != step.function_name:
            raise ValueError(
                f"Step {step.step_name!r} of run {run_id} was recorded with step function "
                f"{row.function_name!r}, not {step.function_name!r}"
            )
        return row, created

    @falls_back
    def schedule_claimed(
        self,
        run_id: uuid.UUID | str,
        step: NextStep,
        *,
        lease_ttl_seconds: float,
        finish_pass: int,
        queues: Sequence[str] | None = None,
        claimant: str = "",
    ) -> Scheduled:
        """:meth:`schedule` ``step``, and claim it for the caller if this call created it.

        For a worker that drives a run itself: the step it schedules is due now, so it runs
        it straight away instead of leaving it to the queue (no notification is sent). The
        claim follows :meth:`claim_for_execution`'s rules for a new step — ``running`` at
        attempt 1 with a ``lease_ttl_seconds`` lease on the database clock, plus its attempt
        row; if its worker dies, the lease lapses and any worker claims attempt 2. A claim
        also ends the caller's pass (:meth:`WorkflowRunQuerySet.finish_pass`'s rule, with
        ``finish_pass`` the ``pass_requests`` the pass read), and names ``claimant``
        (``WorkflowStep.claimant``; see :meth:`reclaim_created`). The step is inserted and
        claimed in one transaction, so no other worker ever sees it unclaimed when this call
        claims it. Tuned (PostgreSQL, where :meth:`~values.StepOptions.one_statement`):
        creating, claiming and ending the pass are one statement, inserting only while the
        run is ``running``.

        ``queues`` (the caller's ``--queue`` names; ``None`` or empty: every queue): a step
        of another queue is only scheduled, for a worker of its queue. A step of a limited
        queue is claimed through :meth:`claim_for_execution`, which enforces the limits (it
        may leave it waiting).

        Returns a :class:`Scheduled`; its ``claim`` is ``None`` when the step already
        existed, the run is not running, the step is not the caller's to take (another
        queue, or its queue is at its limit), or another worker claimed it first. Raises
        ``ValueError`` as :meth:`schedule` does.
        """
        check_step(step, self.write_alias())
        options = step.options
        if queues and options.queue not in queues:
            row, created = self._schedule(run_id, step)
            return Scheduled(row, None, created=created)
        ttl = ttl_seconds(lease_ttl_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        sent = time.monotonic()
        if not in_one_statement(connection, options):
            with transaction.atomic(using=alias):
                scheduled = self._insert_and_claim(alias, run_id, step, ttl, (), claimant)
                if scheduled.claim is None:
                    return scheduled
                runs = run_model().objects.db_manager(alias)
                finished = runs.finish_pass(run_id, finish_pass)
            return dataclasses.replace(scheduled, pass_finished=finished)
        run_id = parse_run_id(run_id)
        found = call_function(
            connection,
            "insert_claimed",
            [run_id, *claimed_insert_params(step, ttl), finish_pass, claimant],
        )
        if found is None or found[0] is None:  # it exists, or the run is not running
            row, created = self._schedule(run_id, step)
            return Scheduled(row, None, created=created)
        return inserted_claimed(
            alias, int(found[0]), run_id, step, ttl, sent, claimant, fence_floor=found[1]
        )

    def _insert_and_claim(
        self,
        alias: str,
        run_id: uuid.UUID | str,
        step: NextStep,
        ttl: float,
        queues: Sequence[str] | None,
        claimant: str,
    ) -> Scheduled:
        """Create ``step`` (unless it exists) and claim it for the caller under a ``ttl``
        lease naming ``claimant``, inside the caller's transaction — so no other worker ever
        sees it unclaimed when this claims it. A step of a queue not in ``queues`` (empty:
        every queue), or one its queue does not admit now, is left for its workers."""
        row, created = self._schedule(run_id, step)
        if not created or (queues and step.options.queue not in queues):
            return Scheduled(row, None, created=created)
        claim = self.claim_for_execution(
            run_id, step.step_name, step.function_name, ttl, claimant=claimant
        )
        if claim is None:
            return Scheduled(row, None)
        row.status, row.claimant = StepStatus.RUNNING, claimant
        return Scheduled(row, claim)

    def reclaim_created(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        *,
        lease: Lease,
        lease_ttl_seconds: float,
        claimant: str,
    ) -> Scheduled | None:
        """Claim again a step that a write of the caller created claimed, when that write's
        reply was lost (:meth:`set_result_claiming_next` tried again finds its result
        recorded): the step is the caller's only while its running attempt 1 is the claim
        that write made — the claim names ``claimant`` (a step the write left unclaimed,
        which another worker claimed since, names another or none) — while the caller still
        holds the run lease ``lease`` (same holder and token, live on the database clock, so
        nobody else ran a pass of the run since) and the run is running. Its step lease is
        then renewed ``lease_ttl_seconds`` (seconds) from now. Returns the step and its claim
        (:class:`Scheduled`), or ``None`` (the step's lease lapses and it is taken over as
        for any lost worker).

        Raises:
            ValueError: an empty ``claimant`` (it would name every unnamed claim).
        """
        if not claimant:
            raise ValueError("reclaim_created needs the claimant the write named")
        ttl = ttl_seconds(lease_ttl_seconds)
        run_id = parse_run_id(run_id)
        alias = self.write_alias()
        sent = time.monotonic()
        with transaction.atomic(using=alias):
            held = (
                Lease._default_manager.using(alias)
                .select_for_update()
                .filter(
                    key=run_lease_key(run_id),
                    holder=lease.holder,
                    token=lease.token,
                    released_at__isnull=True,
                    expires_at__gt=DbNow(),
                )
                .values_list("pk", flat=True)
                .first()
            )
            if held is None:
                return None
            mine = self.rows().filter(
                slot_kept_q(),  # a lapsed lease of a limited queue is lost
                run_id=run_id,
                step_name=step_name,
                status=StepStatus.RUNNING,
                attempt=1,
                claimant=claimant,
                run__status=RunStatus.RUNNING,
            )
            if not mine.update(lease_expires_at=clock.db_now_plus(ttl), updated_at=DbNow()):
                return None
            # The claim's epoch floor is the one its write stored on the step: a server that
            # lost that write in a promotion has no step naming this claimant.
            step = self.rows().get(run_id=run_id, step_name=step_name)
        claim = claim_of_step(alias, step, ttl, sent, attempt=1, fence_floor=step.fence_floor)
        return Scheduled(step, claim, False)

    def unclaim_created(self, run_id: uuid.UUID | str, claimant: str) -> int:
        """Hand back, unclaimed, every step of run ``run_id`` that a write of the caller
        created claimed under ``claimant`` and whose attempt 1 nobody ran (the write's reply
        was lost, and the caller will not run it): the step is ``pending`` again at attempt
        1, due at once for any worker (its next claim runs attempt 1, the first execution of
        it). Only that write names ``claimant``, and a takeover would have moved the step
        past attempt 1, so nobody else holds that claim. Wakes waiting workers. Returns how
        many steps were handed back.

        Raises:
            ValueError: an empty ``claimant`` (it would name every unnamed claim).
        """
        if not claimant:
            raise ValueError("unclaim_created needs the claimant the write named")
        alias = self.write_alias()
        mine = self.rows().filter(
            run_id=parse_run_id(run_id), status=StepStatus.RUNNING, attempt=1, claimant=claimant
        )
        return self._unclaim(alias, mine, StepStatus.PENDING)
