"""Child runs (DESIGN §5a): ``run.child(name, workflow, input)`` starts an ordinary run whose
``parent`` is the caller and returns its output; the child's end wakes the parent (on both
paths of the completion rule); a failed or cancelled child raises
``WorkflowChildFailedError`` in the parent; cancelling a parent cancels its live children."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.db.models.functions import Now

from django_leases.exceptions import (
    WorkflowChildFailedError,
    WorkflowRunStateError,
    WorkflowStepSupersededError,
)
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step
from django_leases.workflows.values import RUN_CANCELLED, WORKFLOW_ERROR, WaitStatus
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_step_lease, race, run_of

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0


@step_function("tests.children.double")
def double(data: dict[str, Any], ctx: Any) -> int:
    if data.get("fail"):
        raise RuntimeError("the child's step fails")
    return int(data["n"]) * 2


@workflow("tests.children.child")
def child(run: Any, input: dict[str, Any]) -> Any:
    return {
        "doubled": run.step(
            "double", "tests.children.double", input, retries=input.get("retries", 0)
        )
    }


@workflow("tests.children.waiting-child")
def waiting_child(run: Any, input: Any) -> Any:
    run.wait_for_event("go")
    return run.child("grandchild", "tests.children.child", {"n": 1})


@workflow("tests.children.parent")
def parent(run: Any, input: dict[str, Any]) -> Any:
    try:
        result = run.child("kid", input.get("workflow", "tests.children.child"), input["child"])
    except WorkflowChildFailedError as exc:
        if input.get("catch"):
            return {"child_failed": exc.status, "child_id": str(exc.child_id)}
        raise
    return {"from_child": result}


@workflow("tests.children.cancelled-mid-pass")
def cancelled_mid_pass(run: Any, input: Any) -> Any:
    # An operator's cancel commits while this pass runs, before it reaches run.child.
    WorkflowRun.objects.cancel(run.id)
    return run.child("kid", "tests.children.child", {"n": 1})


def kid_of(run_id: uuid.UUID) -> WorkflowRun:
    return WorkflowRun.objects.get(parent_id=run_id)


def test_the_parent_gets_the_childs_output_and_is_woken_by_its_end(sql_path: str) -> None:
    run_id = start_workflow("tests.children.parent", {"child": {"n": 21}})
    assert run_pass(run_id) == "waiting"
    kid = kid_of(run_id)
    assert (kid.workflow, kid.status, kid.input) == ("tests.children.child", "running", {"n": 21})
    wait = WorkflowWait.objects.get(run_id=run_id, name="kid")
    assert (wait.kind, wait.child_id, wait.status) == ("child", kid.id, WaitStatus.WAITING)
    assert run_of(run_id).pass_due_at is None, "nothing is due for the parent until the child ends"
    # On a worker: the child's result and its completion are one write (the fused path),
    # which must wake the parent, or nothing would ever give the parent another pass.
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"from_child": {"doubled": 42}})
    assert WorkflowWait.objects.get(run_id=run_id, name="kid").status == WaitStatus.DONE
    assert WorkflowRun.objects.filter(parent_id=run_id).count() == 1, "replays start no other"


def test_a_failed_child_raises_in_the_parent(sql_path: str) -> None:
    caught = start_workflow(
        "tests.children.parent", {"child": {"n": 1, "fail": True}, "catch": True}
    )
    uncaught = start_workflow("tests.children.parent", {"child": {"n": 1, "fail": True}})
    drain()
    assert run_of(caught).output == {"child_failed": "failed", "child_id": str(kid_of(caught).id)}
    failed = run_of(uncaught)
    assert failed.status == RunStatus.FAILED and failed.error["code"] == WORKFLOW_ERROR
    assert "ended failed" in failed.error["message"]


def test_an_unknown_child_workflow_fails_the_parent_and_starts_nothing() -> None:
    run_id = start_workflow("tests.children.parent", {"child": {}, "workflow": "tests.nope"})
    drain()
    assert run_of(run_id).status == RunStatus.FAILED
    assert "tests.nope" in run_of(run_id).error["message"]
    assert not WorkflowRun.objects.filter(parent_id=run_id).exists()
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_cancelling_a_parent_cancels_its_live_children_and_theirs() -> None:
    run_id = start_workflow(
        "tests.children.parent", {"child": {}, "workflow": "tests.children.waiting-child"}
    )
    drain()
    kid = kid_of(run_id)
    WorkflowWait.objects.send_event(kid.id, "go", None)
    drain_until_grandchild = Worker(step_lease_ttl=LEASE)
    while not WorkflowRun.objects.filter(parent_id=kid.id).exists():
        assert drain_until_grandchild.work_once()
    grandchild = kid_of(kid.id)
    assert run_pass(grandchild.id) == "waiting"
    claim = WorkflowStep.objects.claim_due(LEASE)  # the grandchild's step, running
    assert claim is not None and claim.run_id == grandchild.id
    change = WorkflowRun.objects.cancel(run_id)
    assert change.after == RunStatus.CANCELLED
    for run in (run_of(run_id), run_of(kid.id), run_of(grandchild.id)):
        assert run.status == RunStatus.CANCELLED and run.error["code"] == RUN_CANCELLED
    assert (
        str(run_id) in run_of(grandchild.id).error["message"]
        or str(kid.id) in run_of(grandchild.id).error["message"]
    )
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(claim.step_id, 2, claim.attempt)


def finish_child(kid_id: uuid.UUID) -> None:
    """The child's pass, its step and its completing pass, here (the parent not driven)."""
    assert run_pass(kid_id) == "waiting"
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and claim.run_id == kid_id
    assert execute_step(claim) == "succeeded"
    assert run_pass(kid_id) == "completed"


