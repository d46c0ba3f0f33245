"""The signals of runs and steps, on the tuned and the portable path: each sent once, when
what it says has committed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.dispatch import Signal

from django_leases import signals
from django_leases.exceptions import WorkflowStepSupersededError
from django_leases.models import StepStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import lapse_step_lease, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

WATCHED = (
    "run_started",
    "run_completed",
    "run_failed",
    "run_suspended",
    "run_cancelled",
    "step_attempt_started",
    "step_attempt_finished",
    "step_attempt_superseded",
)


@pytest.fixture(params=["tuned", "portable"])
def sent(request: pytest.FixtureRequest) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every watched signal sent while the test runs: ``(name, arguments)``."""
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for name in WATCHED:
        signal: Signal = getattr(signals, name)

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            seen.append((name, kwargs))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    with tuned_sql(request.param == "tuned"):
        yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def _names(seen: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in seen]


@step_function("tests.signals")
def returns(data: Any, ctx: Any) -> Any:
    if data.get("fail"):
        raise RuntimeError("asked to fail")
    return data


@workflow("tests.signals-two")
def two_steps(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.signals", {"n": 1})
    return [first, run.step("second", "tests.signals", {"n": 2, **input}, retries=0)]


def test_a_run_that_completes(sent: list[tuple[str, dict[str, Any]]]) -> None:
    run_id = start_workflow("tests.signals-two", {})
    assert Worker(1, step_lease_ttl=30).work_once() is True
    assert _names(sent) == [
        "run_started",
        "step_attempt_started",
        "step_attempt_finished",
        "step_attempt_started",
        "step_attempt_finished",
        "run_completed",
    ]
    assert sent[0][1] == {"run_id": run_id, "workflow": "tests.signals-two", "using": "default"}
    assert sent[-1][1]["run_id"] == run_id
    assert sent[-1][1]["output"] == [{"n": 1}, {"n": 2}]
    assert {kwargs["status"] for name, kwargs in sent if name == "step_attempt_finished"} == {
        StepStatus.SUCCEEDED
    }


def test_a_run_that_fails(sent: list[tuple[str, dict[str, Any]]]) -> None:
    run_id = start_workflow("tests.signals-two", {"fail": True})
    assert Worker(1, step_lease_ttl=30).work_once() is True
    assert _names(sent)[-2:] == ["step_attempt_finished", "run_failed"]
    assert sent[-2][1]["status"] == StepStatus.FAILED
    assert sent[-1][1]["run_id"] == run_id and sent[-1][1]["error"]["code"] == "STEP_FAILED"


def test_a_cancelled_run_and_a_superseded_write(sent: list[tuple[str, dict[str, Any]]]) -> None:
    run_id = start_workflow("tests.signals-two", {})
    WorkflowStep.objects.schedule(run_id, "first", "tests.signals", {"n": 1})
    stale = WorkflowStep.objects.claim_due(30)
    assert stale is not None
    lapse_step_lease(stale.step_id)
    current = WorkflowStep.objects.claim_due(30)
    assert current is not None and current.attempt == 2
    with pytest.raises(WorkflowStepSupersededError):
        WorkflowStep.objects.set_result(stale.step_id, "stale", stale.attempt)
    WorkflowRun.objects.cancel(run_id)
    names = _names(sent)
    assert names.count("step_attempt_started") == 2
    assert names[-3:] == ["step_attempt_superseded", "step_attempt_finished", "run_cancelled"]
    superseded = sent[-3][1]
    assert (superseded["attempt"], superseded["current_attempt"]) == (1, 2)


@workflow("tests.signals-missing")
def missing(run: Any, input: Any) -> Any:
    return run.step("only", "tests.signals-not-registered")


def test_a_run_suspended_for_a_missing_step_function(
    sent: list[tuple[str, dict[str, Any]]],
) -> None:
    run_id = start_workflow("tests.signals-missing", {})
    assert Worker(1, step_lease_ttl=30).work_once() is True
    assert _names(sent)[-2:] == ["step_attempt_finished", "run_suspended"]
    assert sent[-1][1]["run_id"] == run_id
    assert sent[-1][1]["error"]["code"] == "STEP_FUNCTION_NOT_FOUND"


def test_a_run_started_in_a_transaction_that_rolls_back_says_nothing(
    sent: list[tuple[str, dict[str, Any]]],
) -> None:
    from django.db import transaction

    with transaction.atomic():
        start_workflow("tests.signals-two", {})
        transaction.set_rollback(True)
    assert sent == []
