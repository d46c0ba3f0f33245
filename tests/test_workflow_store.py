"""The workflow store on the real database: claim rules, attempt-fenced writes, history.

The claim rules (C1–C12) and the fencing rules (F1–F12) are the shipped conformance suite
(``django_leases.testing.workflows``, run by ``test_workflow_conformance.py``); this file
covers the rest of the store: the worker's pick, outcomes and JSON, history, bad input.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from django_leases.clock import db_now_plus
from django_leases.models import (
    AttemptStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows.values import STEP_RESULT_NOT_JSON, Claim
from tests.helpers import lapse_step_lease, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

STEP = "charge"
FUNCTION = "charge:card"
LEASE = 60.0


# -- harness -------------------------------------------------------------------------------------


def start_run(*, retries: int = 5, retry_delay: float = 0.0, step: str = STEP) -> uuid.UUID:
    run = WorkflowRun.objects.start("fenced", {})
    WorkflowStep.objects.schedule(
        run.id, step, FUNCTION, {"amount": 10}, retries=retries, retry_delay=retry_delay
    )
    return run.id


def claim(run_id: uuid.UUID, step: str = STEP, ttl: float = LEASE) -> Claim | None:
    return WorkflowStep.objects.claim_for_execution(run_id, step, FUNCTION, ttl)


def step_of(run_id: uuid.UUID, step: str = STEP) -> WorkflowStep:
    return WorkflowStep.objects.get(run_id=run_id, step_name=step)


def attempts_of(run_id: uuid.UUID) -> list[dict[str, Any]]:
    return list(
        WorkflowStepAttempt.objects.filter(step__run_id=run_id)
        .order_by("id")
        .values("attempt", "status", "result", "error", "finished_at")
    )


# -- claims (the rules themselves: django_leases.testing.workflows, C1–C12) ---------------------


def test_claim_bad_input_is_refused() -> None:
    run_id = start_run()
    with pytest.raises(WorkflowStep.DoesNotExist):
        WorkflowStep.objects.claim_for_execution(run_id, "nope", FUNCTION, LEASE)
    for ttl in (0, -1, float("nan"), "30"):
        with pytest.raises(ValueError):
            WorkflowStep.objects.claim_for_execution(run_id, STEP, FUNCTION, ttl)  # type: ignore[arg-type]
    assert step_of(run_id).status == StepStatus.PENDING


def test_claim_takes_a_run_id_as_text_as_every_other_method_does() -> None:
    run_id = start_run()
    with pytest.raises(ValueError, match="not a workflow run id"):
        WorkflowStep.objects.claim_for_execution("not-a-uuid", STEP, FUNCTION, LEASE)
    assert step_of(run_id).status == StepStatus.PENDING
    got = WorkflowStep.objects.claim_for_execution(f" {run_id} ", STEP, FUNCTION, LEASE)
    assert got is not None and got.run_id == run_id


def test_claim_due_skips_what_is_not_due_yet_out_of_attempts_or_not_running() -> None:
    """The worker's pick (``claim_due``) follows the claim rules: a retry waits for its
    delay, a step out of attempts and a step of a run that is not running are left alone."""
    waiting = start_run(retries=2, retry_delay=3600)
    first = claim(waiting)
    assert first is not None
    WorkflowStep.objects.set_error(first.step_id, "declined", 1)
    exhausted = start_run(retries=0)
    only = claim(exhausted)
    assert only is not None
    WorkflowStep.objects.set_error(only.step_id, "declined", 1)
    suspended = start_run()
    WorkflowRun.objects.filter(pk=suspended).update(status=RunStatus.SUSPENDED)
    assert WorkflowStep.objects.claim_due(LEASE) is None
    WorkflowStep.objects.filter(run_id=waiting).update(available_at=db_now_plus(-1))
    got = WorkflowStep.objects.claim_due(LEASE)
    assert got is not None and (got.run_id, got.attempt) == (waiting, 2)
    assert WorkflowStep.objects.claim_due(LEASE) is None


def test_claim_due_takes_a_lapsed_step_as_its_next_attempt() -> None:
    run_id = start_run()
    assert WorkflowStep.objects.claim_due(LEASE) is not None
    assert WorkflowStep.objects.claim_due(LEASE) is None, "a live step was picked"
    lapse_step_lease(run_id=run_id, step_name=STEP)
    again = WorkflowStep.objects.claim_due(LEASE)
    assert again is not None and again.attempt == 2


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
    assert WorkflowStep.objects.set_result(got.step_id, result, got.attempt).status == "failed"
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
    lapse_step_lease(run_id=run.id, step_name="first")
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


# -- indexes -------------------------------------------------------------------------------------


@pytest.mark.postgres_only
def test_finding_due_work_can_use_the_partial_indexes() -> None:
    """The queries a worker sends to find work (``claim_due``, ``claim_due_pass``,
    ``work_due_within``) can be planned on the partial indexes ``dl_step_running``,
    ``dl_step_claim_order`` and ``dl_run_pass_due`` (sequential scans and sorts off, as a tiny
    table would otherwise get them). At a million rows the planner picks these indexes on its
    own: ``bench/explain_workflow_due_work.py``."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    start_run()  # something to find, so every query of claim_due runs
    with transaction.atomic():
        WorkflowRun.objects.filter(status="running").update(pass_due_at=db_now_plus(3600))
        WorkflowStep.objects.update(available_at=db_now_plus(3600))
        with CaptureQueriesContext(connection) as captured:
            # The portable claim's reads (a worker of every queue, some of them limited,
            # claims with one read of each queue's first due step on the tuned path since
            # 0040; the portable path's two reads are the ones planned here).
            with tuned_sql(False):
                assert WorkflowStep.objects.claim_due(LEASE) is None
            assert WorkflowRun.objects.claim_due_pass(LEASE) is None  # one WITH … UPDATE
            assert WorkflowRun.objects.work_due_within(1.0) is False
        transaction.set_rollback(True)
    selects = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().startswith(("SELECT", "UPDATE", "WITH"))
    ]
    assert len(selects) == 5, selects
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")  # as at scale: read in due order
        for sql in selects:
            cursor.execute("EXPLAIN " + sql)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
        transaction.set_rollback(True)
    text = "\n".join(plans)
    assert "Seq Scan" not in text, text
    expected = [
        ("dl_step_running",),  # claim_due: a running step whose lease lapsed
        # claim_due: a waiting step now available, in claim order (priority, then due)
        ("dl_step_claim_order",),
        ("dl_run_pass_due",),  # claim_due_pass, in due order
        ("Index Scan",),  # work_due_within, any run due soon: any index (tiny tables)
        ("Index Scan",),  # work_due_within, any step due soon: any index
    ]
    for names, plan in zip(expected, plans, strict=True):
        assert any(name in plan for name in names), plan
