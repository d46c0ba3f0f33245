"""The workflow store on the real database: claim rules, attempt-fenced writes, history.

Ported in our own words from the reference workflow-fencing tests (F1–F7) and DESIGN §5's
claim rules. Every scenario with a stale attempt makes it the way a dead worker would: claim,
lapse the lease on the database clock, claim again.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.utils import timezone

from django_leases.clock import db_now_plus
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import (
    AttemptStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows.states import STEP_LEASE_LAPSED, STEP_RESULT_NOT_JSON
from django_leases.workflows.store import Claim

pytestmark = pytest.mark.django_db(transaction=True)

STEP = "charge"
FUNCTION = "charge:card"
LEASE = 60.0
RACES = 25


# -- harness -------------------------------------------------------------------------------------


def start_run(*, retries: int = 5, retry_delay: float = 0.0, step: str = STEP) -> uuid.UUID:
    run = WorkflowRun.objects.start("fenced", {})
    WorkflowStep.objects.schedule(
        run.id, step, FUNCTION, {"amount": 10}, retries=retries, retry_delay=retry_delay
    )
    return run.id


def claim(run_id: uuid.UUID, step: str = STEP, ttl: float = LEASE) -> Claim | None:
    return WorkflowStep.objects.claim_for_execution(run_id, step, FUNCTION, ttl)


def lapse(run_id: uuid.UUID, step: str = STEP) -> None:
    """Make the step lease read as lapsed on the database clock, as when its worker died."""
    WorkflowStep.objects.filter(run_id=run_id, step_name=step).update(
        lease_expires_at=db_now_plus(-1)
    )


def step_of(run_id: uuid.UUID, step: str = STEP) -> WorkflowStep:
    return WorkflowStep.objects.get(run_id=run_id, step_name=step)


def lease_is_live(run_id: uuid.UUID, step: str = STEP) -> bool:
    return WorkflowStep.objects.filter(
        run_id=run_id, step_name=step, lease_expires_at__gt=Now()
    ).exists()


def attempts_of(run_id: uuid.UUID) -> list[dict[str, Any]]:
    return list(
        WorkflowStepAttempt.objects.filter(step__run_id=run_id)
        .order_by("id")
        .values("attempt", "status", "result", "error", "finished_at")
    )


def run_together(*calls: Any) -> list[tuple[Any, BaseException | None]]:
    """Run each call on its own thread, released together by a barrier; (value, error) each."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[index] = (calls[index](), None)
        except BaseException as exc:
            outcomes[index] = (None, exc)
        finally:
            connections.close_all()  # each thread's own connection

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    return outcomes


def supersede(run_id: uuid.UUID) -> tuple[Claim, Claim]:
    """Claim the step, lose its worker, claim it again."""
    stale = claim(run_id)
    assert stale is not None, "the first dispatch did not get the step"
    lapse(run_id)
    current = claim(run_id)
    assert current is not None, "the lapsed step was not claimed again"
    assert current.attempt == stale.attempt + 1
    return stale, current


# -- claim rules ---------------------------------------------------------------------------------


def test_pending_step_is_claimed_at_its_first_attempt_with_a_live_lease() -> None:
    run_id = start_run()
    got = claim(run_id)
    assert got is not None
    assert (got.attempt, got.step_name, got.function_name, got.run_id) == (
        1,
        STEP,
        FUNCTION,
        run_id,
    )
    assert got.data == {"amount": 10}
    step = step_of(run_id)
    assert (step.status, step.attempt) == (StepStatus.RUNNING, 1)
    assert lease_is_live(run_id)
    assert [(a["attempt"], a["status"]) for a in attempts_of(run_id)] == [(1, "running")]


def test_scheduled_step_is_claimed_at_the_same_attempt() -> None:
    run_id = start_run()
    WorkflowStep.objects.filter(run_id=run_id).update(status=StepStatus.SCHEDULED, attempt=3)
    got = claim(run_id)
    assert got is not None and got.attempt == 3
    assert step_of(run_id).attempt == 3


def test_succeeded_step_is_not_claimed() -> None:
    run_id = start_run()
    first = claim(run_id)
    assert first is not None
    WorkflowStep.objects.set_result(first.step_id, {"ok": True}, first.attempt)
    assert claim(run_id) is None
    lapse(run_id)
    assert claim(run_id) is None
    assert step_of(run_id).attempt == 1


