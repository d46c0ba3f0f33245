"""Orchestration by replay and step execution under fenced step leases (DESIGN §5).

A ``@workflow`` function is called **from the start on every orchestration pass**::

    @workflow("build-preview")
    def build_preview(run, payload):
        source = run.step("checkout", "previews.checkout", {"ref": payload["ref"]})
        build = run.step("build", "previews.build", source, retries=3, retry_delay=5)
        return {"build": build["build_id"]}

``run.step(...)`` returns the recorded result of a succeeded step; the first step that has not
succeeded yet is created (idempotently) and the pass ends there — a worker claims the step,
runs its ``@step_function`` under a step lease, records the result fenced to its attempt, and
asks the run for another pass. The workflow's return value completes the run. So workflow
functions must be deterministic and side-effect free outside ``run.step``; step functions
should be idempotent, as a step may run more than once (its worker can die after the work
but before the result is recorded).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, connections, router

from django_leases.conf import leases_settings
from django_leases.exceptions import LeaseLostError, LeaseTakenError, WorkflowStepSupersededError
from django_leases.leases import LeaseHandle, _deferred_hold_lease, hold_lease, new_holder
from django_leases.renewal import Renewal
from django_leases.workflows.registry import (
    UnknownWorkflowError,
    get_step_function,
    get_workflow,
)
from django_leases.workflows.states import (
    STEP_FAILED,
    WORKFLOW_ERROR,
    WORKFLOW_NOT_FOUND,
    RunStatus,
    StepStatus,
)
from django_leases.workflows.store import (
    Claim,
    PassClaim,
    WorkflowStepCancelledError,
    as_stored,
    check_json,
    check_retries,
    error_json,
)

logger = logging.getLogger("django_leases.workflows")

#: Seconds after which a pass that found the run lease taken is tried again.
PASS_RETRY_DELAY = 1.0


def run_lease_key(run_id: uuid.UUID | str) -> str:
    """The key of the lease an orchestration pass of run ``run_id`` holds."""
    return f"workflow-run:{run_id}"


def run_lease_ttl() -> float:
    """TTL (seconds) of the run lease, and how long a picked pass waits before it is re-picked
    should its worker die: ``DJANGO_LEASES["DEFAULT_TTL"]``."""
    return float(leases_settings.DEFAULT_TTL)


# -- starting -----------------------------------------------------------------------------------


def start_workflow(name: str, input: Any = None, *, using: str | None = None) -> uuid.UUID:
    """Create a run of workflow ``name`` with JSON ``input`` and its first pass, atomically.

    Safe inside an outer ``transaction.atomic()`` (the webhook view records the delivery and
    starts the run in one transaction): the run is picked by a worker once that commits.
    ``using`` is a database alias (default: the router's choice). Returns the run id
    (``uuid.UUID``).

    Raises:
        UnknownWorkflowError: no workflow of that name is registered.
        ValueError: ``input`` is not JSON-serialisable (nothing written).
    """
    from django_leases.models import WorkflowRun

    get_workflow(name)
    alias = using or router.db_for_write(WorkflowRun)
    run = WorkflowRun.objects.db_manager(alias).start(name, input)
    return run.id


# -- replay -------------------------------------------------------------------------------------


class _PassEnded(BaseException):
    """Ends an orchestration pass at the first step that has not succeeded yet.

    A ``BaseException`` so a workflow's ``except Exception:`` cannot swallow it.
    """


class WorkflowStepFailedError(Exception):
    """Raised by ``run.step`` for a step that failed on its last attempt.

    Uncaught, it fails the run with code ``STEP_FAILED``. ``.step_name`` and ``.error`` (the
    step's JSON error) describe it.
    """

    def __init__(self, step_name: str, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        super().__init__(f"Step {step_name!r} failed on its last attempt: {message}")
        self.step_name = step_name
        self.error = error


class RunContext:
    """What a ``@workflow`` function gets as ``run``.

    Attributes:
        id: the run id (``uuid.UUID``).
        workflow: the workflow name.
        input: the run's JSON input (also passed as the second argument).
    """

    def __init__(
        self,
        run: Any,
        steps: dict[str, Any],
        using: str,
        claim_ttl: float | None = None,
        *,
        dry: bool = False,
    ) -> None:
        self.id: uuid.UUID = run.id
        self.workflow: str = run.workflow
        self.input: Any = run.input
        self._steps = steps
        self._using = using
        self._seen: set[str] = set()
        self._claim_ttl = claim_ttl
        self._pass_requests: int = run.pass_requests
        #: The step this pass scheduled and claimed for its worker (see :func:`drive_run`).
        self.claim: Claim | None = None
        #: Whether that claim also ended the pass (``finish_pass`` in the same statement).
        self.pass_finished = False
        #: The run row and the steps (by name) this pass read or wrote.
        self.run = run
        self.steps = steps
        #: A dry pass writes nothing: it ends at the first step not succeeded yet.
        self._dry = dry
        #: The input and the steps' results and errors as this pass read them (JSON text),
        #: where a dry pass may follow (see :func:`_dry_replay`); else ``None``.
        self.read: str | None = None

    def step(
        self,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
    ) -> Any:
        """Run step ``step_name`` with step function ``function_name`` on JSON ``data``.

        Returns the step's recorded result once it succeeded. Otherwise the step is created
        (on the first pass that reaches it) and the pass ends here; a worker runs it and the
        run is replayed once it finishes. ``retries`` (int ≥ 0) allows ``retries + 1``
        attempts, ``retry_delay`` seconds apart.

        Raises:
            WorkflowStepFailedError: the step failed on its last attempt.
            ValueError: bad arguments, a step name used twice in one run, or a step recorded
                with another step function (the workflow changed under a running run).
        """
        from django_leases.models import WorkflowStep
        from django_leases.workflows.store import check_identifier

        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        check_retries(retries, retry_delay)
        check_json(data, f"Data of step {step_name!r}")
        if step_name in self._seen:
            raise ValueError(f"Step name {step_name!r} is used twice in run {self.id}")
        self._seen.add(step_name)
        step = self._steps.get(step_name)
        if step is None and self._dry:
            raise _PassEnded
        if step is None:
            store = WorkflowStep.objects.db_manager(self._using)
            if self._claim_ttl is None:
                step = store.schedule(
                    self.id,
                    step_name,
                    function_name,
                    data,
                    retries=retries,
                    retry_delay=retry_delay,
                )
            else:
                step, self.claim = store.schedule_claimed(
                    self.id,
                    step_name,
                    function_name,
                    data,
                    retries=retries,
                    retry_delay=retry_delay,
                    lease_ttl_seconds=self._claim_ttl,
                    finish_pass=self._pass_requests,
                )
                self.pass_finished = bool(getattr(step, "pass_finished", False))
            self._steps[step_name] = step
        if step.function_name != function_name:
            raise ValueError(
                f"Step {step_name!r} was recorded with step function {step.function_name!r}; "
                f"the workflow now asks for {function_name!r}"
            )
        if step.status == StepStatus.SUCCEEDED:
            return step.result
        if step.status == StepStatus.FAILED and step.attempt >= step.retries + 1:
            raise WorkflowStepFailedError(step_name, step.error)
        raise _PassEnded


def run_pass(run_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Run one orchestration pass of run ``run_id`` under the run lease ``workflow-run:<id>``.

    Replays the workflow from the start (see :class:`RunContext`). Returns what happened:
    ``"waiting"`` (a step is not finished yet), ``"completed"``, ``"failed"``,
    ``"suspended"`` (the workflow is not registered here: code ``WORKFLOW_NOT_FOUND``),
    ``"not-running"`` or ``"lease-taken"``. A pass that finds the run lease taken (or loses
    it) asks for another pass about a second later; it never fails the run.
    """
    from django_leases.models import WorkflowRun

    alias = using or router.db_for_write(WorkflowRun)
    try:
        with hold_lease(run_lease_key(run_id), ttl=run_lease_ttl(), using=alias):
            return _replay(run_id, alias)[0]
    except (LeaseTakenError, LeaseLostError) as exc:
        return _pass_later(run_id, alias, exc, "during a pass")


def drive_run(
    run_id: uuid.UUID | str,
    *,
    step_lease_ttl: float,
    using: str | None = None,
    keep_going: Callable[[], bool] = lambda: True,
    picked: PassClaim | None = None,
    next_passes: list[PassClaim] | None = None,
) -> str:
    """Drive run ``run_id`` on the calling thread: its pass, the step that pass schedules,
    the next pass, and so on, all under **one** hold of the run lease ``workflow-run:<id>``.

    The caller has taken the run's pass (:meth:`~WorkflowRunQuerySet.claim_due_pass`, or a
    step result written with ``hold_pass``). A pass that schedules a step due now claims it
    for this thread at once (``step_lease_ttl`` seconds, see ``schedule_claimed``), runs it
    with :func:`execute_step`, whose result takes the run's next pass for this thread; that
    pass runs next. Nothing is handed to the queue while this thread can go on, and no
    notification is sent for it. Should this thread die, nothing is lost: the step's lease
    lapses and the held pass becomes due again, and other workers take them over by the
    ordinary rules. Once ``keep_going()`` is false (the worker is stopping) no step is
    claimed and the next pass is handed to the queue (due now).

    When a step succeeds, the run is first replayed in memory with its result (a dry pass,
    which writes nothing). If the workflow then returns, the result, the run's completion
    and the release of the run lease are one statement on PostgreSQL
    (``set_result_completing_run``, fenced like any result); otherwise, or where that
    statement does not exist, the result is written and the next pass runs as above.

    ``picked``: the pass claim that picked the run: its run row and steps (read with the
    pick, which spares the first pass reading them again) and the run lease when the pick
    took it (``PassClaim.lease``, held from there; a pick that found the lease taken is
    treated as a pass that finds it taken). ``None``: read them, take the lease here.

    ``next_passes``: a list; a completion statement sent while ``keep_going()`` also picks
    the next due pass with its lease and appends it there, for the caller to drive next.

    Returns the last pass's outcome (as :func:`run_pass`), or the step's outcome
    (``"suspended"``, ``"superseded"``) when that ended the drive.
    """
    from django_leases.models import WorkflowRun

    alias = using or router.db_for_write(WorkflowRun)
    ttl = run_lease_ttl()
    run = steps = lease = None
    sent = 0.0
    if picked is not None:
        run, steps, lease, sent = picked.run, picked.steps, picked.lease, picked.sent
    hold = _deferred_hold_lease(run_lease_key(run_id), ttl=ttl, using=alias, adopt=lease, sent=sent)
    try:
        if picked is not None and picked.lease_refused:
            raise LeaseTakenError(run_lease_key(run_id))
        with hold as held:
            while True:
                held.check()
                claim_ttl = step_lease_ttl if keep_going() else None
                outcome, ctx = _replay_pass(run_id, alias, claim_ttl, run, steps)
                run = steps = None
                claim = None if ctx is None else ctx.claim
                if ctx is None or claim is None:
                    return outcome
                logger.info(
                    "Run %s: step %r attempt %d claimed",
                    claim.run_id,
                    claim.step_name,
                    claim.attempt,
                )
                state: dict[str, Any] = {}
                finish = None
                if connections[alias].vendor == "postgresql":  # see set_result_completing_run
                    finish = _Completion(
                        ctx, claim, hold, held, state, next_passes, keep_going, ttl
                    )
                step_outcome = execute_step(claim, hold_pass=ttl, pass_state=state, finish=finish)
                run, steps = state.get("run"), state.get("steps")
                logger.info(
                    "Run %s: step %r attempt %d %s",
                    claim.run_id,
                    claim.step_name,
                    claim.attempt,
                    step_outcome,
                )
                if "outcome" in state:  # the result completed the run in the same statement
                    return str(state["outcome"])
                if step_outcome not in ("succeeded", "failed"):
                    return step_outcome
                if not keep_going():
                    # Stopping: the pass the result took for this thread goes to the queue.
                    WorkflowRun.objects.db_manager(alias).request_pass(run_id)
                    return "waiting"
    except (LeaseTakenError, LeaseLostError) as exc:
        return _pass_later(run_id, alias, exc, "while driving it")


def _pass_later(
    run_id: uuid.UUID | str, alias: str, exc: LeaseTakenError | LeaseLostError, when: str
) -> str:
    """A pass that found the run lease taken, or lost it (``when``: during what), asks for
    another pass :data:`PASS_RETRY_DELAY` seconds later and never fails the run; returns
    ``"lease-taken"``."""
    from django_leases.models import WorkflowRun

    if isinstance(exc, LeaseTakenError):
        logger.info("Run %s: its lease is taken; another pass in %.0f s", run_id, PASS_RETRY_DELAY)
    else:
        logger.warning("Run %s: its lease was lost %s; another pass follows", run_id, when)
    WorkflowRun.objects.db_manager(alias).request_pass(run_id, delay=PASS_RETRY_DELAY)
    return "lease-taken"


class _Completion:
    """:func:`drive_run`'s ``finish`` for :func:`execute_step`: given the step's result,
    replay the run dry; if the workflow returns, write the result, the run's completion
    and the run lease's release in one statement (``set_result_completing_run``).
    Returns ``"succeeded"`` when that statement wrote the result, else ``None`` (the
    caller writes the result the ordinary way)."""

    def __init__(
        self,
        ctx: RunContext,
        claim: Claim,
        hold: _deferred_hold_lease,
        held: LeaseHandle,
        state: dict[str, Any],
        next_passes: list[PassClaim] | None,
        keep_going: Callable[[], bool],
        ttl: float,
    ) -> None:
        self.ctx = ctx
        self.claim = claim
        self.hold = hold
        self.held = held
        self.state = state
        self.next_passes = next_passes
        self.keep_going = keep_going
        self.ttl = ttl
        self.sent = False

    def __call__(self, result: Any) -> str | None:
        from django_leases.models import WorkflowStep

        found, output = _dry_replay(self.ctx, self.claim.step_name, result)
        if not found:
            return None
        # A retry (the first try's reply was lost: it may have committed, picking a run
        # nobody would drive) picks nothing: that run is picked again once its lease lapses.
        want_next = self.next_passes is not None and self.keep_going() and not self.sent
        self.sent = True
        done = WorkflowStep.objects.db_manager(self.claim.using).set_result_completing_run(
            self.claim.step_id,
            result,
            self.claim.attempt,
            output=output,
            lease=self.held.lease,
            next_pass_holder=new_holder() if want_next else None,
            next_pass_ttl=self.ttl,
        )
        if done is None:
            return None
        if done.next_pass is not None:
            assert self.next_passes is not None
            self.next_passes.append(done.next_pass)
        if not done.written:
            return None
        if done.lease_live is not None:
            self.hold.released_elsewhere(done.lease_live)
        # A run no longer running was not completed: "failed", as a pass would say.
        self.state["outcome"] = "completed" if done.completed else "failed"
        return StepStatus.SUCCEEDED.value


def _dry_replay(ctx: RunContext, step_name: str, result: Any) -> tuple[bool, Any]:
    """Replay the run of ``ctx`` in memory as if step ``step_name`` had just succeeded with
    ``result``, writing nothing: from what the pass of ``ctx`` read (``ctx.read``), with the
    result as the database will give it back (:func:`~store.as_stored`), so the workflow
    sees what a pass reading them would. ``(True, output)`` when the workflow returns JSON
    ``output``; ``(False, None)`` when it does anything else (asks for a step not run yet,
    raises, returns something not JSON), which the ordinary pass handles for real."""
    if ctx.read is None:
        return False, None
    try:
        check_json(result, "Step result")
        func = get_workflow(ctx.workflow)
    except (ValueError, UnknownWorkflowError):
        return False, None
    input, read = json.loads(ctx.read)
    steps = {}
    for name, recorded in ctx.steps.items():
        step = steps[name] = copy.copy(recorded)
        if name in read:
            step.result, step.error = read[name]
    step = steps[step_name]
    step.status = StepStatus.SUCCEEDED
    step.result = as_stored(result)
    step.error = None
    run = copy.copy(ctx.run)
    run.input = input
    dry = RunContext(run, steps, ctx._using, dry=True)
    try:
        output = func(dry, input)
        check_json(output, "Workflow output")
    except KeyboardInterrupt:
        raise
    except BaseException:
        return False, None
    return True, output


def _replay(
    run_id: uuid.UUID | str,
    alias: str,
    claim_ttl: float | None = None,
    run: Any = None,
    steps: dict[str, Any] | None = None,
) -> tuple[str, Claim | None]:
    """One pass of the run (the caller holds the run lease). With ``claim_ttl``, a step the
    pass schedules is claimed for the caller (``(outcome, claim)``); else the claim is
    ``None``. ``run`` / ``steps``: the run row and its steps (by name) if the caller just
    read them (with the pass claim, or with the step result that took the pass)."""
    outcome, ctx = _replay_pass(run_id, alias, claim_ttl, run, steps)
    return outcome, (ctx.claim if ctx is not None else None)


def _replay_pass(
    run_id: uuid.UUID | str,
    alias: str,
    claim_ttl: float | None,
    run: Any = None,
    steps: dict[str, Any] | None = None,
) -> tuple[str, RunContext | None]:
    from django_leases.models import WorkflowRun, WorkflowStep

    runs = WorkflowRun.objects.db_manager(alias)
    if run is None:
        run = runs.filter(pk=run_id).first()
    if run is None or run.status != RunStatus.RUNNING:
        return "not-running", None
    requests = run.pass_requests
    try:
        func = get_workflow(run.workflow)
    except UnknownWorkflowError as exc:
        logger.error("Run %s suspended: %s", run_id, exc)
        runs.suspend(run_id, {"code": WORKFLOW_NOT_FOUND, "message": str(exc)})
        return "suspended", None
    if steps is None:
        steps = {s.step_name: s for s in WorkflowStep.objects.db_manager(alias).filter(run=run)}
    ctx = RunContext(run, steps, alias, claim_ttl)
    if claim_ttl is not None and connections[alias].vendor == "postgresql":
        # What this pass reads, as it reads it, for a dry pass after its step (the workflow
        # may change the input or a result it was given in place).
        ctx.read = json.dumps([run.input, {name: [s.result, s.error] for name, s in steps.items()}])
    try:
        output = func(ctx, run.input)
    except _PassEnded:
        if not ctx.pass_finished:
            runs.finish_pass(run_id, requests)
        return "waiting", ctx
    except WorkflowStepFailedError as exc:
        logger.warning("Run %s failed: %s", run_id, exc)
        runs.fail(
            run_id,
            {
                "code": STEP_FAILED,
                "message": str(exc),
                "step_name": exc.step_name,
                "step_error": exc.error,
            },
        )
        return "failed", ctx
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit and the like from workflow code fail the run too
        logger.warning("Run %s failed: its workflow raised", run_id, exc_info=True)
        error = error_json(exc)
        if "code" in error:  # the exception's own ``code`` (e.g. SystemExit's status)
            error["exception_code"] = error.pop("code")
        runs.fail(run_id, {"code": WORKFLOW_ERROR, **error})
        return "failed", ctx
    try:
        check_json(output, "Workflow output")
    except ValueError:
        runs.complete(run_id, output)  # fails the run with that error
        return "failed", ctx
    # A run cancelled meanwhile is not completed (``False``), as before: "failed".
    return ("completed" if runs.complete(run_id, output) else "failed"), ctx


# -- steps --------------------------------------------------------------------------------------


class StepContext:
    """What a ``@step_function`` gets as ``ctx``.

    Attributes:
        run_id: the run's ``uuid.UUID``; step_name, function_name: ``str``;
        attempt: the attempt this execution is (``int`` ≥ 1) — use it with ``run_id`` and
            ``step_name`` as an idempotency key for side effects;
        lease_lost: a :class:`threading.Event` set once the step lease is seen lost (the
            attempt may have been superseded; nothing this attempt returns will land then).
    """

    def __init__(self, claim: Claim, lease_lost: threading.Event) -> None:
        self.run_id = claim.run_id
        self.step_name = claim.step_name
        self.function_name = claim.function_name
        self.attempt = claim.attempt
        self.lease_lost = lease_lost
        self._key = f"workflow-step:{claim.step_id}"

    def check(self) -> None:
        """Raise :class:`LeaseLostError` once the step lease is seen lost; else ``None``."""
        if self.lease_lost.is_set():
            raise LeaseLostError(self._key)


def execute_step(
    claim: Claim,
    *,
    hold_pass: float | None = None,
    pass_state: dict[str, Any] | None = None,
    finish: Callable[[Any], str | None] | None = None,
) -> str:
    """Run the claimed step's function under its step lease and record the outcome, fenced.

    The step lease is renewed every TTL/3 by :class:`~django_leases.renewal.Renewal`, each
    renewal fenced to ``claim.attempt``. The function runs outside any transaction; its result
    (or the exception it raised) is then written with ``set_result`` / ``set_error``, which
    also ask the run for its next pass. Returns ``"succeeded"``, ``"failed"``,
    ``"suspended"`` (the step function is not registered here: the run is suspended with code
    ``STEP_FUNCTION_NOT_FOUND``) or ``"superseded"``.

    A :class:`WorkflowStepSupersededError` anywhere ends the dispatch quietly: a warning is
    logged, nothing is written, the run is not suspended, and nothing is raised.

    ``hold_pass`` (seconds, the run lease's TTL): the caller runs the run's next pass itself
    (:func:`drive_run`); the outcome write takes that pass for it instead of making it due
    for every worker (see ``set_result``). ``pass_state``: a dict the result write fills
    with the run and its steps for that pass, where it can read them in the same statement.
    """
    from django_leases.models import WorkflowStep

    store = WorkflowStep.objects.db_manager(claim.using)
    func = get_step_function(claim.function_name)
    if func is None:
        try:
            store.suspend_for_missing_function(claim.step_id, claim.attempt, claim.function_name)
        except WorkflowStepSupersededError as exc:
            _superseded(claim, exc)
            return "superseded"
        logger.error(
            "Run %s suspended: step %r needs step function %r, which is not registered",
            claim.run_id,
            claim.step_name,
            claim.function_name,
        )
        return "suspended"

    def renew() -> bool:
        return store.refresh_lease(claim.step_id, claim.lease_ttl, claim.attempt)

    renewal = Renewal(
        f"workflow-step:{claim.step_id}:{claim.attempt}",
        claim.lease_ttl,
        renew,
        held_since=claim.claimed_at,
        deferred=True,  # most steps end before their first renewal: no thread for them
    )
    ctx = StepContext(claim, renewal.lost)
    failure: BaseException | None = None
    result: Any = None
    renewal.start()
    try:
        result = func(claim.data, ctx)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit, GeneratorExit…: this attempt's failure
        failure = exc
    finally:
        renewal.stop()
    if failure is not None:
        logger.warning(
            "Step %r of run %s (attempt %d) raised: %s",
            claim.step_name,
            claim.run_id,
            claim.attempt,
            failure,
            exc_info=failure,
        )
    try:
        if failure is None:

            def write_result() -> str:
                if finish is not None:
                    finished = finish(result)
                    if finished is not None:
                        return finished
                return store.set_result(
                    claim.step_id, result, claim.attempt, hold_pass=hold_pass, pass_state=pass_state
                )

            return _write_outcome(claim, renewal, write_result)
        error = failure
        return _write_outcome(
            claim,
            renewal,
            lambda: store.set_error(claim.step_id, error, claim.attempt, hold_pass=hold_pass),
        )
    except WorkflowStepSupersededError as exc:
        _superseded(claim, exc)
        return "superseded"


#: First pause before a fenced write that lost its connection is tried again, seconds.
WRITE_RETRY_BACKOFF = 0.1
#: Longest pause between two tries of such a write, seconds.
WRITE_RETRY_MAX_BACKOFF = 2.0


def _write_outcome(claim: Claim, renewal: Renewal, write: Callable[[], str]) -> str:
    """Run the fenced write ``write`` (``set_result`` / ``set_error``, which also asks the run
    for its pass in the same transaction), reconnecting and trying again after a connection
    error until the step lease's local deadline (:attr:`Renewal.deadline`) has passed.

    Repeating the write is safe: the attempt fence refuses it once the attempt is superseded
    (:class:`WorkflowStepSupersededError`, raised at once, never retried), and a write whose
    first try committed but whose acknowledgement was lost is recognised by the store as
    already recorded. (A completion that also picked the next run picks none when retried:
    the run a lost reply picked waits for its run lease to lapse, as after a worker's death.)
    Past the deadline the error is raised; the lease lapses and another attempt runs the step.
    """
    backoff = WRITE_RETRY_BACKOFF
    tries = 0
    while True:
        tries += 1
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            remaining = renewal.deadline - time.monotonic()
            if remaining <= backoff:
                logger.error(
                    "Step %r of run %s (attempt %d): its outcome could not be written "
                    "within the step lease (%d tries): %s",
                    claim.step_name,
                    claim.run_id,
                    claim.attempt,
                    tries,
                    exc,
                )
                raise
            logger.warning(
                "Step %r of run %s (attempt %d): writing its outcome failed (%s); "
                "reconnecting and trying again in %.1f s",
                claim.step_name,
                claim.run_id,
                claim.attempt,
                exc,
                backoff,
            )
            _close_connection(claim.using)
            time.sleep(backoff)
            backoff = min(backoff * 2, WRITE_RETRY_MAX_BACKOFF)


def _close_connection(alias: str) -> None:
    # The calling thread's own connection (Django's are per thread); the next query reconnects.
    try:
        connections[alias].close()
    except Exception:
        logger.debug("closing a broken connection failed", exc_info=True)


def _superseded(claim: Claim, exc: WorkflowStepSupersededError) -> None:
    if isinstance(exc, WorkflowStepCancelledError):
        why = "was stopped: its run was cancelled"
    else:
        why = f"was superseded (current attempt {exc.current_attempt})"
    logger.warning(
        "Step %r of run %s: attempt %d %s; its outcome was discarded",
        claim.step_name,
        claim.run_id,
        claim.attempt,
        why,
    )


__all__ = [
    "PASS_RETRY_DELAY",
    "RunContext",
    "StepContext",
    "WorkflowStepFailedError",
    "drive_run",
    "execute_step",
    "run_lease_key",
    "run_pass",
    "start_workflow",
]
