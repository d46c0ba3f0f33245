"""Orchestration passes: a ``@workflow`` replayed from the start, and the driver that takes a
run from pass to step to pass under one hold of its run lease.

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

:class:`RunDriver` is how a worker thread keeps the run it took: the pass, the step that pass
schedules (claimed for this thread at once), the pass after it, and so on, all under one hold
of the run lease ``workflow-run:<id>``. When a step succeeds, the run is first replayed in
memory with its result (a dry pass, which writes nothing); if the workflow then returns, the
result, the run's completion and the release of the run lease are one write
(``set_result_completing_run``); if it asks for a new step, the result and that step, created
and claimed for the thread, are one write (``set_result_claiming_next``), and the dry pass
stands for the pass the result asks for: a middle step costs one write and one replay.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from django.db import router
from django.db.models import Model
from django.db.models.base import ModelState

from django_leases import tracing
from django_leases.conf import MAX_QUEUE_LENGTH, leases_settings
from django_leases.exceptions import (
    LeaseLostError,
    LeaseTakenError,
    UnknownWorkflowError,
    WorkflowChildFailedError,
    WorkflowEventTimeout,
    WorkflowStepFailedError,
)
from django_leases.leases import HeldLease, new_holder
from django_leases.validation import (
    check_backoff,
    check_identifier,
    check_json,
    check_name,
    check_retries,
    error_json,
    seconds,
    wait_seconds,
)
from django_leases.workflows.engine import StepRecorded, StepRun, record_step, run_step_function
from django_leases.workflows.registry import check_priority, get_workflow, step_options
from django_leases.workflows.values import (
    STEP_FAILED,
    WORKFLOW_ERROR,
    WORKFLOW_NOT_FOUND,
    Claim,
    NextStep,
    PassClaim,
    PassState,
    RunStatus,
    StepStatus,
    WaitKind,
    WaitStatus,
    claimant_name,
    run_lease_key,
)

if TYPE_CHECKING:
    from django_leases.models.wait import WorkflowWait
    from django_leases.models.workflow import WorkflowStep

logger = logging.getLogger("django_leases.workflows")


#: Seconds after which a pass that found the run lease taken is tried again.
PASS_RETRY_DELAY = 1.0


def run_lease_ttl() -> float:
    """TTL (seconds) of the run lease, and how long a picked pass waits before it is re-picked
    should its worker die: ``DJANGO_LEASES["DEFAULT_TTL"]``."""
    return float(leases_settings.DEFAULT_TTL)


# -- one pass -----------------------------------------------------------------------------------


def _placed(function_name: str, priority: int | None, queue: str | None = None) -> tuple[str, int]:
    """A new step's ``(queue, priority)``: its step function's declaration, ``priority`` and
    ``queue`` (when given) overriding it."""
    options = step_options(function_name)
    return (
        options.queue if queue is None else queue,
        options.priority if priority is None else priority,
    )


class _PassEnded(BaseException):
    """Ends an orchestration pass at the first step that has not succeeded yet.

    A ``BaseException`` so a workflow's ``except Exception:`` cannot swallow it.
    """


class _Pass:
    """One replay of a run: what it read, and the step it scheduled (and claimed)."""

    def __init__(
        self,
        state: PassState,
        using: str,
        claim_ttl: float | None,
        *,
        dry: bool = False,
        queues: Sequence[str] = (),
        keep_read: bool = False,
    ) -> None:
        self.run = state.run
        #: The queues the caller takes steps of (empty: every queue).
        self.queues = tuple(queues)
        self.steps = state.steps
        self.using = using
        #: Seconds of the step lease a scheduled step is claimed under (``None``: not claimed).
        self.claim_ttl = claim_ttl
        #: A dry pass writes nothing: it ends at the first step not succeeded yet.
        self.dry = dry
        self.seen: set[str] = set()
        #: When the wait this pass ended at needs the next pass (database clock).
        self.next_due: datetime | None = None
        #: How many steps of the ``run.parallel`` this pass ended at are not finished: only
        #: the result of the last of them asks for the next pass.
        self.branches = 0
        self._waits: dict[str, WorkflowWait] | None = None
        #: The step this pass scheduled and claimed for its driver, if any.
        self.claim: Claim | None = None
        #: Whether that claim also ended the pass.
        self.pass_finished = False
        #: The step a dry pass ended at, not created yet: what the workflow asks for next.
        self.wanted: NextStep | None = None
        #: The input and the steps' results and errors as this pass read them (JSON text),
        #: for a dry pass after its step (the workflow may change what it was given in place):
        #: kept when the pass may claim a step, or with ``keep_read``.
        self.read: str | None = None
        if claim_ttl is not None or keep_read:
            self.read = json.dumps(
                [self.run.input, {name: [s.result, s.error] for name, s in self.steps.items()}]
            )

    def see(self, name: str) -> None:
        """Note that the workflow used step or wait ``name`` in this pass (``ValueError``
        the second time: names are how a replay finds what it recorded)."""
        if name in self.seen:
            raise ValueError(f"Step or wait name {name!r} is used twice in run {self.run.id}")
        self.seen.add(name)

    def waits(self) -> dict[str, WorkflowWait]:
        """The run's waits by name, read once per pass, on the first wait it reaches."""
        from django_leases.models.wait import WorkflowWait

        if self._waits is None:
            self._waits = WorkflowWait.objects.db_manager(self.using).for_pass(self.run.id)
        return self._waits

    def reach(self, name: str, kind: str, seconds: float | None = None) -> WorkflowWait:
        """The wait ``name`` as recorded, recorded now if this is the first pass to reach it.
        A dry pass ends at any wait (the ordinary pass that follows decides it for real)."""
        from django_leases.models.wait import WorkflowWait

        self.see(name)
        if self.dry:
            raise _PassEnded
        waits = self.waits()
        wait = waits.get(name)
        if wait is None or wait.kind != kind or wait.reached_at is None:
            store = WorkflowWait.objects.db_manager(self.using)
            wait = waits[name] = store.reach(self.run.id, name, kind, seconds=seconds)
        return wait

    def wait_until(self, due_at: datetime | None) -> NoReturn:
        """End the pass at a wait; the run's next pass is due at ``due_at`` (``None``: only
        when something asks for one — an event sent, a child finished)."""
        self.next_due = due_at
        raise _PassEnded

    def sleep(self, name: str, seconds: float) -> None:
        from django_leases.models.wait import WorkflowWait

        wait = self.reach(name, WaitKind.SLEEP, seconds)
        if wait.status == WaitStatus.WAITING and wait.is_over():
            wait = WorkflowWait.objects.db_manager(self.using).settle(wait)
        if wait.status != WaitStatus.DONE:
            self.wait_until(wait.due_at)

    def wait_for_event(self, name: str, timeout: float | None) -> Any:
        from django_leases.models.wait import WorkflowWait

        wait = self.reach(name, WaitKind.EVENT, timeout)
        if wait.status == WaitStatus.WAITING and wait.is_over():
            wait = WorkflowWait.objects.db_manager(self.using).settle(wait)
        if wait.status == WaitStatus.DONE:
            return wait.payload
        if wait.status == WaitStatus.TIMED_OUT:
            raise WorkflowEventTimeout(name, timeout)
        self.wait_until(wait.due_at)

    def parallel(
        self,
        calls: list[tuple[str, str, Any]],
        retries: int,
        retry_delay: float,
        priority: int | None = None,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
    ) -> list[Any]:
        from django_leases.models.workflow import WorkflowStep

        for step_name, _, _ in calls:
            self.see(step_name)
        missing = [call for call in calls if call[0] not in self.steps]
        if missing:
            if self.dry:
                raise _PassEnded
            store = WorkflowStep.objects.db_manager(self.using)
            placement = {name: _placed(function, priority) for name, function, _ in missing}
            self.steps.update(
                store.schedule_many(
                    self.run.id,
                    missing,
                    retries=retries,
                    retry_delay=retry_delay,
                    retry_backoff=retry_backoff,
                    retry_delay_max=retry_delay_max,
                    placement=placement,
                )
            )
        results = []
        unfinished = 0
        for step_name, function_name, _ in calls:
            step = self.steps[step_name]
            if step.function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} was recorded with step function "
                    f"{step.function_name!r}; the workflow now asks for {function_name!r}"
                )
            if step.status == StepStatus.SUCCEEDED:
                results.append(step.result)
            elif step.status == StepStatus.FAILED and step.attempt >= step.retries + 1:
                raise WorkflowStepFailedError(step_name, step.error)
            else:
                unfinished += 1  # pending, scheduled, running, or failed with attempts left
        if unfinished:
            self.branches = unfinished
            raise _PassEnded
        return results

    def child(self, name: str, workflow: str, input: Any) -> Any:
        from django_leases.models.wait import WorkflowWait

        self.see(name)
        if self.dry:
            raise _PassEnded
        waits = self.waits()
        wait = waits.get(name)
        store = WorkflowWait.objects.db_manager(self.using)
        if wait is None or wait.kind != WaitKind.CHILD or wait.child_id is None:
            get_workflow(workflow)  # UnknownWorkflowError fails this run, starting nothing
            wait = waits[name] = store.start_child(self.run.id, name, workflow, input)
        elif wait.child is not None and wait.child.workflow != workflow:
            wait = store.start_child(self.run.id, name, workflow, input)  # raises ValueError
        child = wait.child
        if child is None:  # pruned from under its parent
            raise WorkflowChildFailedError(name, None, "missing", "the child run was deleted")
        if child.status == RunStatus.COMPLETED:
            if wait.status == WaitStatus.WAITING:
                store.settle_child(wait)
            return child.output
        if child.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            if wait.status == WaitStatus.WAITING:
                store.settle_child(wait)
            raise WorkflowChildFailedError(name, child.pk, child.status, child.error)
        self.wait_until(None)  # the child's end asks for the next pass

    def step(
        self,
        step_name: str,
        function_name: str,
        data: Any,
        retries: int,
        retry_delay: float,
        timeout: float | None = None,
        priority: int | None = None,
        queue: str | None = None,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
    ) -> Any:
        from django_leases.models.workflow import WorkflowStep

        self.see(step_name)
        step = self.steps.get(step_name)
        if step is None:
            queue, placed_priority = _placed(function_name, priority, queue)
            if self.dry:
                self.wanted = NextStep(
                    step_name,
                    function_name,
                    data,
                    retries,
                    retry_delay,
                    timeout,
                    queue,
                    placed_priority,
                    retry_backoff,
                    retry_delay_max,
                )
                raise _PassEnded
            store = WorkflowStep.objects.db_manager(self.using)
            args = (self.run.id, step_name, function_name, data)
            if self.claim_ttl is None:
                step = store.schedule(
                    *args,
                    retries=retries,
                    retry_delay=retry_delay,
                    retry_backoff=retry_backoff,
                    retry_delay_max=retry_delay_max,
                    timeout=timeout,
                    queue=queue,
                    priority=placed_priority,
                )
            else:
                scheduled = store.schedule_claimed(
                    *args,
                    retries=retries,
                    retry_delay=retry_delay,
                    retry_backoff=retry_backoff,
                    retry_delay_max=retry_delay_max,
                    timeout=timeout,
                    lease_ttl_seconds=self.claim_ttl,
                    finish_pass=self.run.pass_requests,
                    queue=queue,
                    priority=placed_priority,
                    queues=self.queues,
                )
                step, self.claim = scheduled.step, scheduled.claim
                self.pass_finished = scheduled.pass_finished
            self.steps[step_name] = step
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


