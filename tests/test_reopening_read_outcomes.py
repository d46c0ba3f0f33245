"""An outcome a run's pass read is the outcome its every later replay reads
(docs/howto/operators.md). A run that caught a child's failure (``WorkflowChildFailedError``)
or a branch's failure for good (``WorkflowStepFailedError``) and went on has its history made
of that failure, so while it may still replay (running or suspended) an operator cannot set that
outcome moving again: resuming or retrying the child is refused while its live parent read it,
and a running run's step that failed for good is not retried (one with attempts left still
is). Nothing is written by a refusal, and the run finishes on the path it took."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from django_leases.exceptions import (
    WorkflowChildFailedError,
    WorkflowRunStateError,
    WorkflowStepFailedError,
)
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.wait import WorkflowWaitQuerySet
from django_leases.workflows import registry, send_event, start_workflow, step_function, workflow
from tests.helpers import drain, run_of, start_blocked

pytestmark = pytest.mark.django_db(transaction=True)

#: The steps that fail while their name is in it.
FAILING: set[str] = set()


@pytest.fixture(autouse=True)
def _failing() -> Any:
    FAILING.clear()
    FAILING.update({"k", "a"})
    yield
    FAILING.clear()


@step_function("tests.read-once.work")
def work(data: dict[str, Any], ctx: Any) -> Any:
    if ctx.step_name in FAILING:
        raise RuntimeError(f"{ctx.step_name} fails")
    return data.get("n", ctx.step_name)


@workflow("tests.read-once.kid")
def kid_workflow(run: Any, input: Any) -> Any:
    return run.step("k", "tests.read-once.work", {"n": 7}, retries=0)


@workflow("tests.read-once.parent")
def parent_workflow(run: Any, input: Any) -> Any:
    try:
        got = run.child("kid", "tests.read-once.kid", {})
        path = "child"
    except WorkflowChildFailedError:
        got = run.step("compensate", "tests.read-once.work", {"n": -1}, retries=0)
        path = "compensated"
    run.wait_for_event("go")
    return {"got": got, "path": path}


@workflow("tests.read-once.fan")
def fan_workflow(run: Any, input: Any) -> Any:
    calls = [(name, "tests.read-once.work", {}) for name in ("a", "b")]
    try:
        got = run.parallel(calls, retries=0)
        path = "fanned"
    except WorkflowStepFailedError:
        got = run.step("compensate", "tests.read-once.work", {"n": "c"}, retries=0)
        path = "compensated"
    run.wait_for_event("go")
    return {"got": got, "path": path}


def _finish(run_id: Any) -> WorkflowRun:
    send_event(run_id, "go", {})
    drain()
    return run_of(run_id)


@pytest.mark.parametrize("operation", ["resume", "retry"])
@pytest.mark.parametrize("parent_status", [RunStatus.RUNNING, RunStatus.SUSPENDED])
def test_a_child_whose_live_parent_went_on_from_its_failure_is_not_reopened(
    operation: str, parent_status: str
) -> None:
    """The parent caught its child's failure, compensated and waits (running; or suspended,
    as a missing step function leaves it): the child's resume or retry is refused, nothing
    written, and the parent, once going again, completes on the compensated path."""
    run_id = start_workflow("tests.read-once.parent", {})
    drain()
    kid = WorkflowRun.objects.get(parent_id=run_id)
    assert kid.status == RunStatus.FAILED
    assert run_of(run_id).status == RunStatus.RUNNING
    WorkflowRun.objects.filter(pk=run_id).update(status=parent_status)
    FAILING.clear()  # a deploy fixed the child
    with pytest.raises(WorkflowRunStateError, match="went on from its outcome"):
        getattr(WorkflowRun.objects, operation)(kid.pk)
    assert run_of(kid.pk).status == RunStatus.FAILED
    assert WorkflowStep.objects.get(run_id=kid.pk, step_name="k").status == StepStatus.FAILED
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.RUNNING)
    parent = _finish(run_id)
    assert parent.status == RunStatus.COMPLETED, (parent.status, parent.error)
    assert parent.output == {"got": -1, "path": "compensated"}


def test_a_child_whose_parent_failed_on_it_is_resumed_first_as_documented() -> None:
    """A parent that did not catch its child's failure failed with it: resuming the child,
    then the parent, is still the documented repair."""
    run_id = start_workflow("tests.read-once.kid-uncaught", {})
    drain()
    assert run_of(run_id).status == RunStatus.FAILED
    kid = WorkflowRun.objects.get(parent_id=run_id)
    FAILING.clear()
    WorkflowRun.objects.resume(kid.pk)
    drain()
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    WorkflowRun.objects.resume(run_id)
    drain()
    assert run_of(run_id).output == 7


@workflow("tests.read-once.kid-uncaught")
def uncaught_workflow(run: Any, input: Any) -> Any:
    return run.child("kid", "tests.read-once.kid", {})


def test_a_running_runs_step_that_failed_for_good_is_not_retried() -> None:
    """Branch ``a`` failed for good, the run caught it, compensated and waits: retrying
    ``a`` (alone, or with every failed step) is refused, nothing written, and the run
    completes on the compensated path."""
    run_id = start_workflow("tests.read-once.fan", {})
    drain()
    assert run_of(run_id).status == RunStatus.RUNNING
    FAILING.clear()
    with pytest.raises(WorkflowRunStateError, match="failed on its last attempt"):
        WorkflowRun.objects.retry_step(run_id, "a")
    with pytest.raises(WorkflowRunStateError, match="no failed step"):
        WorkflowRun.objects.retry(run_id)
    a = WorkflowStep.objects.get(run_id=run_id, step_name="a")
    assert (a.status, a.attempt, a.retries) == (StepStatus.FAILED, 1, 0)
    run = _finish(run_id)
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    assert run.output == {"got": "c", "path": "compensated"}


def test_a_running_runs_step_with_attempts_left_is_retried_early() -> None:
    """A failed step that still has attempts is made due now (ahead of its retry delay), as
    before: no pass has read a failure of it."""
    run_id = start_workflow("tests.read-once.fan", {})
    drain()
    WorkflowStep.objects.filter(run_id=run_id, step_name="a").update(retries=3)
    WorkflowRun.objects.retry_step(run_id, "a")
    assert WorkflowRun.objects.retry(run_id).steps == ("a",)


def test_a_resume_before_the_parents_reading_pass_settles_is_read_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parent's pass read its child failed; before it settles the wait, an operator
    resumes the child (committed first). The pass reads the child again under its lock,
    finds it running, settles nothing and ends: the parent then reads the child's new
    outcome, and never compensates for a failure that no longer stands."""
    original = WorkflowWaitQuerySet.settle_child
    resumed: list[Any] = []

    def settle_child(self: Any, wait: Any, *, pending: Any = None) -> Any:
        if not resumed and wait.name == "kid":
            FAILING.clear()  # a deploy fixed the child
            resumed.append(WorkflowRun.objects.resume(wait.child_id))
        return original(self, wait, pending=pending)

    monkeypatch.setattr(WorkflowWaitQuerySet, "settle_child", settle_child)
    run_id = start_workflow("tests.read-once.parent", {})
    drain()
    assert resumed, "the parent's pass never settled its child wait"
    kid = WorkflowRun.objects.get(parent_id=run_id)
    assert run_of(kid.pk).status == RunStatus.COMPLETED
    assert not WorkflowStep.objects.filter(run_id=run_id, step_name="compensate").exists()
    parent = _finish(run_id)
    assert parent.output == {"got": 7, "path": "child"}


