"""The schedules admin in a real browser: an operator sees each schedule's next and last tick
and its last run, and pauses and resumes a schedule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from django_leases.models import WorkflowRun, WorkflowSchedule

pytestmark = pytest.mark.timeout(180)


def row(page: Any, name: str) -> Any:
    return page.locator("#result_list tbody tr", has_text=name)


def test_an_operator_pauses_and_resumes_a_schedule(
    page: Any,
    live_server: Any,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    run = WorkflowRun.objects.start("build-preview", {}, key="schedule:nightly:x")
    WorkflowSchedule.objects.create(
        name="nightly",
        workflow="build-preview",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        next_tick=datetime(2026, 12, 2, 2, tzinfo=UTC),
        last_tick=datetime(2026, 12, 1, 2, tzinfo=UTC),
        last_run_id=run.id,
    )
    WorkflowSchedule.objects.create(
        name="retired", workflow="build-preview", cron="*/5 * * * *", declared=False
    )
    operator = User.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_leases",
            codename__in=["view_workflowschedule", "pause_workflowschedule", "view_workflowrun"],
        )
    )

    admin_login("operator", "pw")
    page.goto("/admin/django_leases/workflowschedule/")
    nightly = row(page, "nightly")
    assert nightly.locator("[data-state]").get_attribute("data-state") == "active"
    assert row(page, "retired").locator("[data-state]").get_attribute("data-state") == (
        "undeclared"
    )
    assert nightly.locator("td.field-cron_text").inner_text() == "0 3 * * *\nEurope/Paris"
    assert (
        nightly.locator("td.field-next time")
        .get_attribute("datetime")
        .startswith("2026-12-02T02:00:00")
    )
    last = nightly.locator("td.field-last_and_run a")
    assert (last.inner_text(), last.get_attribute("title")) == ("…" + str(run.id)[-8:], str(run.id))
    screenshot("schedule-list")

    nightly.locator("input.action-select").check()
    page.select_option("select[name=action]", "pause")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "Paused 1 schedule: nightly." in page.inner_text("ul.messagelist")
    assert row(page, "nightly").locator("[data-state]").get_attribute("data-state") == "paused"
    screenshot("after-pause")
    assert WorkflowSchedule.objects.get(name="nightly").paused

    row(page, "nightly").locator("input.action-select").check()
    page.select_option("select[name=action]", "resume")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "Resumed 1 schedule: nightly." in page.inner_text("ul.messagelist")
    assert not WorkflowSchedule.objects.get(name="nightly").paused
    assert LogEntry.objects.count() == 2

    row(page, "nightly").locator("td.field-last_and_run a").click()
    page.wait_for_url(f"**/workflowrun/{run.id}/change/")
