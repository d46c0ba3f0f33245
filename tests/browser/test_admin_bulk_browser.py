"""The run list's bulk actions and the run page's fork in a real browser at 1280 px: an
operator filters the runs by tag, retries the failed ones and cancels the others in two
actions (a history entry for each run), then forks a run from one of its steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(180)

WIDTH = 1280


def _failed(tags: dict[str, str]) -> WorkflowRun:
    run = WorkflowRun.objects.start("build-preview", {}, tags=tags)
    WorkflowStep.objects.schedule(run.id, "checkout", "previews.checkout", retries=0)
    claim = WorkflowStep.objects.claim_for_execution(run.id, "checkout", "previews.checkout", 60)
    assert claim is not None
    WorkflowStep.objects.set_error(claim.step_id, "the mirror was down", claim.attempt)
    WorkflowRun.objects.fail(run.id, "step checkout failed")
    return run


def test_an_operator_retries_and_cancels_the_runs_of_a_tag_and_forks_one(
    page: Any,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    failed = [_failed({"team": "billing", "deploy": "d-41"}) for _ in range(3)]
    running = [
        WorkflowRun.objects.start("build-preview", {}, tags={"team": "billing"}) for _ in range(2)
    ]
    other = WorkflowRun.objects.start("build-preview", {}, tags={"team": "search"})
    operator = User.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_leases",
            codename__in=["view_workflowrun", "operate_workflowrun"],
        )
    )
    page.set_viewport_size({"width": WIDTH, "height": 900})
    admin_login("operator", "pw")

    page.goto("/admin/django_leases/workflowrun/")
    page.click("#changelist-filter a:text-is('team=billing')")
    page.wait_for_url("**tag=team%3Dbilling**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 5 and str(other.id) not in page.inner_text("#result_list")
    # The list's own width at 1280 px (its columns) is another change's; the actions and
    # their messages are what is checked here.
    screenshot("filtered-by-tag")

    page.check("#action-toggle")
    page.select_option("select[name=action]", "retry_runs")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    messages = page.inner_text("ul.messagelist")
    assert messages.count("Failed → Running") == 3, messages
    assert messages.count("Nothing changed") == 2, messages  # the running ones: no failed step
    screenshot("after-retry")
    for run in failed:
        assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
        assert LogEntry.objects.filter(object_id=str(run.pk), user=operator).count() == 1

    page.goto("/admin/django_leases/workflowrun/?tag=team%3Dbilling")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "cancel_runs")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert page.inner_text("ul.messagelist").count("Running → Cancelled") == 5
    assert WorkflowRun.objects.get(pk=other.pk).status == RunStatus.RUNNING
    for run in [*failed, *running]:
        assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.CANCELLED
        assert LogEntry.objects.filter(object_id=str(run.pk), user=operator).count() in (1, 2)

    page.goto(f"/admin/django_leases/workflowrun/{failed[0].pk}/change/")
    assert "team=billing" in page.inner_text(".field-tags_text")
    page.fill("#fork-step", "checkout")
    page.click("#fork-run input[type=submit]")
    page.wait_for_selector("ul.messagelist")
    fork = WorkflowRun.objects.get(forked_from_id=failed[0].pk)
    assert f"/workflowrun/{fork.pk}/change/" in page.url
    assert "forked from step checkout" in page.inner_text("ul.messagelist")
    assert str(failed[0].pk) in page.inner_text(".field-forked_from_link")
    assert overflowing(page) == []
    screenshot("forked")