class RunContext:
    """What a ``@workflow`` function gets as ``run``.

    Attributes:
        id: the run id (``uuid.UUID``).
        workflow: the workflow name.
        input: the run's JSON input (also passed as the second argument).
    """

    def __init__(self, replay: _Pass) -> None:
        self.id: uuid.UUID = replay.run.id
        self.workflow: str = replay.run.workflow
        self.input: Any = replay.run.input
        self._pass = replay

    def step(
        self,
        step_name: str,
        function_name: str,
        data: Any = None,
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Any:
        """Run step ``step_name`` with step function ``function_name`` on JSON ``data``.

        Returns the step's recorded result once it succeeded. Otherwise the step is created
        (on the first pass that reaches it) and the pass ends here; a worker runs it and the
        run is replayed once it finishes. ``retries`` (int, 0 to 1000) allows ``retries + 1``
        attempts. After attempt *n* fails, the next is due ``min(retry_delay *
        retry_backoff ** (n - 1), retry_delay_max)`` seconds later on the database clock:
        ``retry_delay`` in seconds (float, 0 to 86 400), ``retry_backoff`` a factor (float
        ≥ 1; 1.0: every delay is ``retry_delay``), ``retry_delay_max`` in seconds (float, 0 to
        86 400; ``None``: one day). No jitter: the delays are the same on every run. These
        are recorded with the step on first reach. ``timeout`` (seconds > 0; ``None``: none)
        bounds each attempt on the database clock: one running longer is failed with code
        ``STEP_TIMED_OUT`` (and retried if attempts remain) by the next worker that looks
        for due work; whatever it returns later is refused by the attempt fence. The
        ``timeout`` is recorded with the step on first reach. ``priority`` (``int``; ``None``:
        the step function's declared default, else 0) orders due steps: higher is claimed
        first, first due first within a priority. The step is claimed from ``queue``
        (``None``: its step function's), under that queue's limits.

        Raises:
            WorkflowStepFailedError: the step failed on its last attempt.
            ValueError: bad arguments, a step name used twice in one run, or a step recorded
                with another step function (the workflow changed under a running run).
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        retries, retry_delay = check_retries(retries, retry_delay)
        retry_backoff, retry_delay_max = check_backoff(retry_backoff, retry_delay_max)
        check_json(data, f"Data of step {step_name!r}")
        if timeout is not None:
            timeout = seconds(timeout, "Step timeout", above_minimum=True)
        if priority is not None:
            priority = check_priority(priority, "Step priority")
        if queue is not None:
            queue = check_name(queue, "A queue name", max_length=MAX_QUEUE_LENGTH)
        return self._pass.step(
            step_name,
            function_name,
            data,
            retries,
            retry_delay,
            timeout,
            priority,
            queue,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
        )

    def parallel(
        self,
        calls: Sequence[tuple[str, str, Any]],
        *,
        retries: int = 5,
        retry_delay: float = 0.0,
        retry_backoff: float = 1.0,
        retry_delay_max: float | None = None,
        priority: int | None = None,
    ) -> list[Any]:
        """Run several steps at once: ``calls`` is a sequence of ``(step_name, function_name,
        data)``; returns their results, in the order of ``calls``.

        The first pass that reaches it schedules every step of ``calls`` not recorded yet in
        one write (any number: 1,000 steps are one insert); any workers claim and run them
        concurrently, each under its own lease and attempt fence like any step. The pass
        ends here until all have finished. ``retries``, ``retry_delay`` (seconds),
        ``retry_backoff`` (a factor ≥ 1) and ``retry_delay_max`` (seconds or ``None``) apply
        to each step, as for :meth:`step`, and so do ``priority`` and each step function's
        queue.

        Raises:
            WorkflowStepFailedError: a step failed on its last attempt (the first in the
                order of ``calls``), as soon as a pass sees it.
            ValueError: bad arguments, a name used twice, or a step recorded with another
                step function.
        """
        checked = []
        for index, call in enumerate(calls):
            if not isinstance(call, tuple | list) or len(call) != 3:
                raise ValueError(
                    f"run.parallel: call {index} must be (step_name, function_name, data), "
                    f"not {call!r}"
                )
            step_name, function_name, data = call
            check_identifier(step_name, "Step name")
            check_identifier(function_name, "Step function name")
            check_json(data, f"Data of step {step_name!r}")
            checked.append((step_name, function_name, data))
        retries, retry_delay = check_retries(retries, retry_delay)
        retry_backoff, retry_delay_max = check_backoff(retry_backoff, retry_delay_max)
        if priority is not None:
            priority = check_priority(priority, "Step priority")
        return self._pass.parallel(
            checked,
            retries,
            retry_delay,
            priority,
            retry_backoff=retry_backoff,
            retry_delay_max=retry_delay_max,
        )

    def child(self, name: str, workflow: str, input: Any = None) -> Any:
        """Start a child run of ``workflow`` with JSON ``input`` (on the first pass that
        reaches wait ``name``) and return its output once it completed.

        The child is an ordinary run (``parent`` is this run; it has its own passes, steps
        and waits, on any workers); the pass ends here until it finishes, and its end asks
        this run for a pass. Cancelling this run cancels the child (and its children).

        Raises:
            WorkflowChildFailedError: the child failed or was cancelled (catchable).
            UnknownWorkflowError: no workflow ``workflow`` is registered (nothing started).
            ValueError: bad arguments, a name used twice, a name recorded as another kind of
                wait, or a child recorded as a run of another workflow.
        """
        check_identifier(name, "Wait name")
        check_identifier(workflow, "Workflow name")
        check_json(input, f"Input of child run {name!r}")
        return self._pass.child(name, workflow, input)

    def sleep(self, name: str, seconds: float | timedelta) -> None:
        """A durable timer: the run sleeps ``seconds`` (a number ≥ 0 or a ``timedelta``)
        from the first pass that reaches wait ``name``, on the database clock.

        The end is recorded then (database now + ``seconds``) and never recomputed on
        replay; the pass ends here and the run's next pass is due at that time. No worker
        thread sleeps, and a long sleep costs one row. Returns ``None`` once the time has
        passed.

        Raises:
            ValueError: a bad name, negative or non-finite seconds, a name used twice in
                one run, or a name recorded as another kind of wait.
        """
        check_identifier(name, "Wait name")
        delay = wait_seconds(seconds, f"Seconds of sleep {name!r}")
        self._pass.sleep(name, delay)

    def wait_for_event(self, name: str, *, timeout: float | timedelta | None = None) -> Any:
        """Wait for event ``name`` (sent with ``send_event(run_id, name, payload)``, the
        ``workflow_runs send-event`` command, the admin, or a ``SendEvent`` webhook
        handler); returns its JSON payload.

        An event sent before the run got here was kept and is returned at once. Otherwise
        the pass ends here; the event's arrival asks for the next pass. ``timeout`` (seconds
        ≥ 0 or a ``timedelta``; ``None``: wait for ever) is counted from the first pass
        that reaches the wait, on the database clock.

        Raises:
            WorkflowEventTimeout: ``timeout`` passed first (catchable; every later replay
                raises it again: the outcome is recorded).
            ValueError: a bad name or timeout, a name used twice in one run, or a name
                recorded as another kind of wait.
        """
        check_identifier(name, "Event name")
        limit = None if timeout is None else wait_seconds(timeout, f"Timeout of event {name!r}")
        return self._pass.wait_for_event(name, limit)


@dataclass(frozen=True)
class Replayed:
    """What one pass came to: ``outcome`` (``"waiting"``, ``"completed"``, ``"failed"``,
    ``"suspended"``, ``"not-running"``) and the pass itself (``None`` where no replay ran),
    whose ``claim`` is the step it claimed for its driver."""

    outcome: str
    replay: _Pass | None = None

    @property
    def claim(self) -> Claim | None:
        """The step claimed by the replayed pass (a :class:`Claim`), or ``None``."""
        return None if self.replay is None else self.replay.claim


def replay(
    run_id: uuid.UUID | str,
    using: str,
    state: PassState | None,
    claim_ttl: float | None,
    queues: Sequence[str] = (),
) -> Replayed:
    """One pass of the run (the caller holds the run lease): replay its workflow from the
    start on ``state`` (the run and its steps as just read; ``None``: read them here). With
    ``claim_ttl`` (seconds), a step the pass schedules is claimed for the caller — only if
    it is of one of ``queues`` (empty: every queue) and its queue admits it."""
    from django_leases.models.workflow import WorkflowRun

    runs = WorkflowRun.objects.db_manager(using)
    if state is None:
        state = runs.pass_state(run_id)
    if state is None or state.run.status != RunStatus.RUNNING:
        return Replayed("not-running")
    run = state.run
    try:
        func = get_workflow(run.workflow)
    except UnknownWorkflowError as exc:
        logger.error("Run %s suspended: %s", run_id, exc)
        runs.suspend(run_id, {"code": WORKFLOW_NOT_FOUND, "message": str(exc)})
        return Replayed("suspended")
    this = _Pass(state, using, claim_ttl, queues=queues)
    try:
        output = func(RunContext(this), run.input)
    except _PassEnded:
        if not this.pass_finished:
            runs.finish_pass(run_id, run.pass_requests, this.next_due, this.branches)
        return Replayed("waiting", this)
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
        return Replayed("failed", this)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit and the like from workflow code fail the run too
        error = error_json(exc)
        if "code" in error:  # the exception's own ``code`` (e.g. SystemExit's status)
            error["exception_code"] = error.pop("code")
        if not runs.fail(run_id, {"code": WORKFLOW_ERROR, **error}):
            # Cancelled (or otherwise ended) while this pass ran: what it raised — a
            # refused child start, say — is not the workflow failing.
            logger.info("Run %s: no longer running; its pass ended (%s)", run_id, exc)
            return Replayed("not-running", this)
        logger.warning("Run %s failed: its workflow raised", run_id, exc_info=exc)
        return Replayed("failed", this)
    # A non-JSON output fails the run (``complete`` says so); a run cancelled meanwhile is
    # not completed either: "failed", as before.
    try:
        check_json(output, "Workflow output")
    except ValueError:
        runs.complete(run_id, output)
        return Replayed("failed", this)
    return Replayed("completed" if runs.complete(run_id, output) else "failed", this)


_M = TypeVar("_M", bound=Model)


def _copied(instance: _M) -> _M:
    """A shallow copy of model ``instance`` for a pass in memory: its field values, in a
    new instance with a new ``ModelState`` (same database, not adding; no related objects
    cached). ``copy.copy`` of a model goes through pickling (``Model.__reduce__``), about
    five times the cost, and a dry pass copies every step of the run."""
    cls = type(instance)
    clone = cls.__new__(cls)
    values = dict(instance.__dict__)
    state = values["_state"] = ModelState()
    state.db, state.adding = instance._state.db, instance._state.adding
    clone.__dict__.update(values)
    return clone


@dataclass(frozen=True)
class DryPass:
    """What a dry pass came to (:func:`dry_replay`).

    Attributes:
        returned: the workflow returned JSON ``output``.
        output: that output (``None`` unless ``returned``).
        wanted: the step the workflow asked for next, not created yet
            (:class:`~values.NextStep`), when that ended the pass; ``None`` when it ended
            anywhere else (a parallel call, a wait, a child run, a step not succeeded) or
            raised.
    """

    returned: bool = False
    output: Any = None
    wanted: NextStep | None = None


def dry_replay(this: _Pass, step_name: str, result: Any) -> DryPass:
    """Replay the run of pass ``this`` in memory as if step ``step_name`` had just succeeded
    with ``result``, writing nothing: from what the pass read (``this.read``), with the result
    as the database will give it back (``stored_json``), so the workflow sees what a pass
    reading them would. Returns a :class:`DryPass`: the workflow's JSON output when it
    returns, the step it asks for next when that is a new ``run.step``; anything else (it
    raises, returns something not JSON, waits) the ordinary pass handles for real."""
    from django_leases.models.workflow import WorkflowStep

    if this.read is None:
        return DryPass()
    try:
        check_json(result, "Step result")
        func = get_workflow(this.run.workflow)
    except (ValueError, UnknownWorkflowError):
        return DryPass()
    input, read = json.loads(this.read)
    steps = {}
    for name, recorded in this.steps.items():
        step = steps[name] = _copied(recorded)
        if name in read:
            step.result, step.error = read[name]
    step = steps[step_name]
    step.status = StepStatus.SUCCEEDED
    step.result = WorkflowStep.objects.db_manager(this.using).stored_json(result)
    step.error = None
    run = _copied(this.run)
    run.input = input
    dry = _Pass(PassState(run, steps), this.using, None, dry=True)
    try:
        output = func(RunContext(dry), input)
        check_json(output, "Workflow output")
    except _PassEnded:
        return DryPass(wanted=dry.wanted)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return DryPass()
    return DryPass(returned=True, output=output)


def _after(this: _Pass, step_name: str, stored: Any, step: WorkflowStep, requests: int) -> _Pass:
    """The pass the driver holds once step ``step_name`` of pass ``this`` succeeded with the
    ``stored`` result and the write that recorded it created the next step ``step`` (claimed
    for the driver) and ended the pass at ``requests`` (``pass_requests``): what a pass
    reading the run then would read, with its ``read`` for the next step's dry pass."""
    input, read = json.loads(this.read or "[null, {}]")
    read[step_name] = [stored, None]
    # Pass ``this`` is over: the steps it did not change are the next pass's as they are
    # (a pass never changes a step instance it read; a dry pass reads its own copies).
    steps = dict(this.steps)
    done = steps[step_name] = _copied(steps[step_name])
    done.status, done.result, done.error = StepStatus.SUCCEEDED, stored, None
    steps[step.step_name] = step
    run = _copied(this.run)
    run.pass_requests = requests
    after = _Pass(PassState(run, steps), this.using, None, queues=this.queues)
    after.read = json.dumps([input, read])
    return after


