"""A replay check for deploys (DESIGN §5c): does every live run replay on the code now
deployed? ``manage.py workflow_runs check-replay`` runs :func:`check_replay`.

Each live run (``running`` — a sleeping or waiting one too — and ``suspended``), and each
``failed`` one (an operator's resume replays it on the code then deployed), is replayed
**in memory** against the registered workflow functions, as a pass would replay it, with
what the run recorded: a succeeded step returns its recorded result, a finished wait its
outcome, a patch its recorded answer. Nothing is written, no lease is taken and no step
function runs, so the check may run while workers work (a run whose lease a worker holds
is read like any other).

A run **replays** when its workflow meets the actions it recorded, in the order it recorded
them, up to its frontier: the first action it has not finished (a step still running, a
wait still waiting) or the first one it never recorded once all it recorded was met (what
the next pass would do anyway; ``run.patched`` is answered there as a pass would answer it).

A run **diverges** when the code meets an action other than the one the run recorded next:

* a step, wait or child run it never recorded while recorded ones remain unmet (a step
  inserted without ``run.patched``, renamed, or moved ahead of recorded ones);
* a recorded step met out of its recorded order among the run's steps (reordered), or a
  recorded wait out of order among its waits;
* the code reaches the action the run waits at while a step or wait it recorded before is
  left unmet (one removed);
* a step recorded with another step function, a name recorded as another kind of wait, a
  child recorded as a run of another workflow;
* the workflow returns or raises while recorded steps or waits remain unmet (one removed);
* the run's workflow is not registered at all.

Order is exact among a run's steps (their ids, one sequence, patch decisions included) and
among its waits (the database clock of their first reach); a step and a wait that swapped
places are met by name and not reported as such. Patch decisions never diverge: a patch
retired from the code is simply not asked about.

The reads are batched: for each batch of runs, one read of the runs, one of their steps and
one of their waits with their child runs (no read per run). Those are three statements, not
one snapshot: the runs of a batch that seem to diverge are read and replayed once more, and
reported only if they diverge again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import field
from datetime import datetime
from typing import Any

from django.db import router

from django_leases.exceptions import (
    UnknownWorkflowError,
    WorkflowChildFailedError,
    WorkflowEventTimeout,
    WorkflowStepFailedError,
)
from django_leases.frozen import frozen
from django_leases.models import WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.patches import LIVE_RUN_STATUSES
from django_leases.workflows.driver import RunContext
from django_leases.workflows.registry import get_workflow
from django_leases.workflows.values import (
    RunStatus,
    StepOptions,
    StepStatus,
    WaitKind,
    WaitStatus,
    exhausted,
)

logger = logging.getLogger("django_leases.workflows")

#: Runs read per batch (one read each of runs, steps and waits).
BATCH_SIZE = 1000


@frozen
class Action:
    """An action of a run, as recorded or as the code now meets it.

    Attributes:
        kind: ``"step"``, ``"parallel"``, ``"sleep"``, ``"event"`` (a ``wait_for_event``),
            ``"child"``, ``"return"`` (the workflow returns), ``"raise"`` (it raises) or
            ``"workflow"`` (the run's workflow itself).
        name: the step's or wait's name (a parallel's names joined by ``", "``; the
            workflow's name for ``"workflow"``; empty for ``"return"``).
        target: the step function of a step, the workflow of a child run, the exception of
            a ``"raise"``; ``None`` otherwise.
    """

    kind: str
    name: str = ""
    target: str | None = None

    def __str__(self) -> str:
        if self.kind == "step":
            return f"step {self.name!r} (step function {self.target!r})"
        if self.kind == "parallel":
            return f"parallel steps [{self.name}]"
        if self.kind == "sleep":
            return f"sleep {self.name!r}"
        if self.kind == "event":
            return f"wait_for_event {self.name!r}"
        if self.kind == "child":
            return f"child run {self.name!r} (workflow {self.target!r})"
        if self.kind == "return":
            return "the workflow returns"
        if self.kind == "raise":
            return f"the workflow raises {self.target}"
        if self.kind == "missing":
            return f"no code registers workflow {self.name!r}"
        return f"workflow {self.name!r}"

    def as_json(self) -> dict[str, Any]:
        """The action as JSON: ``kind``, ``name``, ``target`` and ``text`` (``str(self)``)."""
        return {"kind": self.kind, "name": self.name, "target": self.target, "text": str(self)}


@frozen
class Divergence:
    """A live run that would not replay on the code now deployed.

    Attributes:
        run_id: the run (``uuid.UUID``).
        workflow: its workflow's name.
        status: its status (``"running"`` or ``"suspended"``).
        recorded: the action the run recorded next (:class:`Action`).
        new: the action the code now meets instead (:class:`Action`).
    """

    run_id: uuid.UUID
    workflow: str
    status: str
    recorded: Action
    new: Action

    def __str__(self) -> str:
        return (
            f"Run {self.run_id} ({self.workflow}, {self.status}): recorded {self.recorded}; "
            f"the code now meets {self.new}"
        )

    def as_json(self) -> dict[str, Any]:
        """The divergence as JSON (``run_id`` as text, the actions as :meth:`Action.as_json`)."""
        return {
            "run_id": str(self.run_id),
            "workflow": self.workflow,
            "status": self.status,
            "recorded": self.recorded.as_json(),
            "new": self.new.as_json(),
        }


@frozen
class ReplayReport:
    """What :func:`check_replay` found.

    Attributes:
        checked: how many live runs were replayed.
        divergences: the runs that would not replay (:class:`Divergence`), by run id.
        seconds: how long the check took (wall clock, ``float``).
    """

    checked: int
    divergences: list[Divergence] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every live run replays."""
        return not self.divergences

    def summary(self) -> str:
        """One line: how many live runs were checked and how many would not replay."""
        if self.ok:
            return f"All {self.checked} live run(s) replay on the code now deployed."
        return (
            f"{len(self.divergences)} of {self.checked} live run(s) would not replay on the "
            "code now deployed."
        )

    def lines(self) -> list[str]:
        """The report as text: a line per divergence (run, recorded action, new action),
        then :meth:`summary`."""
        return [*(str(found) for found in self.divergences), self.summary()]

    def as_json(self) -> dict[str, Any]:
        """The report as JSON: ``ok``, ``checked``, ``diverged`` (a count), ``seconds`` and
        ``runs`` (each divergence's :meth:`Divergence.as_json`)."""
        return {
            "ok": self.ok,
            "checked": self.checked,
            "diverged": len(self.divergences),
            "seconds": round(self.seconds, 3),
            "runs": [found.as_json() for found in self.divergences],
        }


# -- the dry pass -------------------------------------------------------------------------------


class _Frontier(BaseException):
    """The replay reached the run's frontier: it replays. A ``BaseException``, so that a
    workflow's ``except Exception:`` cannot swallow it."""


class _Diverged(BaseException):
    """The code met ``new`` where the run recorded ``recorded``."""

    def __init__(self, recorded: Action, new: Action) -> None:
        super().__init__(recorded, new)
        self.recorded = recorded
        self.new = new


def _step_action(row: dict[str, Any]) -> Action:
    return Action("step", row["step_name"], row["function_name"])


def _wait_action(wait: WorkflowWait) -> Action:
    if wait.kind == WaitKind.CHILD:
        child = wait.child
        return Action("child", wait.name, None if child is None else child.workflow)
    return Action("event" if wait.kind == WaitKind.EVENT else "sleep", wait.name)


class _DryPass:
    """A pass that replays a run in memory from its records and writes nothing
    (:class:`~django_leases.workflows.driver.PassCalls`)."""

    def __init__(
        self, run: WorkflowRun, steps: list[dict[str, Any]], waits: list[WorkflowWait]
    ) -> None:
        self.run = run
        self.steps = {row["step_name"]: row for row in steps if row["status"] != StepStatus.PATCH}
        self.step_order: list[str] = [
            row["step_name"] for row in steps if row["status"] != StepStatus.PATCH
        ]
        self.markers = {
            row["step_name"]: bool(row["result"])
            for row in steps
            if row["status"] == StepStatus.PATCH
        }
        self.waits = {wait.name: wait for wait in waits}
        self.wait_order: list[str] = [wait.name for wait in waits]
        self.seen: set[str] = set()
        self.decided: dict[str, bool] = {}
        self._steps_met = 0
        self._waits_met = 0

    # -- what is left of the records ----------------------------------------------------------

    def _first_unseen(self, order: list[str], met: int) -> tuple[str | None, int]:
        """The first name of ``order`` from index ``met`` on not met yet (``None``: none),
        and the index it stands at (those before it were all met)."""
        while met < len(order):
            if order[met] not in self.seen:
                return order[met], met
            met += 1
        return None, met

    def _next_step(self) -> str | None:
        name, self._steps_met = self._first_unseen(self.step_order, self._steps_met)
        return name

    def _next_wait(self) -> str | None:
        name, self._waits_met = self._first_unseen(self.wait_order, self._waits_met)
        return name

    def unreplayed(self) -> Action | None:
        """The earliest recorded step or wait not met yet (``None``: all were met)."""
        step_name, wait_name = self._next_step(), self._next_wait()
        if wait_name is None:
            return None if step_name is None else _step_action(self.steps[step_name])
        wait = self.waits[wait_name]
        if step_name is None:
            return _wait_action(wait)
        row = self.steps[step_name]
        created: datetime = row["created_at"]
        if wait.reached_at is not None and wait.reached_at < created:
            return _wait_action(wait)
        return _step_action(row)

    def _new(self, action: Action) -> Any:
        """The code meets ``action``, which the run never recorded."""
        recorded = self.unreplayed()
        if recorded is None:
            raise _Frontier  # the next pass does this: nothing recorded is skipped
        raise _Diverged(recorded, action)

    def _stop_at(self, action: Action) -> Any:
        """The run waits at ``action`` (recorded, not finished): its frontier. Nothing else
        it recorded may be left unmet there (a sequential run records nothing after the
        action it waits at): a step the code no longer reaches was removed."""
        left = self.unreplayed()
        if left is not None:
            raise _Diverged(left, action)
        raise _Frontier

    def _see(self, name: str) -> None:
        # The engine's rules for names (a ValueError there fails the run; here it is what
        # the workflow raises).
        if name in self.seen:
            raise ValueError(f"Step or wait name {name!r} is used twice in run {self.run.id}")
        if name in self.markers or name in self.decided:
            raise ValueError(f"{name!r} is the name of a patch (run.patched)")
        self.seen.add(name)

    def _in_order(self, names: list[str], action: Action) -> None:
        """Recorded steps ``names`` must be the next ones the run recorded."""
        expected: list[str] = []
        at = self._steps_met
        while len(expected) < len(names) and at < len(self.step_order):
            name = self.step_order[at]
            if name not in self.seen:
                expected.append(name)
            at += 1
        if set(expected) != set(names):
            recorded = self.unreplayed()
            assert recorded is not None  # ``names`` are recorded and not met
            raise _Diverged(recorded, action)

    def _wait(self, name: str, kind: str, action: Action) -> WorkflowWait:
        wait = self.waits.get(name)
        if wait is None:
            self._new(action)
        assert wait is not None
        if wait.kind != kind:
            raise _Diverged(_wait_action(wait), action)
        if self._next_wait() != name:
            recorded = self.unreplayed()
            assert recorded is not None
            raise _Diverged(recorded, action)
        self._see(name)
        return wait

    # -- what the workflow calls ---------------------------------------------------------------

    def step(self, step_name: str, function_name: str, data: Any, options: StepOptions) -> Any:
        action = Action("step", step_name, function_name)
        row = self.steps.get(step_name)
        if row is None:
            if step_name in self.seen or step_name in self.markers or step_name in self.decided:
                self._see(step_name)  # raises, as the engine does
            return self._new(action)
        if row["function_name"] != function_name:
            raise _Diverged(_step_action(row), action)
        if self._next_step() != step_name:
            self._in_order([step_name], action)
        self._see(step_name)
        if row["status"] == StepStatus.SUCCEEDED:
            return row["result"]
        if row["status"] == StepStatus.FAILED and exhausted(row["attempt"], row["retries"]):
            raise WorkflowStepFailedError(row["step_name"], row["error"])
        return self._stop_at(action)

    def parallel(
        self, calls: list[tuple[str, str, Any]], options: StepOptions, priority: int | None
    ) -> list[Any]:
        names = [name for name, _, _ in calls]
        action = Action("parallel", ", ".join(repr(name) for name in names))
        recorded = [name for name in names if name in self.steps]
        if not recorded:
            for name in names:
                self._see(name)
            return self._new(action)  # type: ignore[no-any-return]
        if len(recorded) != len(names):
            raise _Diverged(Action("parallel", ", ".join(repr(name) for name in recorded)), action)
        for name, function_name, _ in calls:
            row = self.steps[name]
            if row["function_name"] != function_name:
                raise _Diverged(_step_action(row), Action("step", name, function_name))
        self._in_order(names, action)
        for name in names:
            self._see(name)
        results, unfinished = [], 0
        for name in names:
            row = self.steps[name]
            if row["status"] == StepStatus.SUCCEEDED:
                results.append(row["result"])
            elif row["status"] == StepStatus.FAILED and exhausted(row["attempt"], row["retries"]):
                raise WorkflowStepFailedError(name, row["error"])
            else:
                unfinished += 1
        if unfinished:
            self._stop_at(action)
        return results

    def child(self, name: str, workflow: str, input: Any, deadline: float | None = None) -> Any:
        # A deadline bounds a live run only: the dry replay has nothing to bound.
        action = Action("child", name, workflow)
        wait = self._wait(name, WaitKind.CHILD, action)
        child = wait.child
        if child is not None and child.workflow != workflow:
            raise _Diverged(_wait_action(wait), action)
        if child is None:
            raise WorkflowChildFailedError(name, None, "missing", "the child run was deleted")
        if child.status == RunStatus.COMPLETED:
            return child.output
        if child.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise WorkflowChildFailedError(name, child.pk, child.status, child.error)
        return self._stop_at(action)

    def sleep(self, name: str, seconds: float) -> None:
        action = Action("sleep", name)
        wait = self._wait(name, WaitKind.SLEEP, action)
        if wait.status != WaitStatus.DONE:
            self._stop_at(action)

    def wait_for_event(self, name: str, timeout: float | None) -> Any:
        action = Action("event", name)
        wait = self._wait(name, WaitKind.EVENT, action)
        if wait.status == WaitStatus.DONE:
            return wait.payload
        if wait.status == WaitStatus.TIMED_OUT:
            raise WorkflowEventTimeout(name, timeout)
        return self._stop_at(action)

    def patched(self, name: str) -> bool:
        if name in self.seen:
            raise ValueError(f"{name!r} is the name of a step or wait in run {self.run.id}")
        if name in self.markers:
            return self.markers[name]
        if name in self.steps:
            raise ValueError(f"{name!r} is the name of a step of run {self.run.id}")
        if name not in self.decided:
            self.decided[name] = self.unreplayed() is None
        return self.decided[name]


def replay_run(
    run: WorkflowRun, steps: list[dict[str, Any]], waits: list[WorkflowWait]
) -> Divergence | None:
    """Replay ``run`` in memory from its recorded ``steps`` (as
    :meth:`~django_leases.models.patches.StepPatches.for_replay` reads them) and reached
    ``waits`` (:meth:`~django_leases.models.wait.WorkflowWaitQuerySet.for_replay`) against
    the registered code; writes nothing. Returns ``None`` when it replays, else the
    :class:`Divergence`."""

    def diverged(recorded: Action, new: Action) -> Divergence:
        return Divergence(run.pk, run.workflow, run.status, recorded, new)

    try:
        func: Callable[..., Any] = get_workflow(run.workflow)
    except UnknownWorkflowError:
        return diverged(Action("workflow", run.workflow), Action("missing", run.workflow))
    dry = _DryPass(run, steps, waits)
    try:
        func(RunContext(dry), run.input)
    except _Frontier:
        return None
    except _Diverged as found:
        return diverged(found.recorded, found.new)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a pass fails the run on what code raises
        left = dry.unreplayed()
        if left is None:
            return None  # the next pass ends the run as the workflow says
        return diverged(left, Action("raise", target=f"{type(exc).__name__}: {exc}"[:200]))
    left = dry.unreplayed()
    return None if left is None else diverged(left, Action("return"))


#: The runs the check replays: the live ones, which a pass replays, and the failed ones,
#: which an operator's resume replays.
REPLAYED_STATUSES = (*LIVE_RUN_STATUSES, RunStatus.FAILED)


def check_replay(*, using: str | None = None, batch_size: int = BATCH_SIZE) -> ReplayReport:
    """Replay every live run (``running``, ``suspended``) and every ``failed`` one (a resume
    replays it) in memory against the workflow code now registered, writing nothing (see
    the module's docstring for what replays and what diverges).

    Args:
        using: database alias (default: the router's choice for ``WorkflowRun``).
        batch_size: runs read per batch (int ≥ 1): three reads per batch (runs, their
            steps, their waits with child runs), and three more for the runs of the batch
            that diverged (read again and replayed again: see the code's comment).

    Returns:
        A :class:`ReplayReport`: how many runs were checked and each run that diverges.

    Raises:
        ValueError: a bad ``batch_size``.
    """
    alias = using or router.db_for_write(WorkflowRun)
    started = time.monotonic()
    checked = 0
    found: list[Divergence] = []
    runs = WorkflowRun.objects.db_manager(alias)
    steps = WorkflowStep.objects.db_manager(alias)
    waits = WorkflowWait.objects.db_manager(alias)

    def replayed(batch: list[WorkflowRun]) -> list[Divergence]:
        ids = [run.pk for run in batch]
        steps_of = steps.for_replay(ids)
        waits_of = waits.for_replay(ids)
        diverged = (replay_run(run, steps_of[run.pk], waits_of[run.pk]) for run in batch)
        return [divergence for divergence in diverged if divergence is not None]

    for batch in runs.live_batches(batch_size, statuses=REPLAYED_STATUSES):
        checked += len(batch)
        first = replayed(batch)
        if first:
            # The three reads are three statements: a worker that recorded a step and a wait
            # between two of them can make a run look as if it diverged. Those runs are read
            # and replayed once more; a run diverges if it does again (a code change does,
            # every time) and is still live.
            again = runs.live_batches(
                batch_size, only=[found.run_id for found in first], statuses=REPLAYED_STATUSES
            )
            found += replayed(next(again, []))
    return ReplayReport(checked, found, time.monotonic() - started)


__all__ = [
    "BATCH_SIZE",
    "REPLAYED_STATUSES",
    "Action",
    "Divergence",
    "ReplayReport",
    "check_replay",
    "replay_run",
]
