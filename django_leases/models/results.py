"""A step's result and what follows it in the same transaction (:class:`StepResults`, the
top layer of ``WorkflowStep.objects``): the result with the run's pass taken for the
caller, with the next step created and claimed (:meth:`StepResults.set_result_claiming_next`),
or with the run completed (:meth:`StepResults.set_result_completing_run`).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import F, Q, Value

from django_leases import db, faults
from django_leases.clock import DbNow
from django_leases.conf import queue_limits
from django_leases.frozen import frozen
from django_leases.models.lease import Lease, announce
from django_leases.models.outcomes import write_pending
from django_leases.models.scheduling import (
    Scheduled,
    StepScheduling,
    check_step,
    claimed_insert_params,
    inserted_claimed,
)
from django_leases.models.workflow_base import (
    Owed,
    attempt_finished,
    call_function,
    claim_from_row,
    claims_in_one,
    falls_back,
    fence_q,
    fence_sql,
    finish_attempt,
    finish_branch,
    functions_called,
    in_one_statement,
    lock_running,
    pass_claim,
    pass_state_from_row,
    request_passes,
    run_model,
    run_reached,
    with_result,
    workflow_tables,
)
from django_leases.signals import lease_acquired, lease_released
from django_leases.validation import (
    check_attempt,
    check_json,
    check_lease_name,
    parse_run_id,
    ttl_seconds,
)
from django_leases.workflows import sql
from django_leases.workflows.channel import channel_name
from django_leases.workflows.values import (
    RUN_LEASE_PREFIX,
    STEP_RESULT_NOT_JSON,
    AttemptStatus,
    NextStep,
    PendingResult,
    RunCompletion,
    RunStatus,
    StepStatus,
    StepWrite,
    fresh_claimant,
    nothing_owed,
    run_lease_key,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


@frozen
class ResultWithNext:
    """What :meth:`WorkflowStepQuerySet.set_result_claiming_next` did.

    Attributes:
        write: the result's :class:`~values.StepWrite`; its ``state`` is the run's pass,
            taken for the caller, when no next step was created and the run asked for one.
        next: the next step, when this call created it (:class:`Scheduled`; its ``claim``
            is ``None`` where the step is not the caller's to run: another queue, or its
            queue at its limit); ``None`` otherwise.
        pass_requests: the run's ``pass_requests`` once the pass ended with the next step's
            creation, for the caller's next pass to end with; ``None`` when no step was
            created or a pass asked for meanwhile stays due.
    """

    write: StepWrite
    next: Scheduled | None = None
    pass_requests: int | None = None


@frozen
class _Completion:
    """A checked :meth:`~StepResults.set_result_completing_run` call, for its three paths:
    the step's result for its attempt (the fence), the run's output, the run lease (held,
    or the holder to take it for an instant) and the holder and TTL (seconds) of the next
    pass to pick (``None``: no pick)."""

    step_id: int
    result: Any
    attempt: int
    output: Any
    lease: Lease | str
    next_holder: str | None
    next_ttl: float

    def head(self) -> list[Any]:
        """The tuned statements' first arguments: step, result, attempt, output (JSON)."""
        return [self.step_id, json.dumps(self.result), self.attempt, json.dumps(self.output)]