def test_running_step_with_a_live_lease_is_not_claimed_and_not_touched() -> None:
    run_id = start_run()
    assert claim(run_id) is not None
    before = step_of(run_id)
    assert claim(run_id) is None
    after = step_of(run_id)
    assert (after.attempt, after.status, after.lease_expires_at) == (
        before.attempt,
        before.status,
        before.lease_expires_at,
    )
    assert len(attempts_of(run_id)) == 1


def test_lapsed_step_is_claimed_as_the_next_attempt_with_a_new_attempt_row() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    assert (stale.attempt, current.attempt) == (1, 2)
    assert lease_is_live(run_id)
    assert [(a["attempt"], a["status"]) for a in attempts_of(run_id)] == [
        (1, "running"),
        (2, "running"),
    ]


def test_failed_step_with_attempts_left_is_claimed_as_the_next_attempt() -> None:
    run_id = start_run(retries=2)
    first = claim(run_id)
    assert first is not None
    assert WorkflowStep.objects.set_error(first.step_id, "declined", 1) == StepStatus.FAILED
    second = claim(run_id)
    assert second is not None and second.attempt == 2
    step = step_of(run_id)
    assert (step.status, step.error) == (StepStatus.RUNNING, None)


def test_failed_step_waits_for_its_retry_delay_on_the_database_clock() -> None:
    run_id = start_run(retries=2, retry_delay=3600)
    first = claim(run_id)
    assert first is not None
    WorkflowStep.objects.set_error(first.step_id, "declined", 1)
    assert WorkflowStep.objects.filter(run_id=run_id, available_at__gt=db_now_plus(3500)).exists()
    assert claim(run_id) is None, "claimed before its retry delay passed"
    assert WorkflowStep.objects.claim_due(LEASE) is None
    WorkflowStep.objects.filter(run_id=run_id).update(available_at=db_now_plus(-1))
    second = claim(run_id)
    assert second is not None and second.attempt == 2


def test_failed_step_out_of_attempts_is_not_claimed() -> None:
    run_id = start_run(retries=1)
    for attempt in (1, 2):
        got = claim(run_id)
        assert got is not None and got.attempt == attempt
        WorkflowStep.objects.set_error(got.step_id, f"declined {attempt}", attempt)
    assert claim(run_id) is None
    assert WorkflowStep.objects.claim_due(LEASE) is None
    step = step_of(run_id)
    assert (step.status, step.attempt, step.error["message"]) == ("failed", 2, "declined 2")


def test_lapsed_step_out_of_attempts_fails_as_having_lost_its_worker() -> None:
    run_id = start_run(retries=1)
    requests_before = WorkflowRun.objects.get(pk=run_id).pass_requests
    _stale, current = supersede(run_id)
    lapse(run_id)
    assert claim(run_id) is None
    step = step_of(run_id)
    assert step.status == StepStatus.FAILED
    assert step.attempt == 2
    assert step.error["code"] == STEP_LEASE_LAPSED
    assert "lost its worker on every attempt" in step.error["message"]
    assert step.lease_expires_at is None
    history = attempts_of(run_id)
    assert [(a["attempt"], a["status"]) for a in history] == [(1, "running"), (2, "failed")]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.pass_requests > requests_before, "the run was not asked for a pass"
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(current.step_id, "late", current.attempt)


def test_a_different_function_name_is_refused_before_any_write() -> None:
    run_id = start_run()
    with pytest.raises(ValueError, match="charge:card"):
        WorkflowStep.objects.claim_for_execution(run_id, STEP, "refund:card", LEASE)
    step = step_of(run_id)
    assert (step.status, step.lease_expires_at) == (StepStatus.PENDING, None)
    assert attempts_of(run_id) == []


def test_claim_bad_input_is_refused() -> None:
    run_id = start_run()
    with pytest.raises(WorkflowStep.DoesNotExist):
        WorkflowStep.objects.claim_for_execution(run_id, "nope", FUNCTION, LEASE)
    for ttl in (0, -1, float("nan"), "30"):
        with pytest.raises(ValueError):
            WorkflowStep.objects.claim_for_execution(run_id, STEP, FUNCTION, ttl)  # type: ignore[arg-type]
    assert step_of(run_id).status == StepStatus.PENDING


def test_steps_of_a_run_that_is_not_running_are_not_claimed() -> None:
    run_id = start_run()
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.SUSPENDED)
    assert claim(run_id) is None
    assert WorkflowStep.objects.claim_due(LEASE) is None


def test_a_lease_is_live_or_lapsed_by_the_database_clock_not_the_application_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = start_run()
    assert claim(run_id, ttl=600) is not None
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    assert claim(run_id) is None, "an application clock an hour ahead lapsed the lease"
    lapse(run_id)
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(hours=1))
    got = claim(run_id)
    assert got is not None and got.attempt == 2


