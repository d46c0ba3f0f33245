"""The run timeline's geometry (``django_leases.workflows.timeline``): pure functions over a
run's rows — lanes, bars, superseded attempts, waits, ticks — and the run page that draws it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_leases.models import WorkflowRun
from django_leases.testing import drive
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.timeline import (
    LABEL_WIDTH,
    MAX_LANES,
    MIN_BAR_WIDTH,
    NAME_SHOWN,
    RIGHT_PAD,
    WIDTH,
    AttemptRow,
    WaitRow,
    build,
    offset_label,
    tick_step,
)

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(
    step: str, n: int, start: float, end: float | None, status: str, **kw: Any
) -> AttemptRow:
    return AttemptRow(
        step, n, status, kw.get("superseded", False), at(start), None if end is None else at(end)
    )


def test_steps_and_their_attempts_are_lanes_of_bars_on_one_axis() -> None:
    drawn = build(
        start=T0,
        end=at(100),
        now=at(500),
        attempts=[
            attempt("build", 2, 40, 90, "succeeded"),
            attempt("checkout", 1, 0, 10, "succeeded"),
            attempt("build", 1, 10, None, "running", superseded=True),
        ],
    )
    assert [lane.name for lane in drawn.lanes] == ["checkout", "build"]  # by first start
    left, right = float(LABEL_WIDTH), float(WIDTH - RIGHT_PAD)
    per_second = (right - left) / 100
    checkout, build_lane = drawn.lanes
    [bar] = checkout.bars
    assert (bar.x, bar.width, bar.state) == (left, round(10 * per_second, 1), "succeeded")
    first, second = build_lane.bars
    assert first.state == "superseded" and "superseded" in first.tooltip
    # A superseded attempt ran, as far as anyone knows, until its successor was claimed.
    assert first.x == round(left + 10 * per_second, 1)
    assert first.width == pytest.approx(30 * per_second, abs=0.2)
    assert (second.state, second.x) == ("succeeded", round(left + 40 * per_second, 1))
    assert build_lane.y > checkout.y
    assert all(
        left <= b.x and b.x + b.width <= right + 0.05 for lane in drawn.lanes for b in lane.bars
    )
    assert {state for state, *_ in drawn.legend} == {"succeeded", "superseded"}
    assert drawn.end == at(100), "a finished run's axis ends with it, not now"


def test_waits_and_children_are_bars_and_a_live_run_runs_to_now() -> None:
    child = uuid.uuid4()
    drawn = build(
        start=T0,
        end=None,
        now=at(60),
        attempts=[attempt("a", 1, 0, 1, "succeeded"), attempt("b", 1, 30, None, "running")],
        waits=[
            WaitRow("nap", "sleep", "done", created_at=at(1), reached_at=at(1), done_at=at(11)),
            WaitRow("kid", "child", "done", at(11), at(11), at(29), child_id=child),
            WaitRow("approval", "event", "waiting", at(31), at(31), due_at=at(120)),
        ],
    )
    kinds = [(lane.kind, lane.name) for lane in drawn.lanes]
    assert kinds == [
        ("step", "a"),
        ("sleep", "nap"),
        ("child", "kid"),
        ("step", "b"),
        ("event", "approval"),
    ]
    lanes = {lane.name: lane for lane in drawn.lanes}
    assert lanes["kid"].bars[0].child_id == child
    assert lanes["kid"].bars[0].state == "child-done"
    assert lanes["b"].bars[0].state == "running"
    assert lanes["approval"].bars[0].state == "waiting"
    # A live run's axis ends now; a timeout further ahead does not stretch it (unmarked)…
    assert drawn.end == at(60)
    assert lanes["approval"].marker_x is None
    assert lanes["approval"].bars[0].x + lanes["approval"].bars[0].width <= WIDTH - RIGHT_PAD
    # …one within it is marked on its lane.
    later = build(
        start=T0,
        end=None,
        now=at(200),
        attempts=[attempt("a", 1, 0, 1, "succeeded")],
        waits=[WaitRow("approval", "event", "waiting", at(31), at(31), due_at=at(100))],
    )
    left, right = float(LABEL_WIDTH), float(WIDTH - RIGHT_PAD)
    assert later.lanes[1].marker_x == pytest.approx(left + 100 * (right - left) / 200, abs=0.1)


def test_two_hundred_steps_fit_the_width_and_tiny_attempts_stay_visible() -> None:
    rows = [
        attempt(f"step-{n:03d}", 1, n * 0.01, n * 0.01 + 0.001, "succeeded") for n in range(200)
    ]
    drawn = build(start=T0, end=at(2), now=at(9), attempts=rows)
    assert len(drawn.lanes) == 200 and drawn.width == WIDTH
    assert all(bar.width >= MIN_BAR_WIDTH for lane in drawn.lanes for bar in lane.bars)
    assert all(
        lane.bars[0].x + lane.bars[0].width <= WIDTH - RIGHT_PAD + 0.05 for lane in drawn.lanes
    )
    assert drawn.height == drawn.lanes_bottom + 26
    assert [tick.label for tick in drawn.ticks][:3] == ["0", "500 ms", "1 s"]


def test_over_the_lane_limit_says_how_many_are_left_out() -> None:
    rows = [attempt(f"s{n}", 1, n, n + 1, "failed") for n in range(MAX_LANES + 5)]
    drawn = build(start=T0, end=None, now=at(MAX_LANES + 10), attempts=rows)
    assert (len(drawn.lanes), drawn.left_out) == (MAX_LANES, 5)


def test_a_long_name_is_cut_and_kept_whole_for_its_tooltip() -> None:
    name = "notify-every-reviewer-of-the-pull-request-" + "x" * 40
    [lane] = build(
        start=T0, end=at(1), now=at(1), attempts=[attempt(name, 1, 0, 1, "succeeded")]
    ).lanes
    assert lane.name == name and lane.label.endswith("…") and len(lane.label) == NAME_SHOWN


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        (0, "0"),
        (0.25, "250 ms"),
        (1.5, "1.5 s"),
        (150, "2 min 30 s"),
        (3600, "1 h"),
        (3900, "1 h 5 min"),
        (2 * 86400 + 3 * 3600 + 59, "2 d 3 h"),
    ],
)
def test_tick_labels_are_offsets_from_the_start(seconds: float, label: str) -> None:
    assert offset_label(seconds) == label


def test_tick_steps_are_round_and_at_most_eight() -> None:
    for span in (0.003, 0.9, 7, 61, 3599, 86400 * 3, 86400 * 400):
        step = tick_step(span)
        assert span / step <= 8, span


# -- the run page ------------------------------------------------------------------------------


@step_function("tests.timeline.flaky")
def flaky(data: Any, ctx: Any) -> Any:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return data


@workflow("tests.timeline.child")
def child_flow(run: Any, input: Any) -> Any:
    return run.step("inner", "tests.timeline.flaky", {"n": 0}, retries=1)


@workflow("tests.timeline.parent")
def parent_flow(run: Any, input: Any) -> Any:
    run.step("first", "tests.timeline.flaky", {"n": 1}, retries=1)
    run.sleep("pause", 60)
    run.child("kid", "tests.timeline.child", {})
    return run.wait_for_event("approval", timeout=3600)


@pytest.mark.django_db
def test_the_run_page_draws_the_timeline_as_svg() -> None:
    run_id = start_workflow("tests.timeline.parent", {})
    drive(run_id)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get(reverse("admin:django_leases_workflowrun_change", args=[run_id]))
    html = page.content.decode()
    svg = html[html.index('<div class="dl-timeline" id="run-timeline">') :]
    svg = svg[: svg.index("</svg>")]
    assert "<script" not in html[html.index("run-timeline") : html.index("</svg>")]
    assert 'data-lanes="4"' in svg
    for kind, name in (
        ("step", "first"),
        ("sleep", "pause"),
        ("child", "kid"),
        ("event", "approval"),
    ):
        assert f'data-kind="{kind}" data-name="{name}"' in svg, name
    assert svg.count('data-state="failed"') >= 1 and 'data-state="waiting"' in svg
    kid = str(WorkflowRun.objects.get(parent_id=run_id).pk)
    assert reverse("admin:django_leases_workflowrun_change", args=[kid]) in svg
    assert 'class="dl-tl-due"' not in svg  # the approval's timeout is an hour ahead


@pytest.mark.django_db
@pytest.mark.parametrize("language", ["de", "fr"])
def test_the_timeline_s_coordinates_are_svg_numbers_in_every_language(language: str) -> None:
    """German and French write 170,9 for 170.9: SVG reads neither, so the drawing's numbers
    are never localised."""
    import re

    from django.test import override_settings
    from django.utils import translation

    run_id = start_workflow("tests.timeline.parent", {})
    drive(run_id)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    with override_settings(LANGUAGE_CODE=language), translation.override(language):
        page = client.get(reverse("admin:django_leases_workflowrun_change", args=[run_id]))
    html = page.content.decode()
    svg = html[html.index('<div class="dl-timeline" id="run-timeline">') :]
    svg = svg[: svg.index("</svg>")]
    coordinates = re.findall(r' (?:x|y|x1|x2|y1|y2|width|height)="([^"%]*)"', svg)
    assert coordinates and all(re.fullmatch(r"-?\d+(\.\d+)?", value) for value in coordinates), [
        value for value in coordinates if not re.fullmatch(r"-?\d+(\.\d+)?", value)
    ][:5]