def test_a_finished_child_is_left_alone_by_its_parents_cancel() -> None:
    run_id = start_workflow("tests.children.parent", {"child": {"n": 1}})
    run_pass(run_id)
    kid = kid_of(run_id)
    finish_child(kid.id)
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists(), "woken"
    WorkflowRun.objects.cancel(run_id)
    assert run_of(kid.id).status == RunStatus.COMPLETED


def test_cancelling_a_child_raises_in_its_parent() -> None:
    run_id = start_workflow(
        "tests.children.parent",
        {"child": {}, "workflow": "tests.children.waiting-child", "catch": True},
    )
    drain()
    kid = kid_of(run_id)
    WorkflowRun.objects.cancel(kid.id)
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists(), "woken"
    drain()
    assert run_of(run_id).output == {"child_failed": "cancelled", "child_id": str(kid.id)}


def test_a_superseded_attempt_cannot_finish_a_child() -> None:
    run_id = start_workflow("tests.children.parent", {"child": {"n": 5, "retries": 1}})
    run_pass(run_id)
    kid = kid_of(run_id)
    run_pass(kid.id)
    stale = WorkflowStep.objects.claim_for_execution(
        kid.id, "double", "tests.children.double", LEASE
    )
    assert stale is not None
    lapse_step_lease(run_id=kid.id)
    current = WorkflowStep.objects.claim_for_execution(
        kid.id, "double", "tests.children.double", LEASE
    )
    assert current is not None
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, 999, stale.attempt)
    assert run_pass(kid.id) == "waiting" and run_of(kid.id).status == RunStatus.RUNNING
    assert run_of(run_id).pass_due_at is None, "the parent was not woken"
    WorkflowStep.objects.set_result(current.step_id, 10, current.attempt)
    drain()
    assert run_of(run_id).output == {"from_child": {"doubled": 10}}


def test_a_pass_still_running_when_its_run_is_cancelled_starts_no_child(sql_path: str) -> None:
    """The cancel found no child to cancel; the pass that was already under way must not
    start one afterwards, or a cancelled parent would leave a live child behind."""
    run_id = start_workflow("tests.children.cancelled-mid-pass", {})
    drain()
    assert run_of(run_id).status == RunStatus.CANCELLED
    assert not WorkflowRun.objects.filter(parent_id=run_id).exists()
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