def test_only_one_of_eight_concurrent_claimers_gets_the_step() -> None:
    for round_ in range(4):
        run_id = start_run()
        if round_ % 2:  # odd rounds race for a lapsed step instead of a pending one
            assert claim(run_id) is not None
            lapse(run_id)
        outcomes = run_together(*[lambda run_id=run_id: claim(run_id)] * 8)
        errors = [error for _, error in outcomes if error is not None]
        assert not errors, errors
        claims = [value for value, _ in outcomes]
        winners = [c for c in claims if c is not None]
        assert len(claims) == 8
        assert len(winners) == 1, f"round {round_}: {len(winners)} claimers won"
        expected = 1 + round_ % 2
        assert winners[0].attempt == expected
        assert step_of(run_id).attempt == expected
        assert len(attempts_of(run_id)) == expected


# -- fenced writes (F1–F7) --------------------------------------------------------------------


def test_stale_result_is_refused_and_the_current_result_lands() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    history_before = attempts_of(run_id)
    with pytest.raises(WorkflowStepSupersededError) as refused:
        WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
    assert refused.value.attempt == stale.attempt
    assert refused.value.current_attempt == current.attempt
    assert attempts_of(run_id) == history_before, "the refused write touched the history"
    WorkflowStep.objects.set_result(current.step_id, "fresh", current.attempt)
    step = step_of(run_id)
    assert (step.status, step.result, step.attempt) == ("succeeded", "fresh", current.attempt)
    assert step.lease_expires_at is None
    history = WorkflowStep.objects.history(run_id)
    assert [(h.step.step_name, h.attempt, h.status) for h in history] == [
        (STEP, 1, "running"),
        (STEP, 2, "succeeded"),
    ]
    assert history[0].result is None and history[0].finished_at is None
    assert history[1].result == "fresh" and history[1].finished_at is not None


def test_stale_error_is_refused_and_does_not_fail_the_step() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    history_before = attempts_of(run_id)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_error(stale.step_id, RuntimeError("stale"), stale.attempt)
    step = step_of(run_id)
    assert (step.status, step.error, step.attempt) == ("running", None, current.attempt)
    assert attempts_of(run_id) == history_before


def test_stale_attempt_can_neither_renew_nor_release_the_current_lease() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    held = step_of(run_id).lease_expires_at
    assert WorkflowStep.objects.refresh_lease(stale.step_id, 10 * LEASE, stale.attempt) is False
    assert step_of(run_id).lease_expires_at == held, "the stale renewal landed"
    assert WorkflowStep.objects.refresh_lease(stale.step_id, None, stale.attempt) is False
    assert step_of(run_id).lease_expires_at == held, "the stale release landed"
    assert WorkflowStep.objects.refresh_lease(current.step_id, 10 * LEASE, current.attempt)
    assert WorkflowStep.objects.filter(
        run_id=run_id, lease_expires_at__gt=db_now_plus(5 * LEASE)
    ).exists()
    assert WorkflowStep.objects.refresh_lease(current.step_id, None, current.attempt)
    assert step_of(run_id).lease_expires_at is None


def test_stale_attempt_cannot_overwrite_a_step_the_current_attempt_succeeded() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    WorkflowStep.objects.set_result(current.step_id, "fresh", current.attempt)
    history_before = attempts_of(run_id)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_error(stale.step_id, "stale", stale.attempt)
    step = step_of(run_id)
    assert (step.status, step.result, step.error) == ("succeeded", "fresh", None)
    assert attempts_of(run_id) == history_before


def test_stale_attempt_cannot_overwrite_a_step_the_current_attempt_failed() -> None:
    run_id = start_run()
    stale, current = supersede(run_id)
    WorkflowStep.objects.set_error(current.step_id, RuntimeError("fresh"), current.attempt)
    history_before = attempts_of(run_id)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
    step = step_of(run_id)
    assert step.status == "failed"
    assert step.error == {"type": "RuntimeError", "message": "fresh"}
    assert step.result is None
    assert attempts_of(run_id) == history_before


def test_current_attempt_cannot_write_twice() -> None:
    run_id = start_run()
    got = claim(run_id)
    assert got is not None
    WorkflowStep.objects.set_result(got.step_id, 1, got.attempt)
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(got.step_id, 2, got.attempt)
    assert step_of(run_id).result == 1