class StepResults(StepScheduling):
    """A result with what follows it: the pass, the next step, or the run's end."""

    def set_result(
        self, step_id: int, result: Any, attempt: int, *, hold_pass_seconds: float | None = None
    ) -> StepWrite:
        """Record ``result`` (JSON) for ``attempt`` of the step; returns a :class:`StepWrite`.

        One conditional write through the fence (this attempt, still ``running``); the attempt
        row is updated in the same transaction, and the run is asked for a pass: due now
        (idle workers are woken) or, with ``hold_pass_seconds`` (the run lease's TTL), taken
        for the caller, who runs it next — then ``StepWrite.state`` is the run and its steps
        as the write left them. A step of a ``run.parallel`` the run's last pass waits on
        asks only if it is the last of them to finish (``StepWrite.pass_requested``; the
        others just count themselves off the run's ``branches_left``), so N branches cost
        one pass, not N; the decision is taken on the run row locked by the write's own
        ``UPDATE``, so two branches finishing at once wake the run exactly once.
        A result that is not JSON is not stored: the attempt fails
        with a ``STEP_RESULT_NOT_JSON`` error instead (as :meth:`set_error`, so retries
        apply). Writing again the result this attempt already recorded returns a
        ``StepWrite`` with ``written=False`` (safe to retry after a lost acknowledgement).
        Tuned (PostgreSQL): one statement.

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` is not an int ≥ 1.
        """
        check_attempt(attempt)
        try:
            check_json(result, "Step result", using=self.write_alias())
        except ValueError as exc:
            return self.set_error(
                step_id,
                {"code": STEP_RESULT_NOT_JSON, "type": "ValueError", "message": str(exc)},
                attempt,
                hold_pass_seconds=hold_pass_seconds,
            )
        hold = None if hold_pass_seconds is None else ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        if db.tuned(connection, "postgresql"):
            fence, fence_params = fence_sql(alias, step_id, attempt)
            statement, params = sql.set_result(
                workflow_tables(connection),
                fence,
                fence_params,
                json.dumps(result),
                attempt,
                hold=hold,
                channel=channel_name(alias),
            )
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                row = cursor.fetchone()
            if row[0]:
                state = None
                asked = bool(row[1]) if hold is None else row[1] is not None
                if hold is not None and row[1] is not None:
                    state = pass_state_from_row(alias, row[1:])
                    with_result(state, step_id, self.stored_json(result))
                attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
                return StepWrite(StepStatus.SUCCEEDED, state=state, pass_requested=asked)
            # Nothing matched the fence: a repeat of this very write, or a refusal.
            if self._already_recorded(alias, step_id, attempt, AttemptStatus.SUCCEEDED, result):
                return StepWrite(StepStatus.SUCCEEDED, written=False)
            self._refuse(alias, step_id, attempt)
        with transaction.atomic(using=alias):
            written = self._record_success(alias, step_id, attempt, result)
            # A repeat (``written`` false) goes on as if it had asked: at worst one pass more.
            asked = finish_branch(alias, step_id, hold) if written else True
        state = self._state_after(alias, step_id, hold) if asked else None
        return StepWrite(StepStatus.SUCCEEDED, written, state, pass_requested=asked)

    @falls_back
    def set_result_claiming_next(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        next_step: NextStep,
        finish_pass: int,
        lease_ttl_seconds: float,
        hold_pass_seconds: float,
        queues: Sequence[str] | None = None,
        claimant: str = "",
    ) -> ResultWithNext:
        """Record ``result`` for ``attempt`` of the step (:meth:`set_result`), and create the
        step its run's workflow asks for next, claimed for the caller (:meth:`schedule_claimed`)
        in a claim that names ``claimant`` (:func:`~values.claimant_name`: the same for every
        try of this write, so a try after a lost reply can find its own claim with
        :meth:`reclaim_created`).

        For the driver of a run that has replayed the workflow in memory with this result
        and found it asks for ``next_step`` next: the pass the result asks for has then been
        run, so it ends with the next step's creation — unless another pass was asked for
        since ``finish_pass`` (the ``pass_requests`` the caller's last pass read), which stays
        due. The next step is created only when the result was written, the run is
        ``running`` and its last pass waits on no other parallel step; when it is not (or a
        step of that name exists), the write is :meth:`set_result` with
        ``hold_pass_seconds``: the pass is taken for the caller, who runs it for real.
        ``lease_ttl_seconds``: the next step's lease; ``queues``: as for
        :meth:`schedule_claimed` (a step of another queue, or of a limited queue at its
        limit, is created for its workers, not claimed). Tuned (PostgreSQL), for a step of
        the default queue with no timeout or priority of its own: one statement; else the
        two writes one after the other (a worker dying between them leaves the pass taken,
        due again once ``hold_pass_seconds`` have passed).

        Args:
            step_id: the step (``int``).
            result: its JSON result.
            attempt: the attempt that ran (``int`` ≥ 1), the fence.
            next_step: the step to create (:class:`~values.NextStep`).
            finish_pass: ``pass_requests`` as the caller's pass read it (``int``).
            lease_ttl_seconds: seconds of the next step's lease.
            hold_pass_seconds: seconds the run's pass is taken for when no step is created
                (the run lease's TTL).
            queues: the caller's ``--queue`` names (``None`` or empty: every queue).
            claimant: the name the next step's claim carries (``str``).

        Returns:
            A :class:`ResultWithNext`.

        Raises:
            WorkflowStepSupersededError: ``attempt`` is not the step's running attempt;
                nothing was written.
            WorkflowStep.DoesNotExist: no such step.
            ValueError: ``attempt`` or the next step's settings are invalid (as
                :meth:`schedule` says); nothing was written.
        """
        check_attempt(attempt)
        check_step(next_step, self.write_alias())
        ttl = ttl_seconds(lease_ttl_seconds)
        hold = ttl_seconds(hold_pass_seconds)
        alias = self.write_alias()
        connection = connections[alias]
        try:
            check_json(result, "Step result", using=self.write_alias())
        except ValueError:  # ``set_result`` turns it into the attempt's failure
            return ResultWithNext(self.set_result(step_id, result, attempt, hold_pass_seconds=hold))
        options = next_step.options
        served = not queues or options.queue in queues
        if not (served and in_one_statement(connection, options)):
            return self._claiming_next_portably(
                alias, step_id, result, attempt, next_step, finish_pass, ttl, hold, queues, claimant
            )
        sent = time.monotonic()
        row = call_function(
            connection,
            "set_result_claiming_next",
            [
                step_id,
                json.dumps(result),
                attempt,
                hold,
                *claimed_insert_params(next_step, ttl),
                finish_pass,
                claimant,
            ],
        )
        if row[2] is not None:
            faults.reached(
                "workflow.next-step-written", run_id=row[1], step_name=next_step.step_name
            )
        if not row[0]:
            # Nothing matched the fence: a repeat of this very write, or a refusal.
            if self._already_recorded(alias, step_id, attempt, AttemptStatus.SUCCEEDED, result):
                return ResultWithNext(StepWrite(StepStatus.SUCCEEDED, written=False))
            self._refuse(alias, step_id, attempt)
        attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
        width = sql.CLAIMING_NEXT_COLUMNS
        if row[2] is None:  # no step created: the pass, if the run asked, is the caller's
            state = None
            if row[width] is not None:
                state = pass_state_from_row(alias, row[width:])
                with_result(state, step_id, self.stored_json(result))
            write = StepWrite(StepStatus.SUCCEEDED, state=state, pass_requested=state is not None)
            return ResultWithNext(write)
        run_id = parse_run_id(row[1])
        scheduled = inserted_claimed(
            alias, int(row[2]), run_id, next_step, ttl, sent, claimant, fence_floor=row[-1]
        )
        return ResultWithNext(StepWrite(StepStatus.SUCCEEDED), scheduled, row[3])

    def _claiming_next_portably(
        self,
        alias: str,
        step_id: int,
        result: Any,
        attempt: int,
        next_step: NextStep,
        finish_pass: int,
        ttl: float,
        hold: float,
        queues: Sequence[str] | None,
        claimant: str,
    ) -> ResultWithNext:
        """:meth:`set_result_claiming_next` as one transaction: the result through the fence
        (the step's row locked first), the run locked, the next step inserted and claimed
        (:meth:`_insert_and_claim`), and the run's pass ended as the tuned statement ends it.
        Where no step is created (the run is not running, its last pass waits on other
        parallel steps, or a step of that name exists) the result asks for the pass as
        :meth:`set_result` with ``hold`` does, and the state is the caller's."""
        runs = run_model()._default_manager.using(alias)
        with transaction.atomic(using=alias):
            if not write_pending(alias, PendingResult(step_id, attempt, result)):
                return ResultWithNext(StepWrite(StepStatus.SUCCEEDED, written=False))
            run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).get()
            run = (
                db.for_update(runs.filter(pk=run_id), alias)
                .values("status", "branches_left")
                .first()
            )
            scheduled = None
            if run is not None and run["status"] == RunStatus.RUNNING and run["branches_left"] <= 1:
                scheduled = self._insert_and_claim(alias, run_id, next_step, ttl, queues, claimant)
            if scheduled is None or not scheduled.created:
                asked = finish_branch(alias, step_id, hold)
                write = StepWrite(
                    StepStatus.SUCCEEDED,
                    state=self._state_after(alias, step_id, hold) if asked else None,
                    pass_requested=asked,
                )
                return ResultWithNext(write)
            # The pass this result asks for is the caller's (run already, in memory), so it
            # ends here — unless another was asked for since ``finish_pass``: due now.
            ended = runs.filter(pk=run_id, pass_requests=finish_pass).update(
                pass_requests=F("pass_requests") + 1,
                pass_due_at=None,
                branches_left=0,
                updated_at=DbNow(),
            )
            if not ended:
                request_passes(alias, Q(pk=run_id))
        faults.reached("workflow.next-step-written", run_id=run_id, step_name=next_step.step_name)
        return ResultWithNext(
            StepWrite(StepStatus.SUCCEEDED), scheduled, finish_pass + 1 if ended else None
        )

    @falls_back
    def set_result_completing_run(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        output: Any,
        lease: Lease | None,
        lease_holder: str | None = None,
        next_pass_holder: str | None = None,
        next_pass_ttl: float = 30.0,
        next_step_ttl: float | None = None,
        next_step_queues: Sequence[str] | None = None,
    ) -> RunCompletion:
        """Record ``result`` (JSON) for ``attempt`` of the step **and** complete its run with
        ``output`` (JSON) **and** release the run lease ``lease`` (held by the caller).

        ``lease=None``: the caller holds no run lease (a worker that ran a step from the
        queue and knows the workflow returns with its result, a task's): the write takes
        the run lease for ``lease_holder`` (a fresh holder name, required then) and
        releases it in the same instant, so the run is completed only while no pass holds
        it; when one does, the result is written and a pass asked for instead
        (``RunCompletion.pass_asked``), as :meth:`set_result` would. ``lease_acquired`` and
        ``lease_released`` are sent for that grant. Rows are locked in the house's order:
        the step, its run, then the run lease.

        For the worker that drives the run: it replayed the run with this result in memory
        and the workflow returned ``output``, so the pass that would follow the result is
        already known. Everything is conditional on the step's fence (this attempt, still
        ``running``, as :meth:`set_result`): when it refuses, nothing is written, the lease
        is not released, and the caller goes the ordinary way (:meth:`set_result`, which
        raises or recognises a repeat). The run is completed only while it is ``running``.

        ``next_pass_holder``: also pick the next due pass with its run lease for that
        holder (``next_pass_ttl`` seconds), as :meth:`WorkflowRunQuerySet.claim_due_pass`
        does; it is picked whatever the fence said, and is never this step's run.
        ``next_step_ttl`` (seconds, instead of ``next_pass_holder``): also claim the next due
        step under a step lease of that TTL, of ``next_step_queues`` (names; ``None``: every
        queue), as :meth:`claim_due` does (``RunCompletion.next_step``); it is claimed
        whatever the fence said. Tuned (PostgreSQL): all of it is one statement (the claim
        too, without a held run lease while no queue it may take has limits: else it
        follows as :meth:`claim_due`); elsewhere one transaction, then the pick or claim.

        Returns a :class:`RunCompletion`. Raises ``ValueError`` for a bad attempt, non-JSON
        ``result`` or ``output``, a bad TTL, both a pick and a claim asked for, or
        (``lease=None``) a missing or bad ``lease_holder`` (nothing written);
        ``QueueConfigError`` (``next_step_ttl``) when ``DJANGO_LEASES["QUEUES"]`` is not
        usable.
        """
        check_attempt(attempt)
        check_json(result, "Step result", using=self.write_alias())
        check_json(output, "Workflow output", using=self.write_alias())
        held: Lease | str = (
            lease if lease is not None else check_lease_name(lease_holder, "lease_holder")
        )
        next_ttl = ttl_seconds(next_pass_ttl)
        step_ttl = None if next_step_ttl is None else ttl_seconds(next_step_ttl)
        if step_ttl is not None and next_pass_holder is not None:
            raise ValueError("Pick the next pass or claim the next step, not both")
        taken = list(next_step_queues or ())
        alias = self.write_alias()
        connection = connections[alias]
        # The claim joins the write where claim_due's one statement applies (PostgreSQL).
        in_one = (
            step_ttl is not None
            and isinstance(held, str)
            and claims_in_one(connection, queue_limits(), taken)
        )
        call = _Completion(step_id, result, attempt, output, held, next_pass_holder, next_ttl)
        if not functions_called(connection):
            done = self._complete_run_portably(alias, call)
        elif isinstance(held, str):
            done = self._complete_run_alone(
                connection, call, held, claim=step_ttl if in_one else None, queues=taken
            )
        else:
            done = self._complete_run_holding(connection, call, held)
        if step_ttl is None or in_one:
            return done
        return dataclasses.replace(done, next_step=self.claim_due(step_ttl, queues=taken))

    def _complete_run_holding(
        self, connection: BaseDatabaseWrapper, call: _Completion, held: Lease
    ) -> RunCompletion:
        """:meth:`set_result_completing_run` with the run lease ``held``, tuned: one
        statement."""
        alias = connection.alias
        step_id, attempt, output = call.step_id, call.attempt, call.output
        next_pass_holder = call.next_holder
        args = [*call.head(), held.key, held.holder, held.token]
        short = "complete_run"
        if next_pass_holder is not None:
            args += [next_pass_holder, call.next_ttl]
            short = "complete_run_picking"
        sent = time.monotonic()
        row = call_function(connection, short, args)
        width = sql.COMPLETION_COLUMNS
        next_pass = None
        if next_pass_holder is not None and row[width] is not None:
            next_pass = pass_claim(alias, row[width:], next_pass_holder, sent, connection)
        if row[2] is not None:
            announce(lease_released, held, alias)
        if row[0]:
            attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
        if row[1]:
            run_id = held.key.removeprefix(RUN_LEASE_PREFIX)
            run_reached(alias, run_id, RunStatus.COMPLETED, output=output, finished_at=row[3])
        return RunCompletion(
            written=bool(row[0]),
            completed=bool(row[1]),
            lease_live=None if row[2] is None else bool(row[2]),
            next_pass=next_pass,
            finished_at=row[3],
        )

    def _complete_run_alone(
        self,
        connection: BaseDatabaseWrapper,
        call: _Completion,
        holder: str,
        *,
        claim: float | None = None,
        queues: Sequence[str] = (),
    ) -> RunCompletion:
        """:meth:`set_result_completing_run` without a held run lease (the run lease taken
        for an instant for ``holder``), tuned: one statement; ``claim``: the step lease TTL
        (seconds) of the next due step of ``queues`` (empty: every queue; none of them
        limited) it claims too, under a name of its own (handed back by it should the call
        fail: :meth:`claim_due`)."""
        alias = connection.alias
        step_id, attempt, output = call.step_id, call.attempt, call.output
        next_holder = call.next_holder
        args = [*call.head(), holder, channel_name(alias)]
        short = "complete_run_alone"
        claimant = ""
        if next_holder is not None:
            args += [next_holder, call.next_ttl]
            short = "complete_run_alone_picking"
        elif claim is not None:
            claimant = fresh_claimant()
            args += [claim, list(queues) or None, claimant]
            short = "complete_run_alone_claiming"
        sent = time.monotonic()
        # The reply may be lost with a claim committed: what it took is handed back.
        handing_back: AbstractContextManager[None] = nullcontext()
        if claimant and claim is not None:
            handing_back = self.handing_back(claimant, claim)
        with handing_back:
            row = call_function(connection, short, args)
        width = sql.ALONE_COLUMNS
        lease_width = len(sql.LEASE_TYPES)
        next_pass = next_step = None
        picked = row[width + lease_width :]
        lapsed = False
        if claim is not None:
            lapsed, next_step = claim_from_row(alias, picked, claim, sent)
        if next_holder is not None and picked[0] is not None:
            next_pass = pass_claim(alias, picked, next_holder, sent, connection)
        granted = None
        if row[width] is not None:  # the instant grant: acquired and released
            granted = Lease.objects.db_manager(alias).from_returned(
                connection, row[width : width + lease_width]
            )

        def notify() -> None:
            if granted is not None:
                announce(lease_acquired, granted, alias)
                announce(lease_released, granted, alias)
            if row[0]:
                attempt_finished(alias, step_id, attempt, StepStatus.SUCCEEDED)
            if row[1] is not None:
                run_reached(alias, row[1], RunStatus.COMPLETED, output=output, finished_at=row[2])

        if next_step is None:
            notify()
        if lapsed and claim is not None:  # a lost worker's step first: the portable path
            next_step = self.claim_due(claim, queues=queues)
        return RunCompletion(
            written=bool(row[0]),
            completed=row[1] is not None,
            lease_live=None,
            next_pass=next_pass,
            finished_at=row[2],
            pass_asked=bool(row[3]),
            next_step=next_step,
            notify=Owed(notify) if next_step is not None and not lapsed else nothing_owed,
        )

    def _complete_run_portably(self, alias: str, call: _Completion) -> RunCompletion:
        """:meth:`set_result_completing_run`'s portable path: one transaction, then the pick."""
        step_id, attempt, output, lease = call.step_id, call.attempt, call.output, call.lease
        next_holder, next_ttl = call.next_holder, call.next_ttl
        json_result = Value(call.result, output_field=models.JSONField())
        live: bool | None = None
        completed = asked = False
        alone = isinstance(lease, str)
        run_id: uuid.UUID | None = None
        with transaction.atomic(using=alias):
            written = bool(
                self.rows()
                .filter(fence_q(step_id, attempt))
                .update(
                    status=StepStatus.SUCCEEDED,
                    result=json_result,
                    error=None,
                    lease_expires_at=None,
                    updated_at=DbNow(),
                )
            )
            if written:
                finish_attempt(alias, step_id, attempt, {"status": AttemptStatus.SUCCEEDED})
                run_id = self.rows().filter(pk=step_id).values_list("run_id", flat=True).get()
                runs = run_model().objects.db_manager(alias)
                leases = Lease.objects.db_manager(alias)
                held = None if isinstance(lease, str) else lease
                if isinstance(lease, str) and lock_running(alias, run_id):
                    # The house's order: the step (written above), its run, then the run
                    # lease — taken for an instant, or found held by a pass.
                    held = leases.acquire_checked(run_lease_key(run_id), lease, next_ttl)
                    if held is None:
                        asked = bool(request_passes(alias, Q(pk=run_id)))
                if held is not None:
                    completed = runs.complete(run_id, output)
                    live = leases.release_held(held)
        next_pass = None
        if next_holder is not None:
            # Never this step's run: a pass asked for it just now, and another holds its lease.
            runs_qs = run_model().objects.using(alias)
            next_pass = runs_qs._claim_due_pass_portably(
                alias, next_ttl, next_holder, time.monotonic(), run_id
            )
        return RunCompletion(
            written=written,
            completed=completed,
            lease_live=None if alone else live,
            next_pass=next_pass,
            pass_asked=asked,
        )
