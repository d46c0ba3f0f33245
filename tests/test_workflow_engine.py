"""The replay engine: passes under the run lease, step execution under a renewed, fenced step
lease, retries, failures, suspension. Superseded dispatches ending quietly (F8–F10) are in the
shipped conformance suite (``django_leases.testing.workflows``)."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest
from django.db import transaction
from django.db.models.functions import Now

from django_leases.clock import db_now_plus
from django_leases.exceptions import UnknownWorkflowError, WorkflowStepSupersededError
from django_leases.leases import hold_lease
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step, start_workflow
from django_leases.workflows.values import (
    STEP_FAILED,
    STEP_FUNCTION_NOT_FOUND,
    WORKFLOW_ERROR,
    WORKFLOW_NOT_FOUND,
    Claim,
    run_lease_key,
)
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_step_lease, run_of, start_thread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0

# -- workflows and step functions used here -------------------------------------------------------

_calls: dict[str, int] = {}
_calls_lock = threading.Lock()


def _count(name: str) -> int:
    with _calls_lock:
        _calls[name] = _calls.get(name, 0) + 1
        return _calls[name]


@step_function("tests.add-one")
def add_one(data: dict[str, Any], ctx: Any) -> int:
    _count("add-one")
    return int(data["x"]) + 1


@workflow("tests.linear")
def linear(run: Any, input: dict[str, Any]) -> dict[str, Any]:
    a = run.step("a", "tests.add-one", {"x": input["x"]})
    b = run.step("b", "tests.add-one", {"x": a})
    return {"a": a, "b": b}


@step_function("tests.flaky")
def flaky(data: dict[str, Any], ctx: Any) -> str:
    if ctx.attempt <= data["fail_times"]:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return f"ok on attempt {ctx.attempt}"


@workflow("tests.flaky")
def flaky_workflow(run: Any, input: dict[str, Any]) -> Any:
    return run.step("flaky", "tests.flaky", input, retries=input["retries"])


@workflow("tests.raises")
def raising_workflow(run: Any, input: Any) -> Any:
    run.step("a", "tests.add-one", {"x": 1})
    raise KeyError("no such thing")


@workflow("tests.bad-output")
def bad_output(run: Any, input: Any) -> Any:
    return {"not json": object()}


@workflow("tests.duplicate-steps")
def duplicate_steps(run: Any, input: Any) -> Any:
    run.step("a", "tests.add-one", {"x": 1})
    run.step("a", "tests.add-one", {"x": 2})
    return None


@workflow("tests.missing-function")
def missing_function(run: Any, input: Any) -> Any:
    return run.step("ghost", "tests.not-registered", {})


@workflow("tests.catches")
def catches(run: Any, input: Any) -> Any:
    # A workflow's own ``except Exception`` must not swallow the end of a pass.
    try:
        value = run.step("a", "tests.add-one", {"x": 41})
    except Exception:
        return "swallowed"
    return value


_slow_seen: dict[str, Any] = {}

#: The step lease of the renewal test: renewed every second, so it survives two seconds of a
#: starved renewal thread (a loaded machine), where a 1 s lease did not survive 0.7 s.
RENEWED_TTL = 3.0


@step_function("tests.outlives-its-ttl")
def outlives_its_ttl(data: dict[str, Any], ctx: Any) -> str:
    """Runs until the database clock is past the step lease's expiry as it was when the
    function started (it outlived its TTL), then checks nobody could take the step."""
    mine = WorkflowStep.objects.filter(run_id=ctx.run_id, step_name=ctx.step_name)
    first_expiry = mine.values_list("lease_expires_at", flat=True).get()
    wait_until(
        lambda: mine.alias(now=Now()).filter(now__gt=first_expiry).exists(),
        60,
        what="the database clock to pass the step lease's first expiry",
    )
    _slow_seen["live"] = mine.filter(lease_expires_at__gt=Now()).exists()
    _slow_seen["competitor"] = WorkflowStep.objects.claim_for_execution(
        ctx.run_id, ctx.step_name, "tests.outlives-its-ttl", 30
    )
    _slow_seen["lost"] = ctx.lease_lost.is_set()
    return "done"


@workflow("tests.slow")
def slow(run: Any, input: Any) -> Any:
    return run.step("slow", "tests.outlives-its-ttl", input)


# -- helpers ---------------------------------------------------------------------------------------


# -- replay ------------------------------------------------------------------------------------


def test_a_linear_workflow_is_replayed_pass_by_pass_until_it_completes() -> None:
    run_id = start_workflow("tests.linear", {"x": 1})
    assert isinstance(run_id, uuid.UUID)
    assert run_pass(run_id) == "waiting"
    assert list(WorkflowStep.objects.filter(run_id=run_id).values_list("step_name", "status")) == [
        ("a", "pending")
    ]
    assert run_pass(run_id) == "waiting", "a second pass is harmless"
    assert WorkflowStep.objects.filter(run_id=run_id).count() == 1
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and claim.step_name == "a"
    assert execute_step(claim) == "succeeded"
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()
    drain()
    run = run_of(run_id)
    assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, {"a": 2, "b": 3}, None)
    assert run.finished_at is not None and run.pass_due_at is None
    assert [
        (h.step.step_name, h.attempt, h.status) for h in WorkflowStep.objects.history(run_id)
    ] == [
        ("a", 1, "succeeded"),
        ("b", 1, "succeeded"),
    ]


def test_a_completed_step_is_not_run_again_by_later_passes() -> None:
    before = _calls.get("add-one", 0)
    run_id = start_workflow("tests.linear", {"x": 10})
    drain()
    assert run_of(run_id).status == RunStatus.COMPLETED
    assert _calls["add-one"] - before == 2
    assert run_pass(run_id) == "not-running"
    assert _calls["add-one"] - before == 2


def test_a_workflow_cannot_swallow_the_end_of_a_pass() -> None:
    run_id = start_workflow("tests.catches", {})
    drain()
    assert (run_of(run_id).status, run_of(run_id).output) == (RunStatus.COMPLETED, 42)


def test_retries_then_success_records_every_attempt() -> None:
    run_id = start_workflow("tests.flaky", {"fail_times": 2, "retries": 2})
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "ok on attempt 3")
    history = WorkflowStep.objects.history(run_id)
    assert [(h.attempt, h.status) for h in history] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]
    recorded = dict(history[0].error)
    assert "flaky failure on attempt" in recorded.pop("traceback")
    assert recorded == {"type": "RuntimeError", "message": "flaky failure on attempt 1"}


def test_a_step_failing_on_its_last_attempt_fails_the_run() -> None:
    run_id = start_workflow("tests.flaky", {"fail_times": 5, "retries": 1})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == STEP_FAILED
    assert run.error["step_name"] == "flaky"
    assert run.error["step_error"]["message"] == "flaky failure on attempt 2"
    assert run.finished_at is not None
    assert WorkflowStep.objects.get(run_id=run_id).attempt == 2


def test_a_workflow_that_raises_fails_the_run_with_its_error() -> None:
    run_id = start_workflow("tests.raises", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == WORKFLOW_ERROR
    assert run.error["type"] == "KeyError"


def test_output_that_is_not_json_fails_the_run_with_a_clear_error() -> None:
    run_id = start_workflow("tests.bad-output", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert run.output is None
    assert "JSON" in run.error["message"]


def test_a_step_name_used_twice_fails_the_run_with_a_clear_error() -> None:
    run_id = start_workflow("tests.duplicate-steps", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert "used twice" in run.error["message"]


def test_a_pass_that_finds_the_run_lease_taken_is_retried_a_second_later() -> None:
    run_id = start_workflow("tests.linear", {"x": 1})
    with hold_lease(run_lease_key(run_id), ttl=30):
        assert run_pass(run_id) == "lease-taken"
        run = run_of(run_id)
        assert run.status == RunStatus.RUNNING and run.error is None
        assert WorkflowRun.objects.filter(
            pk=run_id, pass_due_at__gt=Now(), pass_due_at__lte=db_now_plus(2)
        ).exists()
        assert WorkflowRun.objects.claim_due_pass(30) is None, "due again too soon"
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now_plus(-1))
    drain()
    assert run_of(run_id).status == RunStatus.COMPLETED


def test_a_picked_pass_whose_worker_died_is_picked_again_after_the_run_lease_ttl() -> None:
    run_id = start_workflow("tests.linear", {"x": 1})
    picked = WorkflowRun.objects.claim_due_pass(30)
    assert picked is not None and picked.run_id == run_id
    assert WorkflowRun.objects.claim_due_pass(30) is None
    # ... the worker dies here; 30 s later (on the database clock):
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=db_now_plus(-1))
    again = WorkflowRun.objects.claim_due_pass(30)
    assert again is not None and again.run_id == run_id


def test_a_request_during_a_pass_keeps_the_run_due() -> None:
    run_id = start_workflow("tests.linear", {"x": 1})
    requests = run_of(run_id).pass_requests
    WorkflowRun.objects.request_pass(run_id)
    assert not WorkflowRun.objects.finish_pass(run_id, requests)
    assert run_of(run_id).pass_due_at is not None
    assert WorkflowRun.objects.finish_pass(run_id, requests + 1)
    assert run_of(run_id).pass_due_at is None


def test_an_unknown_workflow_at_pass_time_suspends_the_run() -> None:
    run = WorkflowRun.objects.start("tests.deployed-elsewhere", {})
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert run.error["code"] == WORKFLOW_NOT_FOUND


# -- starting ----------------------------------------------------------------------------------


def test_start_workflow_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        start_workflow("tests.linear", {"x": 1})
        raise RuntimeError("the delivery was not recorded after all")
    assert not WorkflowRun.objects.exists()
    with transaction.atomic():
        run_id = start_workflow("tests.linear", {"x": 1})
    run = run_of(run_id)
    assert (run.status, run.input, run.workflow) == (RunStatus.RUNNING, {"x": 1}, "tests.linear")
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()


def test_start_workflow_refuses_unknown_names_and_non_json_input() -> None:
    with pytest.raises(UnknownWorkflowError, match="nope"):
        start_workflow("nope", {})
    with pytest.raises(ValueError, match="JSON"):
        start_workflow("tests.linear", {"x": {1, 2}})
    assert not WorkflowRun.objects.exists()


def test_run_step_refuses_bad_arguments_and_the_run_fails_clearly() -> None:
    @workflow("tests.bad-step-args")
    def bad_args(run: Any, input: Any) -> Any:
        return run.step("a", "tests.add-one", {"x": 1}, retries=-3)

    run_id = start_workflow("tests.bad-step-args", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.FAILED
    assert "retries" in run.error["message"]
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()


# -- step execution ----------------------------------------------------------------------------


def test_a_missing_step_function_suspends_the_run_and_the_step_is_left_alone() -> None:
    run_id = start_workflow("tests.missing-function", {})
    drain()
    run = run_of(run_id)
    assert run.status == RunStatus.SUSPENDED
    assert run.error["code"] == STEP_FUNCTION_NOT_FOUND
    assert "tests.not-registered" in run.error["message"]
    step = WorkflowStep.objects.get(run_id=run_id)
    assert step.status == StepStatus.FAILED
    assert step.error["code"] == STEP_FUNCTION_NOT_FOUND
    assert WorkflowStep.objects.claim_due(LEASE) is None
    assert WorkflowRun.objects.claim_due_pass(30) is None


def test_the_step_lease_is_renewed_while_the_function_outlives_its_ttl() -> None:
    _slow_seen.clear()
    run_id = start_workflow("tests.slow", {})
    drain(Worker(step_lease_ttl=RENEWED_TTL))
    assert _slow_seen["live"] is True, "the step lease lapsed while its function ran"
    assert _slow_seen["competitor"] is None, "the step was taken from a worker still renewing"
    assert _slow_seen["lost"] is False
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done")
    assert [(h.attempt, h.status) for h in WorkflowStep.objects.history(run_id)] == [
        (1, "succeeded")
    ]


def _claim_run(name: str, step: str, function: str) -> tuple[uuid.UUID, Claim]:
    run = WorkflowRun.objects.start(name, {})
    WorkflowStep.objects.schedule(run.id, step, function, {"x": 1})
    claim = WorkflowStep.objects.claim_for_execution(run.id, step, function, LEASE)
    assert claim is not None
    return run.id, claim


def test_superseded_error_from_the_store_never_escapes_execute_step() -> None:
    run_id, stale = _claim_run("tests.fenced", "charge", "tests.add-one")
    lapse_step_lease(run_id=run_id, step_name="charge")
    current = WorkflowStep.objects.claim_for_execution(run_id, "charge", "tests.add-one", LEASE)
    assert current is not None
    try:
        assert execute_step(stale) == "superseded"
    except WorkflowStepSupersededError:  # pragma: no cover - the failure being tested for
        pytest.fail("execute_step let WorkflowStepSupersededError escape")
    assert execute_step(current) == "succeeded"
    assert WorkflowStep.objects.get(run_id=run_id).result == 2


# -- operators: resume, cancel, retry_step ------------------------------------------------------


@workflow("tests.deployed-later")
def deployed_later(run: Any, input: Any) -> Any:
    return run.step("ghost", "tests.deployed-later.fn", {"x": 1}, retries=0)


def test_resume_after_deploy_runs_the_missing_step_as_a_new_attempt_granted_extra() -> None:
    run_id = start_workflow("tests.deployed-later", {})
    drain()
    assert run_of(run_id).status == RunStatus.SUSPENDED
    step_function("tests.deployed-later.fn")(lambda data, ctx: f"ran as attempt {ctx.attempt}")
    change = WorkflowRun.objects.resume(run_id)
    assert (change.run_id, change.before, change.after, change.steps) == (
        run_id,
        "suspended",
        "running",
        ("ghost",),
    )
    assert "ghost" in str(change)
    step = WorkflowStep.objects.get(run_id=run_id)
    assert (step.retries, step.attempt) == (1, 1), "no extra attempt was granted"
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()
    drain()
    run = run_of(run_id)
    assert (run.status, run.output, run.error) == (
        RunStatus.COMPLETED,
        "ran as attempt 2",
        None,
    )
    history = WorkflowStep.objects.history(run_id)
    assert [(h.attempt, h.status) for h in history] == [(1, "failed"), (2, "succeeded")]
    assert history[0].error["code"] == STEP_FUNCTION_NOT_FOUND


def test_resume_of_a_workflow_missing_at_pass_time_replays_it() -> None:
    run = WorkflowRun.objects.start("tests.deployed-elsewhere-then-here", {})
    drain()
    assert run_of(run.id).status == RunStatus.SUSPENDED
    workflow("tests.deployed-elsewhere-then-here")(lambda r, i: "here now")
    assert WorkflowRun.objects.resume(run.id).steps == ()
    drain()
    assert (run_of(run.id).status, run_of(run.id).output) == (RunStatus.COMPLETED, "here now")


def test_resume_of_a_failed_run_gives_its_failed_step_one_more_attempt() -> None:
    run_id = start_workflow("tests.flaky", {"fail_times": 1, "retries": 0})
    drain()
    assert run_of(run_id).status == RunStatus.FAILED
    change = WorkflowRun.objects.resume(run_id)
    assert (change.before, change.after, change.steps) == ("failed", "running", ("flaky",))
    run = run_of(run_id)
    assert (run.status, run.error, run.finished_at) == (RunStatus.RUNNING, None, None)
    drain()
    run = run_of(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "ok on attempt 2")
    assert [(h.attempt, h.status) for h in WorkflowStep.objects.history(run_id)] == [
        (1, "failed"),
        (2, "succeeded"),
    ]


def test_retry_step_reruns_a_failed_step_and_resumes_its_run() -> None:
    run_id = start_workflow("tests.flaky", {"fail_times": 1, "retries": 0})
    drain()
    change = WorkflowRun.objects.retry_step(run_id, "flaky")
    assert (change.before, change.after, change.steps) == ("failed", "running", ("flaky",))
    drain()
    assert run_of(run_id).output == "ok on attempt 2"


def test_retry_step_of_a_running_run_makes_a_waiting_retry_due_now() -> None:
    run_id = start_workflow("tests.flaky", {"fail_times": 1, "retries": 3})
    run_pass(run_id)
    WorkflowStep.objects.filter(run_id=run_id).update(retry_delay=3600)
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and execute_step(claim) == "failed"
    assert WorkflowStep.objects.claim_due(LEASE) is None, "due before its retry delay"
    change = WorkflowRun.objects.retry_step(run_id, "flaky")
    assert (change.before, change.after) == ("running", "running")
    assert WorkflowStep.objects.get(run_id=run_id).retries == 3, "an attempt was granted"
    again = WorkflowStep.objects.claim_due(LEASE)
    assert again is not None and again.attempt == 2


def test_operator_operations_refuse_wrong_states_and_unknown_ids_writing_nothing() -> None:
    from django_leases.exceptions import WorkflowRunStateError

    running = start_workflow("tests.linear", {"x": 1})
    done = start_workflow("tests.linear", {"x": 1})
    drain()
    running = start_workflow("tests.linear", {"x": 1})
    run_pass(running)
    before = {r.pk: (r.status, r.pass_requests) for r in WorkflowRun.objects.all()}
    with pytest.raises(WorkflowRunStateError, match="is running: only a suspended or failed"):
        WorkflowRun.objects.resume(running)
    with pytest.raises(WorkflowRunStateError, match="is completed"):
        WorkflowRun.objects.resume(done)
    with pytest.raises(WorkflowRunStateError, match="is completed: only a running or suspended"):
        WorkflowRun.objects.cancel(done)
    with pytest.raises(WorkflowRunStateError, match="step 'a' is pending; only a failed step"):
        WorkflowRun.objects.retry_step(running, "a")
    with pytest.raises(WorkflowRunStateError, match="finished run"):
        WorkflowRun.objects.retry_step(done, "a")
    with pytest.raises(WorkflowStep.DoesNotExist, match="no step named 'zz'"):
        WorkflowRun.objects.retry_step(running, "zz")
    for operation in (WorkflowRun.objects.resume, WorkflowRun.objects.cancel):
        with pytest.raises(WorkflowRun.DoesNotExist, match="No workflow run with id"):
            operation(uuid.uuid4())
        with pytest.raises(ValueError, match="not a workflow run id"):
            operation("not-a-uuid")
    assert {r.pk: (r.status, r.pass_requests) for r in WorkflowRun.objects.all()} == before


def test_cancel_stops_a_run_for_good() -> None:
    run_id = start_workflow("tests.linear", {"x": 1})
    run_pass(run_id)
    change = WorkflowRun.objects.cancel(run_id)
    assert (change.before, change.after, change.steps) == ("running", "cancelled", ())
    run = run_of(run_id)
    assert run.status == RunStatus.CANCELLED and run.pass_due_at is None
    assert run.finished_at is not None and run.error["code"] == "RUN_CANCELLED"
    assert WorkflowStep.objects.get(run_id=run_id).available_at is None
    assert WorkflowStep.objects.claim_due(LEASE) is None
    assert WorkflowRun.objects.claim_due_pass(30) is None
    assert run_pass(run_id) == "not-running"
    assert WorkflowRun.objects.request_pass(run_id) is False
    from django_leases.exceptions import WorkflowRunStateError

    with pytest.raises(WorkflowRunStateError, match="cancelled"):
        WorkflowRun.objects.resume(run_id)
    with pytest.raises(WorkflowRunStateError, match="cancelled"):
        WorkflowRun.objects.cancel(run_id)


def test_a_worker_whose_run_is_cancelled_mid_step_has_its_outcome_refused_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started, release = threading.Event(), threading.Event()
    name = "tests.blocks-until-released"

    def blocks(data: Any, ctx: Any) -> str:
        started.set()
        assert release.wait(60)
        return "done after the cancel"

    step_function(name)(blocks)
    run_id, claim = _claim_run("tests.fenced", "charge", name)
    outcome: list[str] = []
    with caplog.at_level(logging.WARNING, logger="django_leases.workflows"):
        worker = start_thread(lambda: outcome.append(execute_step(claim)))
        assert started.wait(60)
        change = WorkflowRun.objects.cancel(run_id)
        assert change.steps == ("charge",)
        assert not WorkflowStep.objects.refresh_lease(claim.step_id, LEASE, claim.attempt)
        release.set()
        worker.join(60)
    assert outcome == ["superseded"], "the worker's write was not refused cleanly"
    step = WorkflowStep.objects.get(run_id=run_id)
    assert (step.status, step.result, step.error["code"]) == ("failed", None, "RUN_CANCELLED")
    [entry] = WorkflowStep.objects.history(run_id)
    assert (entry.status, entry.result, entry.error["code"]) == ("failed", None, "RUN_CANCELLED")
    run = run_of(run_id)
    assert (run.status, run.pass_due_at) == (RunStatus.CANCELLED, None)
    assert any("cancelled" in r.getMessage() for r in caplog.records)


def test_a_worker_write_racing_a_cancel_lands_whole_or_not_at_all() -> None:
    from django_leases.exceptions import WorkflowStepCancelledError
    from django_leases.testing.workflows import run_together

    for i in range(16):
        run_id, claim = _claim_run("tests.fenced", "charge", "tests.add-one")

        def write(claim: Claim = claim) -> str:
            return WorkflowStep.objects.set_result(claim.step_id, "done", claim.attempt)

        def cancel(run_id: uuid.UUID = run_id) -> Any:
            return WorkflowRun.objects.cancel(run_id)

        calls = (write, cancel) if i % 2 else (cancel, write)
        outcomes = dict(zip([c.__name__ for c in calls], run_together(*calls), strict=True))
        assert outcomes["cancel"][1] is None, f"race {i}: {outcomes['cancel'][1]!r}"
        run = run_of(run_id)
        assert (run.status, run.pass_due_at) == (RunStatus.CANCELLED, None), f"race {i}"
        step = WorkflowStep.objects.get(run_id=run_id)
        [entry] = WorkflowStep.objects.history(run_id)
        if outcomes["write"][1] is None:
            assert (step.status, step.result) == ("succeeded", "done"), f"race {i}"
            assert (entry.status, entry.result) == ("succeeded", "done"), f"race {i}"
            assert outcomes["cancel"][0].steps == ()
        else:
            assert isinstance(outcomes["write"][1], WorkflowStepCancelledError), f"race {i}"
            assert (step.status, step.result) == ("failed", None), f"race {i}"
            assert (entry.status, entry.error["code"]) == ("failed", "RUN_CANCELLED")
        assert WorkflowStep.objects.claim_due(LEASE) is None