def test_racing_stale_and_current_writes_only_the_current_ever_lands() -> None:
    for i in range(RACES):
        run_id = start_run()
        stale, current = supersede(run_id)

        def stale_write(stale: Claim = stale, i: int = i) -> None:
            if i % 2 == 0:
                WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
            else:
                WorkflowStep.objects.set_error(stale.step_id, RuntimeError("stale"), stale.attempt)

        def current_write(current: Claim = current) -> None:
            WorkflowStep.objects.set_result(current.step_id, "fresh", current.attempt)

        if i % 3:
            (_, stale_error), (_, current_error) = run_together(stale_write, current_write)
        else:
            (_, current_error), (_, stale_error) = run_together(current_write, stale_write)
        outcomes = {"stale": stale_error, "current": current_error}
        assert isinstance(outcomes["stale"], WorkflowStepSupersededError), f"race {i}"
        assert outcomes["current"] is None, f"race {i}: {outcomes['current']!r}"
        step = step_of(run_id)
        assert (step.status, step.result, step.error) == ("succeeded", "fresh", None), f"race {i}"
        history = attempts_of(run_id)
        assert [(a["attempt"], a["status"], a["result"], a["error"]) for a in history] == [
            (1, "running", None, None),
            (2, "succeeded", "fresh", None),
        ], f"race {i}"


def test_a_third_claim_fences_out_both_attempts_before_it() -> None:
    run_id = start_run()
    first, second = supersede(run_id)
    lapse(run_id)
    third = claim(run_id)
    assert third is not None and third.attempt == second.attempt + 1 == 3
    held = step_of(run_id).lease_expires_at
    for stale in (first, second):
        with pytest.raises(WorkflowStepSupersededError):
            WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
        with pytest.raises(WorkflowStepSupersededError):
            WorkflowStep.objects.set_error(stale.step_id, "stale", stale.attempt)
        assert not WorkflowStep.objects.refresh_lease(stale.step_id, 10 * LEASE, stale.attempt)
    assert step_of(run_id).lease_expires_at == held
    WorkflowStep.objects.set_result(third.step_id, "third", third.attempt)
    step = step_of(run_id)
    assert (step.status, step.result) == ("succeeded", "third")
    assert [(a["attempt"], a["status"]) for a in attempts_of(run_id)] == [
        (1, "running"),
        (2, "running"),
        (3, "succeeded"),
    ]


def test_a_slow_worker_nobody_replaced_may_still_finish() -> None:
    run_id = start_run()
    got = claim(run_id)
    assert got is not None
    lapse(run_id)
    WorkflowStep.objects.set_result(got.step_id, "late but alone", got.attempt)
    assert step_of(run_id).result == "late but alone"


# -- outcomes, JSON and history -----------------------------------------------------------------


def test_set_result_asks_the_run_for_a_pass_in_the_same_transaction() -> None:
    run_id = start_run()
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=None)
    got = claim(run_id)
    assert got is not None
    WorkflowStep.objects.set_result(got.step_id, {"paid": 10}, got.attempt)
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()


def test_set_error_with_attempts_left_schedules_a_retry_without_a_pass() -> None:
    run_id = start_run(retries=3, retry_delay=30)
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=None)
    got = claim(run_id)
    assert got is not None
    WorkflowStep.objects.set_error(got.step_id, {"message": "try later", "code": 503}, 1)
    step = step_of(run_id)
    assert step.error == {"message": "try later", "code": 503}
    assert WorkflowStep.objects.filter(
        pk=got.step_id, available_at__gt=db_now_plus(20), available_at__lte=db_now_plus(40)
    ).exists()
    assert WorkflowRun.objects.get(pk=run_id).pass_due_at is None


def test_set_error_on_the_last_attempt_asks_the_run_for_a_pass() -> None:
    run_id = start_run(retries=0)
    WorkflowRun.objects.filter(pk=run_id).update(pass_due_at=None)
    got = claim(run_id)
    assert got is not None
    WorkflowStep.objects.set_error(got.step_id, ValueError("bad card"), 1)
    assert step_of(run_id).available_at is None
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__lte=Now()).exists()


