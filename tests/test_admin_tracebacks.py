"""The run page shows where a step (or the workflow itself) raised: each exception's traceback
is recorded with its error and shown, whole and readable, under the error's JSON — not just
"KeyError 'review'"."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.testing import drive
from django_leases.validation import TRACEBACK_KEPT, error_json
from django_leases.workflows import start_workflow, step_function, workflow

pytestmark = pytest.mark.django_db


@step_function("tests.tracebacks.fetch-review")
def fetch_review(data: dict[str, Any], ctx: Any) -> Any:
    return _look_up_the_review(data)


def _look_up_the_review(data: dict[str, Any]) -> Any:
    return data["review"]  # the event had another shape


@workflow("tests.tracebacks.step-fails")
def step_fails(run: Any, input: Any) -> Any:
    return run.step("fetch", "tests.tracebacks.fetch-review", {"pr": 22}, retries=0)


@workflow("tests.tracebacks.workflow-fails")
def workflow_fails(run: Any, input: Any) -> Any:
    event = {"approved": True}
    return event["review"]


def _page(run_id: Any) -> str:
    client = Client()
    client.force_login(User.objects.create_superuser(f"root-{run_id}", password="pw"))
    response = client.get(reverse("admin:django_leases_workflowrun_change", args=[run_id]))
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_a_failed_step_s_traceback_is_recorded_and_shown_on_the_run_page() -> None:
    run_id = start_workflow("tests.tracebacks.step-fails", {})
    run = drive(run_id)
    assert run is not None and run.status == "failed"
    step = WorkflowStep.objects.get(run_id=run_id, step_name="fetch")
    assert (step.error["type"], step.error["message"]) == ("KeyError", "'review'")
    trace = step.error["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    assert "_look_up_the_review" in trace and 'return data["review"]' in trace

    page = _page(run_id)
    details = page[page.index('<details class="dl-traceback" id="traceback-fetch">') :]
    details = details[: details.index("</details>")]
    assert "_look_up_the_review" in details and 'return data["review"]' in details
    json_part = page[: page.index('id="traceback-fetch"')]
    assert "\\n" not in json_part[json_part.rindex('<span class="dl-json">') :]


def test_a_workflow_that_raises_shows_where_on_the_run_page() -> None:
    run_id = start_workflow("tests.tracebacks.workflow-fails", {})
    drive(run_id)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "failed" and run.error["type"] == "KeyError"
    page = _page(run_id)
    details = page[page.index('id="run-traceback"') :]
    assert 'return event["review"]' in details[: details.index("</details>")]


def test_an_error_keeps_the_end_of_a_long_traceback_and_none_when_never_raised() -> None:
    """A traceback longer than TRACEBACK_KEPT keeps its end (where the raise is); a chunk of
    it holding a huge message is cut on its own, so the exception's name stays in view."""
    try:
        try:
            raise LookupError("k" * (2 * TRACEBACK_KEPT))  # a cause with a huge message
        except LookupError as cause:
            raise ValueError("at the bottom") from cause
    except ValueError as exc:
        recorded = error_json(exc)
    assert len(recorded["traceback"]) <= TRACEBACK_KEPT + 30
    assert "LookupError: kkk" in recorded["traceback"]
    assert recorded["traceback"].rstrip().endswith("ValueError: at the bottom")
    causes: BaseException | None = None
    for n in range(60):  # a long chain: more text than is kept
        try:
            raise KeyError(f"{n}: " + "v" * 300) from causes
        except KeyError as exc:
            causes = exc
    assert causes is not None
    long = error_json(causes)["traceback"]
    assert len(long) <= TRACEBACK_KEPT + 30
    assert long.startswith("… (the start is cut)")
    assert long.rstrip().endswith("v'")
    assert "traceback" not in error_json(ValueError("built, never raised"))
