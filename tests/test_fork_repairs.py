"""Forks as repairs (docs/howto/operators.md "Fork a run from a step"): a fork copies only the
outcomes the original's steps had for good — a step a cancel or a deadline stopped runs again —
and ``fork_from_failed`` (the admin's bulk "Fork the selected runs from their failed step")
starts from the step that failed the run, so no step that succeeded after a caught failure runs
twice. A patch decision recorded after the fork's step is decided afresh."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from django_leases.clock import db_now_plus
from django_leases.exceptions import WorkflowStepFailedError
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import fork_run, start_workflow, step_function, workflow
from django_leases.workflows.engine import StepContext
from tests.helpers import run_of

pytestmark = pytest.mark.django_db

#: ``version``: the code deployed; ``fail``: the steps that raise; ``calls``: steps called.
STATE: dict[str, Any] = {"version": 1, "fail": set(), "calls": []}


@pytest.fixture(autouse=True)
def _fresh_state() -> None:
    STATE.update(version=1, fail=set(), calls=[])


@step_function("tests.forkrepair.act")
def act(data: Any, ctx: StepContext) -> Any:
    STATE["calls"].append(ctx.step_name)
    if ctx.step_name in STATE["fail"]:
        raise RuntimeError(f"{ctx.step_name} fails")
    return ctx.step_name


@workflow("tests.forkrepair.order")
def order(run: Any, input: Any) -> Any:
    with contextlib.suppress(WorkflowStepFailedError):  # optional: may fail
        run.step("enrich", "tests.forkrepair.act", {}, retries=0)
    run.step("charge", "tests.forkrepair.act", {}, retries=0)
    # Retries for "ship": the run's end may stop it on an attempt that was not its last.
    return run.step("ship", "tests.forkrepair.act", {}, retries=input.get("ship_retries", 0))


@workflow("tests.forkrepair.raises")
def raises(run: Any, input: Any) -> Any:
    with contextlib.suppress(WorkflowStepFailedError):
        run.step("enrich", "tests.forkrepair.act", {}, retries=0)
    run.step("charge", "tests.forkrepair.act", {}, retries=0)
    if STATE["version"] == 1:
        raise ValueError("v1 cannot go on without enrich")
    return "done"


@workflow("tests.forkrepair.fan")
def fan(run: Any, input: Any) -> Any:
    both = run.parallel(
        [("p1", "tests.forkrepair.act", {}), ("p2", "tests.forkrepair.act", {})], retries=0
    )
    return [*both, run.step("after", "tests.forkrepair.act", {}, retries=0)]


@workflow("tests.forkrepair.patched")
def patched(run: Any, input: Any) -> Any:
    done = [run.step("load", "tests.forkrepair.act", {}, retries=0)]
    # v2 inserts a step before "pay", guarded as docs/howto/deploys.md says.
    if STATE["version"] >= 2 and run.patched("add-fraud-check"):
        done.append(run.step("fraud-check", "tests.forkrepair.act", {}, retries=0))
    done.append(run.step("pay", "tests.forkrepair.act", {}, retries=0))
    return done


def _decisions(run_id: Any) -> dict[str, Any]:
    rows = WorkflowStep.objects.filter(run_id=run_id, status=StepStatus.PATCH)
    return dict(rows.values_list("step_name", "result"))


def _stopped_mid_p1() -> Any:
    """A ``fan`` run whose ``p1`` is claimed (its only attempt) and ``p2`` waits."""
    original = start_workflow("tests.forkrepair.fan", {})
    steps = WorkflowStep.objects.filter(run_id=original)
    drive(original, until=lambda: steps.filter(step_name="p2").exists())
    claim = WorkflowStep.objects.claim_due(30)
    assert claim is not None and claim.step_name == "p1"
    return original


def test_fork_from_failed_forks_from_the_step_that_failed_the_run() -> None:
    """``enrich`` failed and was caught; ``charge`` succeeded; ``ship`` failed the run. The
    repair forks from ``ship`` (the step the run's error names): ``charge`` is not called a
    second time."""
    STATE["fail"] = {"enrich", "ship"}
    original = start_workflow("tests.forkrepair.order", {})
    failed = drive(original)
    assert failed is not None and failed.status == RunStatus.FAILED
    assert (failed.error or {})["step_name"] == "ship"
    STATE.update(fail={"enrich"}, calls=[])
    fork = WorkflowRun.objects.fork_from_failed(original)
    assert drive(fork.pk).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    assert STATE["calls"] == ["ship"], STATE["calls"]


def test_a_fork_of_a_cancelled_run_runs_again_the_step_the_cancel_stopped() -> None:
    """``p1`` is running (its only attempt) when an operator cancels the run, which fails it
    with ``RUN_CANCELLED``; the run is then forked from ``p2``. ``p1`` did not fail of itself:
    the fork runs it again and completes, instead of failing on the original's cancel."""
    original = _stopped_mid_p1()
    WorkflowRun.objects.cancel(original)
    p1 = WorkflowStep.objects.get(run_id=original, step_name="p1")
    assert p1.status == StepStatus.FAILED and (p1.error or {})["code"] == "RUN_CANCELLED"
    finished = drive(fork_run(original, from_step="p2"))
    assert finished is not None
    assert finished.status == RunStatus.COMPLETED, finished.error
    assert finished.output == ["p1", "p2", "after"]


def test_a_fork_of_a_run_past_its_deadline_runs_again_the_step_the_deadline_stopped() -> None:
    """The same for a step failed because its run passed its deadline; and
    ``fork_from_failed`` of that run starts from the step the deadline stopped."""
    original = _stopped_mid_p1()
    WorkflowRun.objects.filter(pk=original).update(deadline_at=db_now_plus(-1))
    assert WorkflowRun.objects.expire_deadlines() == [original]
    p1 = WorkflowStep.objects.get(run_id=original, step_name="p1")
    assert (p1.error or {})["code"] == "WORKFLOW_DEADLINE_EXCEEDED"
    finished = drive(fork_run(original, from_step="p2"))
    assert finished is not None
    assert finished.status == RunStatus.COMPLETED, finished.error
    assert STATE["calls"] == ["p1", "p2", "after"]
    repair = WorkflowRun.objects.fork_from_failed(original)
    assert not WorkflowStep.objects.filter(run_id=repair.pk).exists()  # from p1: nothing kept


def test_fork_from_failed_of_a_run_whose_workflow_raised_takes_its_latest_failed_step() -> None:
    """A run that ended otherwise than by a step's failure (its workflow raised after
    catching ``enrich``'s) is forked from its latest step that failed for good."""
    STATE["fail"] = {"enrich"}
    original = start_workflow("tests.forkrepair.raises", {})
    failed = drive(original)
    assert failed is not None and (failed.error or {})["code"] == "WORKFLOW_ERROR"
    STATE.update(version=2, fail=set(), calls=[])
    fork = WorkflowRun.objects.fork_from_failed(original)
    assert drive(fork.pk).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    assert STATE["calls"] == ["enrich", "charge"]


def test_a_patch_met_after_the_fork_step_is_decided_afresh_by_the_fork() -> None:
    """The original recorded ``load`` and failed at ``pay`` on v1; v2 (a patch inserting
    ``fraud-check`` before ``pay``) is deployed and the run resumed: it had gone past the
    patch, answers ``False`` (recorded after ``pay``) and fails at ``pay`` again. A fork
    from ``pay`` runs ``pay`` again with today's code, so it decides the patch afresh:
    ``True``, and ``fraud-check`` runs before ``pay``."""
    STATE["fail"] = {"pay"}
    original = start_workflow("tests.forkrepair.patched", {})
    assert drive(original).status == RunStatus.FAILED  # type: ignore[union-attr]
    STATE["version"] = 2
    WorkflowRun.objects.resume(original)
    assert drive(original).status == RunStatus.FAILED  # type: ignore[union-attr]
    assert _decisions(original) == {"add-fraud-check": False}
    STATE.update(fail=set(), calls=[])
    fork = WorkflowRun.objects.fork_from_failed(original).pk
    finished = drive(fork)
    assert finished is not None and finished.status == RunStatus.COMPLETED
    assert _decisions(fork) == {"add-fraud-check": True}
    assert STATE["calls"] == ["fraud-check", "pay"]
    assert run_of(fork).output == ["load", "fraud-check", "pay"]


def test_a_fork_from_a_step_after_the_patch_point_keeps_its_answer() -> None:
    """A run started on v2 answers ``True`` and runs ``fraud-check``; a fork from ``pay``
    keeps that answer and the recorded ``fraud-check`` result (no second call)."""
    STATE["version"] = 2
    original = start_workflow("tests.forkrepair.patched", {})
    assert drive(original).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    STATE["calls"] = []
    fork = fork_run(original, from_step="pay")
    assert drive(fork).output == ["load", "fraud-check", "pay"]  # type: ignore[union-attr]
    assert STATE["calls"] == ["pay"]
    assert _decisions(fork) == {"add-fraud-check": True}


@pytest.mark.parametrize("end", ["deadline", "cancel"])
def test_fork_from_failed_starts_at_the_step_the_end_stopped_with_attempts_left(end: str) -> None:
    """``fork_from_failed`` of a run a deadline or a cancel ended while ``ship`` ran the first
    of its three attempts forks from ``ship``: ``enrich`` (failed for good, caught) and
    ``charge`` (succeeded) are kept, not run again."""
    STATE["fail"] = {"enrich"}
    original = start_workflow("tests.forkrepair.order", {"ship_retries": 2})
    steps = WorkflowStep.objects.filter(run_id=original)
    drive(original, until=lambda: steps.filter(step_name="ship").exists())
    if steps.get(step_name="ship").status != StepStatus.RUNNING:
        claim = WorkflowStep.objects.claim_due(30)
        assert claim is not None and claim.step_name == "ship", claim
    if end == "deadline":
        WorkflowRun.objects.filter(pk=original).update(deadline_at=db_now_plus(-1))
        assert WorkflowRun.objects.expire_deadlines() == [original]
    else:
        WorkflowRun.objects.cancel(original)
    ship = steps.get(step_name="ship")
    assert ship.status == StepStatus.FAILED and ship.attempt < ship.retries + 1
    fork = WorkflowRun.objects.fork_from_failed(original)
    kept = set(WorkflowStep.objects.filter(run_id=fork.pk).values_list("step_name", flat=True))
    assert kept == {"enrich", "charge"}, kept
