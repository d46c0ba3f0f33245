"""Webhooks meet runs (DESIGN §5a): a ``SendEvent(name, run=...)`` handler turns an accepted
delivery into an event for the run it names, in the transaction that records the delivery —
here a pull-request run started by ``pull_request`` (keyed by the PR number) waits for an
approving ``pull_request_review``. A delivery for no waiting run is recorded with that
outcome, never an error."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from django_leases.models import RunStatus, TriggerEvent, WorkflowRun, WorkflowWait
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import SendEvent, StartWorkflow, run_for_key, webhook_source
from django_leases.workflows import workflow
from django_leases.workflows.values import WaitStatus
from tests.helpers import drain

SOURCE = "pr-reviews"
WORKFLOW = "tests.pr-review"
BASE = "https://app.example.com"

pytestmark = pytest.mark.django_db(transaction=True)


@workflow(WORKFLOW)
def _pr_review(run: Any, pull_request: dict[str, Any]) -> Any:
    review = run.wait_for_event("approved")
    return {"pr": pull_request["number"], "approved_by": review["review"]["user"]["login"]}


def _approved_run(delivery: Any) -> uuid.UUID | None:
    """The run of the PR a review delivery is about — only for an approving review."""
    if delivery.payload.get("review", {}).get("state") != "approved":
        return None
    return run_for_key(WORKFLOW, str(delivery.payload["pull_request"]["number"]))


def _declare() -> None:
    webhook_source(
        SOURCE,
        provider="fake",
        events={
            "pull_request": StartWorkflow(
                WORKFLOW, key=lambda d: str(d.payload["pull_request"]["number"])
            ),
            "pull_request_review": SendEvent("approved", run=_approved_run),
        },
    )


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with installed_provider(FakeProvider("fake")) as provider:
        _declare()
        try:
            lifecycle.reconcile(base_url=BASE)
            lifecycle.enable(SOURCE)
            yield provider
        finally:
            if registry.get_declaration(SOURCE) is not None:
                registry.unregister(SOURCE)


def _deliver(fake: FakeProvider, event: str, payload: dict[str, Any]) -> Any:
    body = json.dumps(payload).encode()
    secret = credentials.get_secret(SOURCE)
    assert secret
    return Client().post(
        f"/hooks/{SOURCE}/",
        data=body,
        content_type="application/json",
        HTTP_X_FAKE_EVENT=event,
        HTTP_X_FAKE_DELIVERY=str(uuid.uuid4()),
        HTTP_X_FAKE_SIGNATURE=fake.sign(secret, body),
    )


def _opened(number: int) -> dict[str, Any]:
    return {"action": "opened", "number": number, "pull_request": {"number": number}}


def _review(number: int, state: str, login: str = "alice") -> dict[str, Any]:
    return {
        "action": "submitted",
        "review": {"state": state, "user": {"login": login}},
        "pull_request": {"number": number},
    }


def _outcome(response: Any) -> TriggerEvent:
    return TriggerEvent.objects.get(pk=response.json()["event_id"])


def test_an_approving_review_finishes_the_run_its_pull_request_started(
    fake: FakeProvider,
) -> None:
    started = _deliver(fake, "pull_request", _opened(42))
    assert started.status_code == 202
    run_id = uuid.UUID(started.json()["run_id"])
    drain()
    assert WorkflowWait.objects.get(run_id=run_id, name="approved").status == "waiting"
    commented = _deliver(fake, "pull_request_review", _review(42, "commented"))
    assert commented.status_code == 202
    assert _outcome(commented).outcome == "event 'approved': the delivery names no run"
    assert _outcome(commented).run_id is None
    approved = _deliver(fake, "pull_request_review", _review(42, "approved", "bob"))
    assert approved.status_code == 202
    event = _outcome(approved)
    assert (event.run_id, event.outcome) == (run_id, f"event 'approved' sent to run {run_id}")
    assert WorkflowRun.objects.filter(pk=run_id, pass_due_at__isnull=False).exists()
    drain()
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"pr": 42, "approved_by": "bob"})


def test_a_second_approval_is_recorded_as_refused_not_an_error(fake: FakeProvider) -> None:
    run_id = uuid.UUID(_deliver(fake, "pull_request", _opened(7)).json()["run_id"])
    drain()
    assert _deliver(fake, "pull_request_review", _review(7, "approved")).status_code == 202
    again = _deliver(fake, "pull_request_review", _review(7, "approved", "carol"))
    assert again.status_code == 202
    assert "not delivered" in _outcome(again).outcome
    assert "already sent" in _outcome(again).outcome
    wait = WorkflowWait.objects.get(run_id=run_id, name="approved")
    assert wait.payload["review"]["user"]["login"] == "alice"


def test_a_review_for_a_pull_request_without_a_run_is_recorded_with_that_outcome(
    fake: FakeProvider,
) -> None:
    response = _deliver(fake, "pull_request_review", _review(999, "approved"))
    assert response.status_code == 202
    assert _outcome(response).outcome == "event 'approved': the delivery names no run"
    assert not WorkflowWait.objects.exists()


def test_a_second_opened_delivery_starts_nothing(fake: FakeProvider) -> None:
    first = _deliver(fake, "pull_request", _opened(5)).json()["run_id"]
    second = _deliver(fake, "pull_request", _opened(5)).json()["run_id"]
    assert first == second and WorkflowRun.objects.count() == 1


def test_the_delivery_and_the_event_commit_together(fake: FakeProvider) -> None:
    """If recording the delivery fails after the handler ran, the event is gone too."""
    run_id = uuid.UUID(_deliver(fake, "pull_request", _opened(3)).json()["run_id"])
    drain()
    real = SendEvent.__call__

    def then_fail(self: SendEvent, delivery: Any) -> Any:
        real(self, delivery)
        raise RuntimeError("the database went away after the event was written")

    with mock.patch.object(SendEvent, "__call__", then_fail):
        try:
            answered = _deliver(fake, "pull_request_review", _review(3, "approved")).status_code
        except RuntimeError:
            answered = 500
    assert answered == 500
    assert WorkflowWait.objects.get(run_id=run_id, name="approved").status == WaitStatus.WAITING
    assert not TriggerEvent.objects.filter(event="pull_request_review").exists()


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="event name"):
        SendEvent("", run=_approved_run)
    with pytest.raises(ValueError, match="callable"):
        SendEvent("approved", run="not callable")  # type: ignore[arg-type]
    # A name no wait can have would refuse every delivery later (500, the provider retrying
    # for ever): refused where it is declared instead.
    with pytest.raises(ValueError, match="201 characters long"):
        SendEvent("x" * 201, run=_approved_run)
    with pytest.raises(ValueError, match="NUL"):
        SendEvent("appro\x00ved", run=_approved_run)
    with pytest.raises(ValueError, match="payload"):
        SendEvent("approved", run=_approved_run, payload="body")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        StartWorkflow(WORKFLOW, key="number")  # type: ignore[arg-type]


def _opened_pull_request(delivery: Any) -> Any:
    """docs/howto/waits.md's handler: start (keyed) runs for ``opened`` deliveries only."""
    from django_leases.triggers import Handled
    from django_leases.workflows import start_workflow

    if delivery.action != "opened":
        return Handled(None, "not an opened pull request")
    key = str(delivery.payload["number"])
    return start_workflow(WORKFLOW, delivery.payload, key=key, using=delivery.using)