def test_a_pass_ended_by_its_runs_cancel_is_not_logged_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refused child start ends that pass; the run was cancelled, not failed by its
    workflow, so no warning with a traceback says it failed."""
    run_id = start_workflow("tests.children.cancelled-mid-pass", {})
    with caplog.at_level(logging.INFO, logger="django_leases.workflows"):
        assert run_pass(run_id) == "not-running"
    assert run_of(run_id).status == RunStatus.CANCELLED
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert any("no longer running" in r.getMessage() for r in caplog.records), caplog.text


def test_a_cancel_racing_the_pass_that_starts_a_child_leaves_no_live_child() -> None:
    """The same on two threads with real row locks: whichever lands first, a cancelled
    parent has no running or suspended child afterwards."""
    for _ in range(20):
        run_id = start_workflow("tests.children.parent", {"child": {"n": 1}})
        cancelled, passed = race(
            [
                lambda run_id=run_id: WorkflowRun.objects.cancel(run_id),
                lambda run_id=run_id: run_pass(run_id),
            ]
        )
        assert not isinstance(cancelled, BaseException), cancelled
        assert not isinstance(passed, BaseException), passed
        assert run_of(run_id).status == RunStatus.CANCELLED
        live = WorkflowRun.objects.filter(parent_id=run_id, status__in=("running", "suspended"))
        assert not live.exists(), f"a live child under a cancelled parent (pass: {passed})"


def test_a_child_cannot_be_started_for_a_run_that_is_not_running() -> None:
    run_id = start_workflow("tests.children.parent", {"child": {"n": 1}})
    WorkflowRun.objects.cancel(run_id)
    with pytest.raises(WorkflowRunStateError, match="cancelled"):
        WorkflowWait.objects.start_child(run_id, "kid", "tests.children.child", {"n": 1})
    assert not WorkflowRun.objects.filter(parent_id=run_id).exists()
    assert not WorkflowWait.objects.filter(run_id=run_id).exists()


@pytest.mark.postgres_only
def test_a_cancel_racing_the_childs_last_write_leaves_one_consistent_outcome() -> None:
    """A parent's cancel and its child's final result race on two threads (real row locks):
    no deadlock, the parent ends cancelled, and the child either completed (its write landed
    first) or was cancelled with its write refused."""
    seen = set()
    for _ in range(8):
        run_id = start_workflow("tests.children.parent", {"child": {"n": 3}})
        run_pass(run_id)
        kid = kid_of(run_id)
        run_pass(kid.id)
        claim = WorkflowStep.objects.claim_due(LEASE)
        assert claim is not None and claim.run_id == kid.id
        cancelled, written = race(
            [
                lambda run_id=run_id: WorkflowRun.objects.cancel(run_id),
                lambda claim=claim: WorkflowStep.objects.set_result(
                    claim.step_id, 6, claim.attempt
                ),
            ]
        )
        assert not isinstance(cancelled, BaseException), cancelled
        assert run_of(run_id).status == RunStatus.CANCELLED
        kid = run_of(kid.id)
        if isinstance(written, BaseException):
            assert isinstance(written, WorkflowStepSupersededError), written
            assert kid.status == RunStatus.CANCELLED
        else:
            assert WorkflowStep.objects.get(pk=claim.step_id).result == 6
            # The result landed first: the cancel then stopped the child before its pass.
            assert kid.status == RunStatus.CANCELLED
        seen.add(isinstance(written, BaseException))
    assert seen


def test_the_admin_links_a_parent_and_its_children(admin_client: Any) -> None:
    from django.urls import reverse

    run_id = start_workflow("tests.children.parent", {"child": {"n": 1}})
    run_pass(run_id)
    kid = kid_of(run_id)
    change = "admin:django_leases_workflowrun_change"
    parent_page = admin_client.get(reverse(change, args=[run_id])).content.decode()
    assert f'href="{reverse(change, args=[kid.id])}"' in parent_page
    assert "waiting for child" in parent_page
    kid_page = admin_client.get(reverse(change, args=[kid.id])).content.decode()
    assert f'href="{reverse(change, args=[run_id])}"' in kid_page


def test_prune_keeps_a_finished_child_while_its_parent_may_still_read_it() -> None:
    """A child that completed is the parent's outcome until the parent has replayed it: a
    prune must not delete it while the parent is running, suspended or failed (a failed
    parent may be resumed and replays ``run.child``), or the parent would see the completed
    child as a missing one and fail."""
    run_id = start_workflow("tests.children.parent", {"child": {"n": 4}})
    run_pass(run_id)
    kid = kid_of(run_id)
    assert WorkflowRun.objects.complete(kid.id, {"doubled": 8})
    assert WorkflowRun.objects.prune(0) == 0
    assert WorkflowRun.objects.filter(pk=kid.id).exists()
    drain()
    assert run_of(run_id).output == {"from_child": {"doubled": 8}}
    # Once the parent is finished (for good: completed), both may go.
    assert WorkflowRun.objects.prune(0) == 2


def test_a_child_the_scan_missed_makes_the_cancel_start_over_children_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A child started between the cancel's scan for children and its lock on the parent:
    # locking it after the parent would invert the order a finishing child takes (child,
    # then parent). The cancel starts over and locks the child first.
    run_id = start_workflow("tests.children.parent", {"child": {"n": 2}})
    drain_one_pass = run_pass(run_id)
    assert drain_one_pass == "waiting"
    kid = kid_of(run_id)
    queryset = type(WorkflowRun.objects.all())
    real_scan = queryset._live_descendants
    real_lock = queryset._lock_for_operator
    scans: list[list[uuid.UUID]] = []
    locks: list[list[uuid.UUID]] = []

    def scan(self: Any, alias: str, pk: uuid.UUID) -> list[uuid.UUID]:
        found = [] if not scans else real_scan(self, alias, pk)  # the first scan misses it
        scans.append(found)
        if len(scans) % 2 == 1:
            locks.append([])  # a round starts with its first scan
        return found

    def lock(self: Any, alias: str, pk: uuid.UUID) -> WorkflowRun:
        locks[-1].append(pk)
        return real_lock(self, alias, pk)

    monkeypatch.setattr(queryset, "_live_descendants", scan)
    monkeypatch.setattr(queryset, "_lock_for_operator", lock)
    change = WorkflowRun.objects.cancel(run_id)
    assert change.after == RunStatus.CANCELLED
    assert locks == [[run_id], [kid.id, run_id]]  # started over, the child locked first
    assert run_of(kid.id).status == RunStatus.CANCELLED
    assert run_of(run_id).status == RunStatus.CANCELLED
