"""The demo's pull-request flow (``demo_project.reviews``), delivered as GitHub delivers it.

Signed ``pull_request`` / ``pull_request_review`` deliveries (the demo's own samples, written
from GitHub's documented payloads) go through the receive view: ``opened`` starts a
``review-pull-request`` run keyed by the pull request, which fans out its checks, sleeps and
waits for event ``approved``; an approving review sends it, a review that is not an
approval is recorded with an outcome saying so. Runs are driven on the test's thread with
``django_leases.testing.drive``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from demo_project.journal.models import StepExecution
from demo_project.reviews import payloads
from demo_project.reviews.triggers import SOURCE
from demo_project.reviews.workflows import APPROVED, CHECKS, SETTLE, WORKFLOW
from django_leases.models import RunStatus, TriggerEvent, TriggerSource, WorkflowRun, WorkflowWait
from django_leases.testing import drive
from django_leases.triggers import registry
from django_leases.triggers.credentials import set_secret
from django_leases.triggers.signatures import github_signature
from django_leases.workflows.display import waiting_on
from tests.helpers import staff_client

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "demo-reviews-test-secret"
KEY = f"octo-org/octo-repo#{payloads.SAMPLE_NUMBER}"


@pytest.fixture(autouse=True)
def source(settings: Any) -> None:
    settings.DEMO_CHECK_SECONDS = 0
    settings.DEMO_REVIEW_SETTLE_SECONDS = 600
    TriggerSource.objects.sync(registry.declarations(), base_url="https://demo.example.com")
    TriggerSource.objects.set_enabled(SOURCE, True)
    set_secret(SOURCE, SECRET)


def deliver(path: Path, *, body: bytes | None = None, secret: str = SECRET) -> Any:
    """POST a sample as GitHub does: its exact bytes, X-GitHub-Event (the file's folder),
    a fresh X-GitHub-Delivery and X-Hub-Signature-256."""
    body = path.read_bytes() if body is None else body
    return Client().post(
        f"/hooks/{SOURCE}/",
        data=body,
        content_type="application/json",
        HTTP_USER_AGENT="GitHub-Hookshot/demo",
        HTTP_X_GITHUB_EVENT=path.parent.name,
        HTTP_X_GITHUB_DELIVERY=str(uuid.uuid4()),
        HTTP_X_HUB_SIGNATURE_256=github_signature(secret, body),
    )


def recorded(response: Any) -> TriggerEvent:
    assert response.status_code == 202, response.content
    return TriggerEvent.objects.get(pk=response.json()["event_id"])


def waits(run_id: Any) -> dict[str, WorkflowWait]:
    return {wait.name: wait for wait in WorkflowWait.objects.filter(run_id=run_id)}


def open_and_wait() -> uuid.UUID:
    """Open the sample pull request and drive its run to its wait for approval."""
    event = recorded(deliver(payloads.OPENED))
    assert event.run_id is not None
    run = drive(event.run_id)
    assert run is not None and run.status == RunStatus.RUNNING
    assert waits(run.pk)[APPROVED].status == "waiting"
    return run.pk


def test_an_approving_review_finishes_the_run_its_pull_request_started() -> None:
    event = recorded(deliver(payloads.OPENED))
    run = WorkflowRun.objects.get(pk=event.run_id)
    assert (run.workflow, run.key) == (WORKFLOW, KEY)
    assert run.input == json.loads(payloads.OPENED.read_bytes())

    run = drive(run.pk)  # the checks, the sleep (jumped forward), then the wait
    assert run is not None and run.status == RunStatus.RUNNING
    steps = {step.step_name: step for step in run.steps.all()}
    assert sorted(steps) == sorted(f"check-{check}" for check in CHECKS)
    assert {step.status for step in steps.values()} == {"succeeded"}
    assert waits(run.pk)[SETTLE].status == "done"
    assert waits(run.pk)[APPROVED].status == "waiting"
    assert waiting_on(run) == [f"waiting for event {APPROVED!r}"]

    for state in ("commented", "changes_requested"):
        event = recorded(deliver(payloads.REVIEWS[state]))
        assert event.run_id == run.pk
        assert f"is {state!r}, not an approval: no 'approved' event sent" in event.outcome
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.pass_due_at is None
        assert waits(run.pk)[APPROVED].status == "waiting"

    event = recorded(deliver(payloads.REVIEWS["approved"]))
    assert (event.run_id, event.outcome) == (run.pk, f"event 'approved' sent to run {run.pk}")
    run = drive(run.pk)
    assert run is not None and run.status == RunStatus.COMPLETED, run.error
    approval = json.loads(payloads.REVIEWS["approved"].read_bytes())
    assert waits(run.pk)[APPROVED].payload == approval
    assert run.output["approved_by"] == "grace-demo"
    assert run.output["checks"] == {check: "success" for check in CHECKS}
    assert run.output["review_id"] == approval["review"]["id"]
    assert "approved by @grace-demo" in run.output["comment"]
    journal = StepExecution.objects.filter(run_id=run.pk)
    assert sorted(journal.values_list("step_name", flat=True)) == sorted([*steps, "announce"])


def test_the_admin_shows_the_waiting_run_with_its_waits() -> None:
    run_id = open_and_wait()
    page = staff_client("view_workflowrun").get(
        reverse("admin:django_leases_workflowrun_change", args=[run_id])
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert KEY in html
    assert "waiting for event &#x27;approved&#x27;" in html
    assert "slept until" in html
    for check in CHECKS:
        assert f"check-{check}" in html


def test_the_sleep_is_a_row_with_its_end_and_the_run_waits_for_it() -> None:
    event = recorded(deliver(payloads.OPENED))
    run = drive(event.run_id, skip_sleeps=False)  # stops where only the sleep is left
    assert run is not None and run.status == RunStatus.RUNNING
    sleep = waits(run.pk)[SETTLE]
    assert (sleep.kind, sleep.status) == ("sleep", "waiting")
    assert sleep.due_at is not None and sleep.reached_at is not None
    assert 599 <= (sleep.due_at - sleep.reached_at).total_seconds() <= 601
    assert run.pass_due_at == sleep.due_at  # the next pass is due at the sleep's end
    assert APPROVED not in waits(run.pk)
    drive(run.pk, skip_sleeps=False)  # nothing is due: the sleep is not recomputed
    assert waits(run.pk)[SETTLE].due_at == sleep.due_at


def test_an_approval_sent_while_the_run_sleeps_is_kept_for_its_wait() -> None:
    event = recorded(deliver(payloads.OPENED))
    run = drive(event.run_id, skip_sleeps=False)
    assert run is not None
    approved = recorded(deliver(payloads.REVIEWS["approved"]))
    assert approved.outcome == f"event 'approved' sent to run {run.pk}"
    run = drive(run.pk)
    assert run is not None and run.status == RunStatus.COMPLETED
    assert run.output["approved_by"] == "grace-demo"


def test_one_run_per_pull_request_and_only_opened_starts_one() -> None:
    run_id = open_and_wait()
    again = recorded(deliver(payloads.OPENED))  # a new delivery about the same pull request
    assert again.run_id == run_id
    assert WorkflowRun.objects.filter(workflow=WORKFLOW).count() == 1

    closed = json.loads(payloads.OPENED.read_bytes()) | {"action": "closed"}
    event = recorded(deliver(payloads.OPENED, body=json.dumps(closed).encode()))
    assert event.run_id is None
    assert event.outcome == f"{KEY} closed: only 'opened' starts a review run"
    assert WorkflowRun.objects.filter(workflow=WORKFLOW).count() == 1


def test_a_review_of_a_pull_request_without_a_run_is_recorded_not_refused() -> None:
    for state, path in payloads.REVIEWS.items():
        event = recorded(deliver(path))
        assert event.run_id is None, state
    outcomes = set(TriggerEvent.objects.values_list("outcome", flat=True))
    assert "event 'approved': the delivery names no run" in outcomes
    assert (
        f"{KEY}: review by lin-demo is 'commented', not an approval (and the pull request "
        "has no review run)" in outcomes
    )
    assert not WorkflowRun.objects.exists()


def test_a_delivery_signed_with_another_secret_is_refused() -> None:
    response = deliver(payloads.OPENED, secret="not-the-secret")
    assert response.status_code == 401
    assert not TriggerEvent.objects.exists() and not WorkflowRun.objects.exists()


def test_the_samples_have_githubs_shape() -> None:
    declaration = registry.get_declaration(SOURCE)
    assert declaration is not None
    for path in [payloads.OPENED, *payloads.REVIEWS.values()]:
        payload = json.loads(path.read_bytes())
        assert path.parent.name in declaration.events
        assert payload["repository"]["full_name"] == declaration.config["repository"]
        assert payloads.pull_request_key(payload) == KEY
        assert {"login", "id", "type"} <= set(payload["sender"])
        pull = payload["pull_request"]
        assert pull["html_url"].endswith(f"/pull/{payloads.SAMPLE_NUMBER}")
        assert {"head", "base", "user", "_links"} <= set(pull)
    opened = json.loads(payloads.OPENED.read_bytes())
    assert (opened["action"], opened["number"]) == ("opened", payloads.SAMPLE_NUMBER)
    for state, path in payloads.REVIEWS.items():
        review = json.loads(path.read_bytes())
        assert (review["action"], review["review"]["state"]) == ("submitted", state)
        assert "number" not in review  # a review event has no top-level number…
        assert "merged" not in review["pull_request"]  # …and the shorter pull request


def test_renumbered_samples_are_about_another_pull_request(tmp_path: Path) -> None:
    same = payloads.renumbered(payloads.OPENED, payloads.SAMPLE_NUMBER, tmp_path)
    assert same.read_bytes() == payloads.OPENED.read_bytes()
    assert same.parent.name == "pull_request"
    other = payloads.renumbered(payloads.REVIEWS["approved"], 12, tmp_path / "12")
    payload = json.loads(other.read_bytes())
    assert payloads.pull_request_key(payload) == "octo-org/octo-repo#12"
    assert payload["review"]["html_url"].split("#")[0].endswith("/pull/12")
    assert f"/pull/{payloads.SAMPLE_NUMBER}" not in other.read_text()
    assert (
        payload["review"]["id"]
        == json.loads(payloads.REVIEWS["approved"].read_bytes())["review"]["id"]
    )