# -- the driver ---------------------------------------------------------------------------------


class RunDriver:
    """Drives one run on the calling thread under one hold of its run lease: its pass, the
    step that pass schedules, the next pass, and so on.

    Args:
        run_id: the run (``uuid.UUID`` or its text).
        using: database alias (default: the router's choice for ``WorkflowRun``).
        step_lease_ttl: seconds of the step lease a step this driver schedules is claimed
            under, for this thread to run at once; ``None``: steps are scheduled for the
            queue and the drive ends after one pass.
        keep_going: while it answers true, steps are claimed and run here; once false (the
            worker is stopping) no step is claimed and the next pass goes to the queue.
        picked: the pass claim that picked the run (its state spares the first pass a read;
            its run lease is held from there). ``None``: the lease is acquired here.
        chain: a completion also picks the next due run with its lease, for the caller to
            drive next (:attr:`next_pass`).
        queues: the queues whose steps this thread may claim (a worker's ``--queue``
            names; empty: every queue). A step of another queue is scheduled for its workers.

    Should this thread die, nothing is lost: the step's lease lapses and the held pass becomes
    due again, and other workers take them over by the ordinary rules.
    """

    def __init__(
        self,
        run_id: uuid.UUID | str,
        *,
        using: str | None = None,
        step_lease_ttl: float | None = None,
        keep_going: Callable[[], bool] = lambda: True,
        picked: PassClaim | None = None,
        chain: bool = False,
        queues: Sequence[str] = (),
    ) -> None:
        from django_leases.models.workflow import WorkflowRun

        self.run_id = run_id
        self.queues = tuple(queues)
        self.alias = using or router.db_for_write(WorkflowRun)
        self.step_lease_ttl = step_lease_ttl
        self.keep_going = keep_going
        self.picked = picked
        self.chain = chain
        self.lease_ttl = run_lease_ttl()
        #: The next due run a completion picked with its lease (with ``chain``).
        self.next_pass: PassClaim | None = None
        self._state = None if picked is None else picked.state
        self._completion_sent = False
        #: The next step a result's write created and claimed for this thread, and the pass
        #: it runs under: run next, without a pass of its own (:meth:`_claim_next`).
        self._chained: tuple[_Pass, Claim] | None = None

    def drive(self) -> str:
        """Drive the run until it waits, ends, or the worker stops. Returns the last pass's
        outcome (``"waiting"``, ``"completed"``, ``"failed"``, ``"suspended"``,
        ``"not-running"``), the step's when that ended the drive (``"suspended"``,
        ``"superseded"``), or ``"lease-taken"`` when the run lease was taken or lost (another
        pass is then asked for about a second later; the run never fails for it)."""
        key = run_lease_key(self.run_id)
        picked = self.picked
        holder = None if picked is None or picked.lease is None else picked.lease.holder
        held = HeldLease(
            key, self.lease_ttl, holder=holder, using=self.alias, deferred_renewal=True
        )
        try:
            if picked is not None and picked.lease_refused:
                raise LeaseTakenError(key)
            if picked is not None and picked.lease is not None:
                held.adopt(picked.lease, picked.sent)
            else:
                held.acquire()
            try:
                outcome = self._passes(held)
            except BaseException:
                held.finish(vouch=False)
                raise
            held.finish(vouch=True)
            return outcome
        except (LeaseTakenError, LeaseLostError) as exc:
            return self._pass_later(exc)

    def _passes(self, held: HeldLease) -> str:

        while True:
            try:
                held.check()
            except LeaseLostError:
                # A step the last write claimed is this thread's by its own step lease (its
                # result is fenced to its attempt): it is run, and its result written for any
                # worker's pass, rather than left to lapse (which would spend an attempt).
                if self._chained is not None:
                    (_, claim), self._chained = self._chained, None
                    record_step(run_step_function(claim))
                raise
            if self._chained is not None:
                (this, claim), self._chained = self._chained, None
            else:
                claim_ttl = self.step_lease_ttl if self.keep_going() else None
                attributes = {"workflow.run_id": self.run_id}
                with tracing.span("django_leases.pass", **attributes) as span:
                    replayed = replay(self.run_id, self.alias, self._state, claim_ttl, self.queues)
                    span.set("workflow.outcome", replayed.outcome)
                    if replayed.replay is not None:
                        span.set("workflow.name", replayed.replay.run.workflow)
                self._state = None
                found = replayed.claim
                if found is None or replayed.replay is None:
                    return replayed.outcome
                this, claim = replayed.replay, found
            logger.info(
                "Run %s: step %r attempt %d claimed", claim.run_id, claim.step_name, claim.attempt
            )
            ended = self._record(this, run_step_function(claim), held)
            if ended is not None:
                return ended

    def _record(self, this: _Pass, ran: StepRun, held: HeldLease) -> str | None:
        """Write what came of the step ``ran`` (claimed for this driver, or by its worker) as
        the holder of the run lease: with the run's completion when a dry pass shows the
        workflow returns, else taking the run's next pass for this thread. Returns how the
        drive ends, or ``None`` to go on with the next pass (its state in ``_state``)."""
        from django_leases.models.workflow import WorkflowRun

        claim = ran.claim
        recorded = record_step(
            ran,
            hold_pass_seconds=self.lease_ttl,
            complete=functools.partial(self._complete, this, claim, held),
        )
        logger.info(
            "Run %s: step %r attempt %d %s",
            claim.run_id,
            claim.step_name,
            claim.attempt,
            recorded.outcome,
        )
        if recorded.run_outcome is not None:  # the result completed the run with it
            return recorded.run_outcome
        if self._chained is not None:  # the write claimed the next step for this thread
            return None
        if recorded.outcome not in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            return recorded.outcome
        if not recorded.pass_requested:  # not the last of its parallel siblings
            return "waiting"
        if not self.keep_going():
            # Stopping: the pass the result took for this thread goes to the queue.
            WorkflowRun.objects.db_manager(self.alias).request_pass(self.run_id)
            return "waiting"
        self._state = recorded.state
        return None

    def drive_from(self, ran: StepRun) -> str:
        """Record the outcome of step ``ran``, which a worker claimed from the queue and ran
        on this thread, and drive its run on from there: the result and the run's completion
        in one write when the workflow returns with it (no pass follows), else the next pass
        here. The driver's ``picked`` is :meth:`WorkflowRunQuerySet.take_pass`'s claim,
        taken once the step ran; without its lease (the run lease was refused, or the run is
        not running) the outcome is written the ordinary way, the pass due for any worker.
        Returns what :meth:`drive` returns, or the step's outcome when written the ordinary
        way."""
        picked = self.picked
        if picked is None or picked.lease is None:
            return record_step(ran).outcome
        key = run_lease_key(self.run_id)
        held = HeldLease(
            key,
            self.lease_ttl,
            holder=picked.lease.holder,
            using=self.alias,
            deferred_renewal=True,
        )
        self._state = None
        try:
            held.adopt(picked.lease, picked.sent)
            try:
                this = _Pass(picked.state, self.alias, None, keep_read=True)
                outcome = self._record(this, ran, held)
                if outcome is None:
                    outcome = self._passes(held)
            except BaseException:
                held.finish(vouch=False)
                raise
            held.finish(vouch=True)
            return outcome
        except (LeaseTakenError, LeaseLostError) as exc:
            return self._pass_later(exc)

    def _complete(
        self, this: _Pass, claim: Claim, held: HeldLease, result: Any
    ) -> StepRecorded | None:
        """The result and the run's completion in one write, when a dry pass with the result
        shows the workflow returns; the result and the next step when it asks for a new one
        (:meth:`_claim_next`); ``None`` sends the result the ordinary way."""
        from django_leases.models.workflow import WorkflowStep

        self._chained = None
        dry = dry_replay(this, claim.step_name, result)
        if dry.wanted is not None:
            return self._claim_next(this, claim, held, result, dry.wanted)
        if not dry.returned:
            return None
        output = dry.output
        # A retry (the first try's reply was lost: it may have committed, picking a run
        # nobody would drive) picks nothing: that run is picked again once its lease lapses.
        want_next = self.chain and self.keep_going() and not self._completion_sent
        self._completion_sent = True
        done = WorkflowStep.objects.db_manager(claim.using).set_result_completing_run(
            claim.step_id,
            result,
            claim.attempt,
            output=output,
            lease=held.lease,
            next_pass_holder=new_holder() if want_next else None,
            next_pass_ttl=self.lease_ttl,
        )
        if done.next_pass is not None:
            self.next_pass = done.next_pass
        if not done.written:
            return None
        if done.lease_live is not None:
            held.released_elsewhere(done.lease_live)
        # A run no longer running was not completed: "failed", as a pass would say.
        return StepRecorded(
            StepStatus.SUCCEEDED, run_outcome="completed" if done.completed else "failed"
        )

    def _claim_next(
        self, this: _Pass, claim: Claim, held: HeldLease, result: Any, wanted: NextStep
    ) -> StepRecorded | None:
        """The result, and the step the workflow asks for next (``wanted``, as a dry pass with
        the result found) created and claimed for this thread, in one write: the pass the
        result asks for is the dry pass, run already. The claimed step and the pass it runs
        under go to :attr:`_chained`. ``None`` sends the result the ordinary way (the worker
        is stopping, or this driver claims no steps, or the step is not valid: the ordinary
        pass fails the run for it)."""
        from django_leases.models.workflow import WorkflowStep

        if self.step_lease_ttl is None or not self.keep_going():
            return None
        store = WorkflowStep.objects.db_manager(claim.using)
        lease = held.lease
        claimant = claimant_name(lease.holder, lease.token, claim.step_id, claim.attempt)
        try:
            done = store.set_result_claiming_next(
                claim.step_id,
                result,
                claim.attempt,
                next_step=wanted,
                finish_pass=this.run.pass_requests,
                lease_ttl_seconds=self.step_lease_ttl,
                hold_pass_seconds=self.lease_ttl,
                queues=self.queues,
                claimant=claimant,
            )
        except ValueError:
            return None
        write, scheduled, requests = done.write, done.next, done.pass_requests
        if scheduled is None and not write.written and held.acquired:
            # A repeat: the first try committed (its reply was lost). The step it created is
            # this thread's still if that write claimed it (its claim names ``claimant``),
            # as long as the run lease is.
            scheduled = store.reclaim_created(
                claim.run_id,
                wanted.step_name,
                lease=lease,
                lease_ttl_seconds=self.step_lease_ttl,
                claimant=claimant,
            )
        if scheduled is None:
            # No step created: the pass (taken for this thread when the run asked) runs for real.
            return StepRecorded(write.status, write.state, pass_requested=write.pass_requested)
        if scheduled.claim is not None:
            stored = store.stored_json(result)
            ended_at = -1 if requests is None else requests
            after = _after(this, claim.step_name, stored, scheduled.step, ended_at)
            self._chained = (after, scheduled.claim)
        # Not claimed here (another queue's, or its queue at its limit): its workers run it.
        return StepRecorded(write.status, pass_requested=scheduled.claim is not None)

    def _pass_later(self, exc: LeaseTakenError | LeaseLostError) -> str:
        """The run lease was taken, or lost: ask for another pass :data:`PASS_RETRY_DELAY`
        seconds later (never failing the run); returns ``"lease-taken"``."""
        from django_leases.models.workflow import WorkflowRun

        if isinstance(exc, LeaseTakenError):
            logger.info(
                "Run %s: its lease is taken; another pass in %.0f s", self.run_id, PASS_RETRY_DELAY
            )
        else:
            logger.warning("Run %s: its lease was lost; another pass follows", self.run_id)
        WorkflowRun.objects.db_manager(self.alias).request_pass(self.run_id, PASS_RETRY_DELAY)
        return "lease-taken"