def test_a_resume_racing_the_parents_settled_read_waits_for_it_and_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parent's pass has read its child failed and settled the wait, its transaction
    still open: an operator's resume of the child waits on the child's row lock (ordered
    with the database's lock waits, no sleep), then finds the wait settled and is refused.
    The parent compensates, and the child stays failed."""
    original = WorkflowWaitQuerySet.settle_child
    raced: list[Any] = []

    def settle_child(self: Any, wait: Any, *, pending: Any = None) -> Any:
        if raced or wait.name != "kid":
            return original(self, wait, pending=pending)
        FAILING.clear()
        with transaction.atomic():
            settled = original(self, wait, pending=pending)
            raced.append(start_blocked(lambda: WorkflowRun.objects.resume(wait.child_id)))
        return settled

    monkeypatch.setattr(WorkflowWaitQuerySet, "settle_child", settle_child)
    run_id = start_workflow("tests.read-once.parent", {})
    drain()
    assert raced, "the parent's pass never settled its child wait"
    if connection.vendor != "sqlite":  # SQLite cannot show a waiting connection
        assert raced[0].waited
    with pytest.raises(WorkflowRunStateError, match="went on from its outcome"):
        raced[0].result()
    assert run_of(WorkflowRun.objects.get(parent_id=run_id).pk).status == RunStatus.FAILED
    parent = _finish(run_id)
    assert parent.output == {"got": -1, "path": "compensated"}


def test_a_suspended_runs_step_that_failed_for_good_is_not_retried() -> None:
    """A suspended run (a missing step function leaves one) may replay as much as a running
    one: its caught, failed-for-good step is not retried either, alone or with the others."""
    run_id = start_workflow("tests.read-once.fan", {})
    drain()
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.SUSPENDED)
    FAILING.clear()
    with pytest.raises(WorkflowRunStateError, match="failed on its last attempt"):
        WorkflowRun.objects.retry_step(run_id, "a")
    with pytest.raises(WorkflowRunStateError, match="no failed step"):
        WorkflowRun.objects.retry(run_id)
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.RUNNING)
    assert _finish(run_id).output == {"got": "c", "path": "compensated"}


@workflow("tests.read-once.missing")
def missing_workflow(run: Any, input: Any) -> Any:
    return run.step("late", "tests.read-once.not-deployed-yet", {}, retries=0)


@pytest.mark.parametrize("operation", ["retry_step", "retry"])
def test_a_suspended_runs_step_whose_function_was_missing_is_retried(operation: str) -> None:
    """A step whose function was missing (on its only attempt) suspended its run: no pass
    read a failure of it, so once the function is deployed the operator's retry of the
    step, or of the run, makes it due and the run completes."""
    run_id = start_workflow("tests.read-once.missing", {})
    drain()
    assert run_of(run_id).status == RunStatus.SUSPENDED
    step_function("tests.read-once.not-deployed-yet")(lambda data, ctx: "here")
    try:
        args = (run_id, "late") if operation == "retry_step" else (run_id,)
        getattr(WorkflowRun.objects, operation)(*args)
        drain()
        assert run_of(run_id).output == "here"
    finally:
        registry._step_functions.pop("tests.read-once.not-deployed-yet", None)
        registry._step_options.pop("tests.read-once.not-deployed-yet", None)