def test_the_documented_handler_starts_runs_for_opened_pull_requests_only(
    fake: FakeProvider,
) -> None:
    registry.unregister(SOURCE)
    webhook_source(
        SOURCE,
        provider="fake",
        events={
            "pull_request": _opened_pull_request,
            "pull_request_review": SendEvent("approved", run=_approved_run),
        },
    )
    closed = _deliver(fake, "pull_request", {**_opened(7), "action": "closed"})
    assert closed.status_code == 202 and not WorkflowRun.objects.exists()
    assert _outcome(closed).outcome == "not an opened pull request"
    opened = _deliver(fake, "pull_request", _opened(7))
    assert _outcome(opened).run_id == run_for_key(WORKFLOW, "7")
    drain()
    _deliver(fake, "pull_request_review", _review(7, "approved", "bob"))
    drain()
    assert WorkflowRun.objects.get().output == {"pr": 7, "approved_by": "bob"}


def _named_run(delivery: Any) -> Any:
    """A ``run`` callable that returns whatever the delivery says: hostile input."""
    return delivery.payload.get("run")


@pytest.mark.parametrize(
    "named",
    [
        "not-a-run",
        "",
        " ",
        "0" * 31,
        "x" * 100_000,
        12,
        1.5,
        True,
        ["a", "b"],
        {"id": "x"},
    ],
    ids=["word", "empty", "space", "short-hex", "long", "int", "float", "bool", "list", "dict"],
)
def test_a_run_callable_returning_no_run_id_is_recorded_not_an_error(
    fake: FakeProvider, named: Any
) -> None:
    registry.unregister(SOURCE)
    webhook_source(
        SOURCE, provider="fake", events={"pull_request_review": SendEvent("approved", _named_run)}
    )
    response = _deliver(fake, "pull_request_review", {"run": named})
    assert response.status_code == 202, response.content
    event = _outcome(response)
    assert event.run_id is None
    assert event.outcome.startswith("event 'approved' not delivered: ")
    assert "not a workflow run id" in event.outcome
    assert len(event.outcome) < 200, "the value is shown cut, not whole"
    assert not WorkflowWait.objects.exists()


