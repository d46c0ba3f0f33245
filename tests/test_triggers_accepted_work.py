"""What happens to the work a trigger source had accepted once it is disabled or orphaned.

The policy (docs/howto/trigger-sources.md, "Work already accepted"): disabling a source, or
removing its declaration, stops it *receiving*; deliveries it accepted before are the
project's work and go on. Each test pins one fact, for a disabled source and for an orphan:

1. a step the delivery's run had queued still runs, and the run completes;
2. a step that was running when the source went off records its result;
3. a step waiting for a retry is retried;
4. turning the source back on (or declaring it again) replays nothing: no delivery is
   recorded again and no run is started again, and a delivery refused meanwhile (404) was not
   recorded at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from django_leases.models import RunStatus, TriggerEvent, TriggerSource, WorkflowRun, WorkflowStep
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.workflows import step_function, workflow
from django_leases.workflows.driver import run_pass
from django_leases.workflows.engine import execute_step
from tests.helpers import drain

SOURCE = "accepted-work"
WORKFLOW = "tests.accepted-work"
BASE = "https://app.example.com"
LEASE = 60.0

pytestmark = pytest.mark.django_db(transaction=True)

#: Attempts the step function saw, in order: (delivery number, attempt).
_attempts: list[tuple[int, int]] = []


@step_function("tests.accepted-step")
def _accepted_step(data: dict[str, Any], ctx: Any) -> str:
    _attempts.append((data["n"], ctx.attempt))
    if ctx.attempt <= data.get("fail_times", 0):
        raise RuntimeError(f"failure on attempt {ctx.attempt}")
    return f"done {data['n']}"


@workflow(WORKFLOW)
def _accepted_workflow(run: Any, input: dict[str, Any]) -> Any:
    return run.step("work", "tests.accepted-step", input, retries=2, retry_delay=0)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    """Source ``accepted-work`` (fake provider), declared, reconciled and enabled."""
    _attempts.clear()
    with installed_provider(FakeProvider("fake")) as provider:
        webhook_source(SOURCE, provider="fake", events={"push": StartWorkflow(WORKFLOW)})
        try:
            lifecycle.reconcile(base_url=BASE)
            lifecycle.enable(SOURCE)
            yield provider
        finally:
            if registry.get_declaration(SOURCE) is not None:
                registry.unregister(SOURCE)


def _deliver(fake: FakeProvider, payload: dict[str, Any], delivery: str | None = None) -> Any:
    body = json.dumps(payload).encode()
    secret = credentials.get_secret(SOURCE)
    assert secret
    return Client().post(
        f"/hooks/{SOURCE}/",
        data=body,
        content_type="application/json",
        HTTP_X_FAKE_EVENT="push",
        HTTP_X_FAKE_DELIVERY=delivery or str(uuid.uuid4()),
        HTTP_X_FAKE_SIGNATURE=fake.sign(secret, body),
    )


def _accepted(fake: FakeProvider, payload: dict[str, Any]) -> uuid.UUID:
    response = _deliver(fake, payload)
    assert response.status_code == 202, response.content
    return uuid.UUID(response.json()["run_id"])


def _stop_receiving(how: str) -> None:
    if how == "disabled":
        lifecycle.disable(SOURCE)
    else:
        registry.unregister(SOURCE)
        lifecycle.reconcile()
    row = TriggerSource.objects.get(name=SOURCE)
    assert not (row.declared and row.enabled)


def _receive_again(how: str) -> None:
    if how == "disabled":
        lifecycle.enable(SOURCE)
    else:
        webhook_source(SOURCE, provider="fake", events={"push": StartWorkflow(WORKFLOW)})
        lifecycle.reconcile()
    assert TriggerSource.objects.receivable(SOURCE) is not None


def _run(run_id: uuid.UUID) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


BOTH = pytest.mark.parametrize("how", ["disabled", "orphaned"])


@BOTH
def test_a_queued_step_still_runs(fake: FakeProvider, how: str) -> None:
    run_id = _accepted(fake, {"n": 1})
    _stop_receiving(how)
    drain()
    run = _run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done 1")
    assert _attempts == [(1, 1)]


@BOTH
def test_a_running_steps_result_lands(fake: FakeProvider, how: str) -> None:
    run_id = _accepted(fake, {"n": 2})
    assert run_pass(run_id) == "waiting"  # the first pass schedules the step
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and claim.run_id == run_id  # running now, on "a worker"
    _stop_receiving(how)
    assert execute_step(claim) == "succeeded"
    step = WorkflowStep.objects.get(run_id=run_id, step_name="work")
    assert (step.status, step.result, step.attempt) == ("succeeded", "done 2", 1)
    drain()
    assert _run(run_id).status == RunStatus.COMPLETED


@BOTH
def test_a_pending_retry_runs(fake: FakeProvider, how: str) -> None:
    run_id = _accepted(fake, {"n": 3, "fail_times": 1})
    assert run_pass(run_id) == "waiting"
    claim = WorkflowStep.objects.claim_due(LEASE)
    assert claim is not None and execute_step(claim) == "failed"  # a retry is due
    step = WorkflowStep.objects.get(run_id=run_id, step_name="work")
    assert (step.status, step.attempt) == ("failed", 1)
    _stop_receiving(how)
    drain()
    assert _attempts == [(3, 1), (3, 2)]
    run = _run(run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "done 3")


@BOTH
def test_receiving_again_replays_nothing(fake: FakeProvider, how: str) -> None:
    first = _accepted(fake, {"n": 4})
    drain()
    _stop_receiving(how)
    refused = _deliver(fake, {"n": 5}, delivery="sent-while-off")
    assert refused.status_code == 404
    events = list(TriggerEvent.objects.values_list("delivery_id", flat=True))
    runs = list(WorkflowRun.objects.values_list("pk", flat=True))
    assert runs == [first] and "sent-while-off" not in events

    _receive_again(how)
    drain()
    assert list(TriggerEvent.objects.values_list("delivery_id", flat=True)) == events
    assert list(WorkflowRun.objects.values_list("pk", flat=True)) == runs
    assert _attempts == [(4, 1)]
    # The provider's own retry of the refused delivery is a new delivery, accepted once.
    assert _deliver(fake, {"n": 5}, delivery="sent-while-off").status_code == 202
    assert _deliver(fake, {"n": 5}, delivery="sent-while-off").status_code == 200
    assert WorkflowRun.objects.count() == 2
