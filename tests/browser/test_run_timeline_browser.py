"""The run page's timeline in a real browser at 1280 px: a run of 200 steps (some retried, one
attempt superseded), a sleep, a child run and an event wait, drawn as SVG on the server. It
fits the window's width (nothing scrolls sideways), its lanes and labels stay readable, and a
child's bar opens the child's page. ``docs/img/admin-run-timeline.png`` comes from here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_leases.models import WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.testing import drive
from django_leases.workflows import start_workflow, step_function, workflow
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(240)

WIDTH = 1280
STEPS = 200


@step_function("browser-timeline.work")
def work(data: dict[str, Any], ctx: Any) -> Any:
    if data["n"] % 40 == 7 and ctx.attempt == 1:
        raise RuntimeError("a flaky dependency")
    return data["n"]


@workflow("browser-timeline.child")
def child(run: Any, input: Any) -> Any:
    return run.step("inner", "browser-timeline.work", {"n": 1})


@workflow("browser-timeline.release")
def release(run: Any, input: Any) -> Any:
    for n in range(STEPS):
        run.step(f"package-{n:03d}", "browser-timeline.work", {"n": n}, retries=1)
    run.sleep("cool-down", 60)
    run.child("smoke-tests", "browser-timeline.child", {})
    return run.wait_for_event("approval", timeout=3600)


def supersede_first_attempt(run_id: Any, step_name: str) -> None:
    """Make the step's attempt 1 one that a later claim replaced (its worker lost the step
    lease): it still says running, and attempt 2 succeeded after it."""
    step = WorkflowStep.objects.get(run_id=run_id, step_name=step_name)
    first = WorkflowStepAttempt.objects.get(step=step, attempt=1)
    WorkflowStepAttempt.objects.filter(pk=first.pk).update(status="running", finished_at=None)
    WorkflowStepAttempt.objects.create(
        step=step,
        attempt=2,
        status="succeeded",  # its result is the step's (stored once, on the step)
        started_at=first.started_at + timedelta(milliseconds=5),
        finished_at=first.finished_at + timedelta(milliseconds=6),
    )
    WorkflowStep.objects.filter(pk=step.pk).update(attempt=2)


def spread_over_time(run_id: Any) -> None:
    """Give the run the times of a real release (``drive`` ran it in a second, its sleep
    jumped): started 15 minutes ago, each package 3 s after the last (a retry 1 s after its
    failure), a 2-minute cool-down, a 40-second smoke-test child, then the approval wait."""
    run = WorkflowRun.objects.get(pk=run_id)
    base = run.created_at - timedelta(minutes=15)
    WorkflowRun.objects.filter(pk=run_id).update(created_at=base)
    attempts = WorkflowStepAttempt.objects.for_run(run_id).select_related("step").order_by("id")
    for entry in attempts:
        n = int(entry.step.step_name.split("-")[1])
        start = base + timedelta(seconds=3 * n + (1.2 if entry.attempt > 1 else 0))
        finish = None if entry.finished_at is None else start + timedelta(seconds=1)
        WorkflowStepAttempt.objects.filter(pk=entry.pk).update(started_at=start, finished_at=finish)
    end_of_steps = base + timedelta(seconds=3 * STEPS)
    waits = {wait.name: wait for wait in WorkflowWait.objects.filter(run_id=run_id)}
    plan = {
        "cool-down": (end_of_steps, end_of_steps + timedelta(minutes=2)),
        "smoke-tests": (end_of_steps + timedelta(minutes=2), end_of_steps + timedelta(seconds=160)),
        "approval": (end_of_steps + timedelta(seconds=160), None),
    }
    for name, (reached, done) in plan.items():
        WorkflowWait.objects.filter(pk=waits[name].pk).update(
            created_at=reached, reached_at=reached, done_at=done
        )


def test_a_200_step_run_s_timeline_fits_1280_pixels_and_reads(
    page: Any,
    live_server: Any,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
    docs_image: Callable[[Path, str], None],
) -> None:
    run_id = start_workflow("browser-timeline.release", {})
    drive(run_id, skip_sleeps=True)
    supersede_first_attempt(run_id, "package-120")
    spread_over_time(run_id)
    assert WorkflowRun.objects.get(pk=run_id).status == "running"  # waits for approval

    User.objects.create_superuser("root", password="pw")
    page.set_viewport_size({"width": WIDTH, "height": 900})
    admin_login("root", "pw")
    page.goto(f"/admin/django_leases/workflowrun/{run_id}/change/")
    svg = page.locator("#run-timeline svg")
    svg.wait_for()
    assert page.locator("#run-timeline script").count() == 0
    assert svg.get_attribute("data-lanes") == str(STEPS + 3)

    # Across: within the window, nothing sideways.
    assert overflowing(page) == []
    box = svg.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH
    assert box["width"] >= 700, box  # the drawing has the page's width, not a thumbnail
    # Down: 200 lanes, each tall enough to point at, labels at a readable size.
    lane = page.locator('#run-timeline g[data-name="package-000"] rect').first.bounding_box()
    assert lane["height"] >= 6, lane
    label = page.locator('#run-timeline g[data-name="package-000"] text').first.bounding_box()
    assert label["height"] >= 9, label

    states = page.eval_on_selector_all(
        "#run-timeline g.dl-tl-lane rect.dl-tl-bar", "els => els.map(e => e.dataset.state)"
    )
    assert states.count("superseded") == 1
    assert states.count("failed") == 5  # package-007, -047, -087, -127, -167: first attempts
    assert "sleep-done" in states and "child-done" in states and "waiting" in states
    tooltip = page.locator(
        '#run-timeline g[data-name="package-120"] rect[data-state="superseded"] title'
    )
    assert "attempt 1: superseded" in tooltip.text_content()
    legend = page.locator("#run-timeline g.dl-tl-legend").text_content()
    for word in ("succeeded", "failed", "superseded", "waiting"):
        assert word in legend, word

    shot = screenshot("run-timeline")
    page.locator("#run-timeline").screenshot(path=str(shot.with_name("run-timeline-only.png")))
    docs_image(shot.with_name("run-timeline-only.png"), "admin-run-timeline.png")

    page.locator('#run-timeline g[data-kind="child"] a').click()
    kid = WorkflowRun.objects.get(parent_id=run_id)
    page.wait_for_url(f"**/workflowrun/{kid.pk}/change/")
    assert page.locator('#run-timeline g[data-name="inner"]').count() == 1