def test_a_run_callable_that_raises_on_the_delivery_is_recorded_not_a_500(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented ``run`` callable reads ``payload["pull_request"]["number"]``: a
    delivery of another shape makes it raise ``KeyError``. The delivery is recorded with
    that outcome (202: the provider must not send it again), the traceback logged."""
    response = _deliver(fake, "pull_request_review", {"review": {"state": "approved"}})
    assert response.status_code == 202, response.content
    event = _outcome(response)
    assert event.run_id is None
    assert (
        event.outcome == "event 'approved' not delivered: its run raised KeyError('pull_request')"
    )
    assert "KeyError" in caplog.text


def test_a_key_callable_that_raises_on_the_delivery_starts_nothing_and_is_recorded(
    fake: FakeProvider,
) -> None:
    response = _deliver(fake, "pull_request", {"action": "opened"})
    assert response.status_code == 202, response.content
    event = _outcome(response)
    assert event.run_id is None
    assert event.outcome == (
        f"workflow {WORKFLOW!r} not started: its key raised KeyError('pull_request')"
    )
    assert not WorkflowRun.objects.exists()


def test_a_database_error_in_a_run_callable_is_not_recorded_and_answers_500(
    fake: FakeProvider,
) -> None:
    """A failure of the database (not of the delivery) records nothing: the provider retries."""
    from django.db import OperationalError

    def lost(delivery: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    registry.unregister(SOURCE)
    webhook_source(SOURCE, provider="fake", events={"pull_request_review": SendEvent("x", lost)})
    try:
        answered = _deliver(fake, "pull_request_review", _review(1, "approved")).status_code
    except OperationalError:
        answered = 500
    assert answered == 500
    assert not TriggerEvent.objects.exists()


def test_a_payload_over_the_event_limit_is_recorded_as_the_outcome_not_an_error(
    fake: FakeProvider, settings: Any
) -> None:
    """The delivery's body is within ``WEBHOOK_MAX_BODY`` but its payload is over
    ``MAX_EVENT_PAYLOAD``: the delivery is recorded (202) with the refusal as its outcome,
    the event is not sent."""
    run_id = uuid.UUID(_deliver(fake, "pull_request", _opened(9)).json()["run_id"])
    drain()
    review = _review(9, "approved", "bob")
    size = len(json.dumps(review, separators=(",", ":")).encode())
    settings.DJANGO_LEASES = {**(settings.DJANGO_LEASES or {}), "MAX_EVENT_PAYLOAD": size - 1}
    refused = _deliver(fake, "pull_request_review", review)
    assert refused.status_code == 202, refused.content
    event = _outcome(refused)
    assert event.run_id is None
    assert event.outcome == (
        f"event 'approved' not delivered: Payload of event 'approved' is {size} bytes of "
        f'JSON, over the limit of {size - 1} bytes (DJANGO_LEASES["MAX_EVENT_PAYLOAD"])'
    )
    assert WorkflowWait.objects.get(run_id=run_id, name="approved").status == WaitStatus.WAITING
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "MAX_EVENT_PAYLOAD": size}
    assert _outcome(_deliver(fake, "pull_request_review", review)).run_id == run_id


def _nested_list(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("levels", [30, 31, 40])
def test_a_delivery_as_deep_as_sources_accept_is_stored_on_every_backend(
    fake: FakeProvider, levels: int
) -> None:
    """Deliveries nest at most 30 levels: what MariaDB's JSON columns store (31) with the one
    level the delivery envelope adds (``input="delivery"``, ``payload="delivery"``). Deeper
    is a 400 on every backend, never the 500 of a database refusing it."""
    registry.unregister(SOURCE)
    webhook_source(
        SOURCE,
        provider="fake",
        events={
            "pull_request": StartWorkflow(
                WORKFLOW, input="delivery", key=lambda d: str(d.payload["number"])
            ),
            "pull_request_review": SendEvent("approved", run=_approved_run, payload="delivery"),
        },
    )
    deep = _nested_list(levels - 1)  # inside the delivery's top-level object
    opened = _deliver(fake, "pull_request", {**_opened(4), "deep": deep})
    review = _deliver(fake, "pull_request_review", {**_review(4, "approved"), "deep": deep})
    if levels > 30:
        assert (opened.status_code, review.status_code) == (400, 400), opened.content
        assert not TriggerEvent.objects.exists() and not WorkflowRun.objects.exists()
        return
    assert (opened.status_code, review.status_code) == (202, 202), opened.content
    run = WorkflowRun.objects.get()
    assert run.input["payload"]["deep"] == deep
    assert _outcome(review).outcome == f"event 'approved' sent to run {run.pk}"
    assert WorkflowWait.objects.get(run=run, name="approved").payload["payload"]["deep"] == deep
