"""The Deliveries and Schedules lists at 1280 px with real data: GitHub's delivery GUIDs,
Stripe's event ids, long event names, run ids, real schedule names and time zones. Every column
stays in the window (the run ids once pushed "Workflow run" and "Last run" out of it); a run
id shows short, its whole value one hover (``title``) or one click away."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_leases.models import TriggerEvent, WorkflowRun, WorkflowSchedule
from django_leases.testing import deliver, enable_source
from django_leases.triggers import registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.workflows import workflow
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(180)

WIDTH = 1280
WORKFLOW = "browser-lists.review"


@workflow(WORKFLOW)
def review(run: Any, input: dict[str, Any]) -> dict[str, Any]:
    return {}


@pytest.fixture
def sources() -> Iterator[None]:
    webhook_source(
        "acme-github-pull-requests",
        provider="github",
        config={"repository": "acme-platform/payments-service"},
        events={
            "pull_request_review_comment": StartWorkflow(WORKFLOW),
            "pull_request": StartWorkflow(WORKFLOW),
        },
    )
    webhook_source(
        "acme-stripe-subscriptions",
        provider="manual",
        config={"signature": "stripe"},
        events={"customer.subscription.trial_will_end": StartWorkflow(WORKFLOW)},
    )
    try:
        enable_source("acme-github-pull-requests")
        enable_source("acme-stripe-subscriptions")
        yield
    finally:
        registry.unregister("acme-github-pull-requests")
        registry.unregister("acme-stripe-subscriptions")


def test_deliveries_and_schedules_fit_1280_pixels_with_real_ids(
    page: Any,
    live_server: Any,
    sources: None,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    for n in range(4):
        github = deliver(
            "acme-github-pull-requests",
            "pull_request_review_comment" if n % 2 else "pull_request",
            {"action": "created", "number": 2200 + n},
            delivery_id=str(uuid.uuid4()),
        )
        assert github.status_code == 202, github.content
        stripe = deliver(
            "acme-stripe-subscriptions",
            "customer.subscription.trial_will_end",
            {"data": {"object": {"id": f"sub_1PqRsTuVwXyZ{n:04d}AbCdEfGh"}}},
            delivery_id=f"evt_1PqRsTuVwXyZ{n:04d}AbCdEfGhIjKl",
        )
        assert stripe.status_code == 202, stripe.content
    run = WorkflowRun.objects.start(WORKFLOW, {}, key="schedule:nightly-payments-reconciliation:x")
    WorkflowSchedule.objects.create(
        name="nightly-payments-reconciliation",
        workflow="billing.reconcile-payments-with-ledger",
        cron="30 2 * * 1-5",
        timezone="America/Argentina/Buenos_Aires",
        next_tick=datetime(2026, 12, 7, 5, 30, tzinfo=UTC),
        last_tick=datetime(2026, 12, 4, 5, 30, tzinfo=UTC),
        last_run_id=run.id,
    )
    User.objects.create_superuser("root", password="pw")
    page.set_viewport_size({"width": WIDTH, "height": 900})
    admin_login("root", "pw")

    page.goto("/admin/django_leases/triggerevent/")
    assert page.locator("#result_list tbody tr").count() == 8
    assert overflowing(page) == []
    event = TriggerEvent.objects.exclude(run_id=None).order_by("-pk").first()
    assert event is not None
    link = page.locator(f'td.field-run_link a[title="{event.run_id}"]')
    assert link.inner_text() == "…" + str(event.run_id)[-8:]
    assert link.get_attribute("href").endswith(f"/workflowrun/{event.run_id}/change/")
    screenshot("deliveries-real-ids")

    page.goto("/admin/django_leases/workflowschedule/")
    assert overflowing(page) == []
    last = page.locator(f'td.field-last_and_run a[title="{run.id}"]')
    assert last.inner_text() == "…" + str(run.id)[-8:]
    screenshot("schedules-real-ids")