@pytest.mark.parametrize(
    "result",
    [object(), {"x": float("nan")}, {"when": timezone.now()}, "nul\x00byte", {1j: 1}],
    ids=["object", "nan", "datetime", "nul", "complex-key"],
)
def test_a_result_that_is_not_json_fails_the_step_with_a_clear_error(result: Any) -> None:
    run_id = start_run()
    got = claim(run_id)
    assert got is not None
    assert WorkflowStep.objects.set_result(got.step_id, result, got.attempt) == "failed"
    step = step_of(run_id)
    assert step.status == StepStatus.FAILED
    assert step.result is None
    assert step.error["code"] == STEP_RESULT_NOT_JSON
    assert "JSON" in step.error["message"] or "NUL" in step.error["message"]
    [entry] = WorkflowStep.objects.history(run_id)
    assert (entry.status, entry.result, entry.error) == (AttemptStatus.FAILED, None, step.error)
    again = claim(run_id)
    assert again is not None and again.attempt == 2, "the failure did not leave a retry"


def test_history_has_one_entry_per_attempt_oldest_first() -> None:
    run = WorkflowRun.objects.start("fenced", {})
    WorkflowStep.objects.schedule(run.id, "first", FUNCTION, retries=3)
    a1 = claim(run.id, "first")
    assert a1 is not None
    WorkflowStep.objects.set_error(a1.step_id, "boom", a1.attempt)
    a2 = claim(run.id, "first")
    assert a2 is not None
    lapse(run.id, "first")
    a3 = claim(run.id, "first")
    assert a3 is not None
    WorkflowStep.objects.set_result(a3.step_id, "ok", a3.attempt)
    WorkflowStep.objects.schedule(run.id, "second", FUNCTION)
    b1 = claim(run.id, "second")
    assert b1 is not None
    WorkflowStep.objects.set_result(b1.step_id, [1, 2], b1.attempt)
    history = WorkflowStep.objects.history(run.id)
    assert [(h.step.step_name, h.attempt, h.status, h.result) for h in history] == [
        ("first", 1, "failed", None),
        ("first", 2, "running", None),
        ("first", 3, "succeeded", "ok"),
        ("second", 1, "succeeded", [1, 2]),
    ]
    assert history[0].error == {"message": "boom"}
    assert all(h.started_at is not None for h in history)


# -- bad input ---------------------------------------------------------------------------------


def test_schedule_is_idempotent_and_refuses_a_different_function() -> None:
    run = WorkflowRun.objects.start("fenced", {})
    one = WorkflowStep.objects.schedule(run.id, STEP, FUNCTION, {"a": 1})
    two = WorkflowStep.objects.schedule(run.id, STEP, FUNCTION, {"a": 2})
    assert one.pk == two.pk and two.data == {"a": 1}
    with pytest.raises(ValueError, match="recorded with step function"):
        WorkflowStep.objects.schedule(run.id, STEP, "other")
    assert WorkflowStep.objects.filter(run=run).count() == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"step_name": ""},
        {"step_name": "x" * 201},
        {"function_name": 7},
        {"data": {"x": object()}},
        {"retries": -1},
        {"retries": True},
        {"retry_delay": -1},
        {"retry_delay": float("inf")},
    ],
)
def test_schedule_bad_input_writes_nothing(kwargs: dict[str, Any]) -> None:
    run = WorkflowRun.objects.start("fenced", {})
    args: dict[str, Any] = {"step_name": STEP, "function_name": FUNCTION, "data": {}}
    extra = {k: kwargs.pop(k) for k in ("retries", "retry_delay") if k in kwargs}
    args.update(kwargs)
    with pytest.raises(ValueError):
        WorkflowStep.objects.schedule(run.id, **args, **extra)
    assert not WorkflowStep.objects.filter(run=run).exists()


def test_fenced_writes_refuse_bad_attempts_and_unknown_steps() -> None:
    run_id = start_run()
    got = claim(run_id)
    assert got is not None
    for attempt in (0, -1, "1", None, True):
        with pytest.raises(ValueError):
            WorkflowStep.objects.set_result(got.step_id, 1, attempt)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            WorkflowStep.objects.refresh_lease(got.step_id, 10, attempt)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        WorkflowStep.objects.refresh_lease(got.step_id, 0, got.attempt)
    with pytest.raises(WorkflowStep.DoesNotExist):
        WorkflowStep.objects.set_result(got.step_id + 1000, 1, 1)
    with pytest.raises(WorkflowStep.DoesNotExist):
        WorkflowStep.objects.set_error(got.step_id + 1000, "x", 1)
    assert step_of(run_id).status == StepStatus.RUNNING


def test_start_refuses_input_that_is_not_json() -> None:
    with pytest.raises(ValueError, match="JSON"):
        WorkflowRun.objects.start("fenced", {"at": object()})
    with pytest.raises(ValueError):
        WorkflowRun.objects.start("", {})
    assert not WorkflowRun.objects.exists()