def record_alone(
    ran: StepRun,
    output_of: Callable[[Any, Any], Any],
    *,
    chain: bool = False,
    next_step: tuple[float, Sequence[str] | None] | None = None,
) -> tuple[StepRecorded, PassClaim | Claim | None]:
    """Record the outcome of step ``ran`` — a result of the only step of its run, whose
    workflow then returns ``output_of(run_id, result)`` (:func:`~django_leases.workflows.
    registry.one_step_workflow`: a task's) — with the run's completion in one write that
    takes the run lease only for that instant: no pass, no replay. Where that write does not
    land (the fence refused it, or the result or output is not JSON) the outcome goes the
    ordinary way (:func:`record_step`); where a pass holds the run lease, the result is
    written and the run's pass asked for. ``chain``: the completion also picks the next due
    run with its lease; ``next_step`` (``(step lease TTL in seconds, queues or None)``,
    instead): it claims the next due step of those queues (neither when it is tried again
    after a lost reply). Returns what :func:`record_step` returns, and the picked run's pass
    claim or the claimed step (or ``None``)."""
    from django_leases.models.workflow import WorkflowStep

    claim = ran.claim
    picked: list[PassClaim | Claim] = []
    tries = 0

    def complete(result: Any) -> StepRecorded | None:
        nonlocal tries
        tries += 1
        try:
            output = output_of(claim.run_id, result)
            done = WorkflowStep.objects.db_manager(claim.using).set_result_completing_run(
                claim.step_id,
                result,
                claim.attempt,
                output=output,
                lease=None,
                lease_holder=new_holder(),
                next_pass_holder=new_holder() if chain and tries == 1 else None,
                next_pass_ttl=run_lease_ttl(),
                next_step_ttl=next_step[0] if next_step and tries == 1 else None,
                next_step_queues=next_step[1] if next_step else None,
            )
        except ValueError:  # not JSON: the ordinary write says so
            return None
        if done.next_pass is not None:
            picked.append(done.next_pass)
        if done.next_step is not None:
            picked.append(done.next_step)
        if not done.written:
            return None
        if done.pass_asked:
            return StepRecorded(StepStatus.SUCCEEDED)
        # A run no longer running was not completed: "failed", as a pass would say.
        return StepRecorded(
            StepStatus.SUCCEEDED, run_outcome="completed" if done.completed else "failed"
        )

    recorded = record_step(ran, complete=complete)
    return recorded, (picked[0] if picked else None)


def run_pass(run_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Run one orchestration pass of run ``run_id`` under the run lease ``workflow-run:<id>``,
    scheduling the step it reaches for any worker (not running it here).

    Returns what happened: ``"waiting"`` (a step is not finished yet), ``"completed"``,
    ``"failed"``, ``"suspended"`` (the workflow is not registered here: code
    ``WORKFLOW_NOT_FOUND``), ``"not-running"`` or ``"lease-taken"`` (the run lease was taken
    or lost: another pass follows about a second later; the run never fails for it).
    """
    return RunDriver(run_id, using=using).drive()


__all__ = [
    "PASS_RETRY_DELAY",
    "Replayed",
    "RunContext",
    "RunDriver",
    "dry_replay",
    "record_alone",
    "replay",
    "run_lease_ttl",
    "run_pass",
]
