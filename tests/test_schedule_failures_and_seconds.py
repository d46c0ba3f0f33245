"""Schedules that cannot fire, and six-field expressions across the clock changes.

* One schedule whose tick fails to start (its task refused by the backend) is its own
  problem: ``fire_due`` rolls that schedule back alone (its tick stays due, tried again at
  the next look) and fires every other due schedule all the same. (It raised out of the
  whole call, so a task schedule stuck failing stopped every schedule behind it, on every
  worker.) The failure is logged once while it fails the same way.
* Check ``E026`` says so before: a task schedule its backend would refuse to enqueue as
  declared (a queue it does not take, arguments that would not read back as written).
* Six fields whose seconds field is one number follow the daylight-saving rules of five:
  ``0 30 2 * * *`` in Berlin runs once on the autumn night, and at the change in spring (it
  ran twice, and not at all).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases import checks
from django_leases.clock import to_aware, to_stored
from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.workflows import registry
from django_leases.workflows.schedules import ticks_between
from tests.test_schedule_edges import fake_db_clock  # noqa: F401  (fixture)
from tests.test_schedule_overlap import clock, noop  # noqa: F401  (fixture)

BERLIN = "Europe/Berlin"


def _due(name: str, workflow: str, task: str = "") -> None:
    WorkflowSchedule.objects.create(
        name=name,
        workflow=workflow,
        task=task,
        cron="0 0 1 1 *",
        overlap="allow",
        next_tick=to_stored(clock().replace(microsecond=0) - timedelta(seconds=5), "default"),
    )


def _runs(name: str) -> list[str]:
    return list(
        WorkflowRun.objects.filter(key__startswith=f"schedule:{name}:").values_list(
            "key", flat=True
        )
    )


class Refused(Exception):
    """What a backend that refuses the task raises (``InvalidTask``, say)."""


@pytest.mark.django_db(transaction=True)
def test_one_schedule_that_cannot_start_does_not_stop_the_others(
    noop: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    _due("a-reports", "", task="tests.workapp.tasks.echo")
    _due("b-digest", noop)
    calls: list[str] = []

    def refusing(alias: str, path: str, args: Any, kwargs: Any, key: str) -> Any:
        calls.append(key)
        raise Refused("queue 'reports' is not configured")

    caplog.set_level(logging.DEBUG, logger="django_leases.workflows")
    fired = WorkflowSchedule.objects.fire_due(start_task=refusing)
    assert [f.name for f in fired] == ["b-digest"]
    assert len(_runs("b-digest")) == 1
    assert len(calls) == 1, "the failing schedule was tried again within one call"
    row = WorkflowSchedule.objects.get(name="a-reports")
    assert to_aware(row.next_tick, "default") < clock(), "its tick no longer due"
    WorkflowSchedule.objects.fire_due(start_task=refusing)  # it fails the same way again
    warned = [
        r for r in caplog.records if "a-reports" in r.getMessage() and r.levelno == logging.WARNING
    ]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"task": "tests.workapp.tasks.echo", "cron": "* * * * *"}, None),
        (
            {"task": "tests.workapp.tasks.echo", "cron": "* * * * *", "kwargs": {"n": 1e20}},
            "read back",
        ),
    ],
    ids=["fine", "number-jsonb-rewrites"],
)
def test_e026_reports_a_task_schedule_its_backend_would_refuse(
    entry: dict[str, Any], said: str | None
) -> None:
    pytest.importorskip("django_leases.tasks")
    with override_settings(DJANGO_LEASES={"SCHEDULES": {"reports": entry}}):
        found = [m.msg for m in checks.django_leases_checks() if m.id == "django_leases.E026"]
        declared = [s.name for s in registry.declared_schedules()]
    if said is None:
        assert found == [] and "reports" in declared
    else:
        assert len(found) == 1 and said in found[0], found
        assert "reports" not in declared, "a schedule that cannot fire was declared"


#: A module-level task on queue "reports" (made under the test's TASKS, below).
on_reports: Any = None


def _reports() -> None:
    return None


def test_e026_reports_a_task_schedule_on_a_queue_its_backend_does_not_take() -> None:
    pytest.importorskip("django_leases.tasks")
    from django_leases.tasks_api import task

    global on_reports
    backend = {"default": {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": []}}
    entry = {"task": f"{__name__}.on_reports", "cron": "* * * * *"}
    with override_settings(TASKS=backend, DJANGO_LEASES={"SCHEDULES": {"reports": entry}}):
        on_reports = task(queue_name="reports")(_reports)
        try:
            found = [m.msg for m in checks.django_leases_checks() if m.id == "django_leases.E026"]
        finally:
            on_reports = None
    assert len(found) == 1 and "'reports'" in found[0], found


def _utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize("cron", ["0 30 2 * * *", "15 0 2 * * *"])
def test_a_daily_six_field_tick_in_the_repeated_autumn_hour_runs_once(cron: str) -> None:
    start = _utc(2026, 10, 24, 12)
    ticks = ticks_between(cron, BERLIN, start, start + timedelta(days=1))
    assert len(ticks) == 1, [t.isoformat() for t in ticks]


@pytest.mark.parametrize("cron", ["0 30 2 * * *", "15 0 2 * * *"])
def test_a_daily_six_field_tick_in_the_skipped_spring_hour_runs_at_the_change(cron: str) -> None:
    start = _utc(2026, 3, 28, 12)
    ticks = ticks_between(cron, BERLIN, start, start + timedelta(days=1))
    assert len(ticks) == 1, [t.isoformat() for t in ticks]
    assert _utc(2026, 3, 29, 1, 0) <= ticks[0] < _utc(2026, 3, 29, 1, 1), ticks


def test_six_fields_keep_their_second() -> None:
    start = _utc(2026, 6, 1, 12)
    assert ticks_between("7 30 * * * *", "UTC", start, start + timedelta(hours=2)) == [
        _utc(2026, 6, 1, 12, 30, 7),
        _utc(2026, 6, 1, 13, 30, 7),
    ]
    assert ticks_between("*/20 0 12 * * *", "UTC", start, start + timedelta(minutes=1)) == [
        _utc(2026, 6, 1, 12, 0, 0),  # the window's start is in it
        _utc(2026, 6, 1, 12, 0, 20),
        _utc(2026, 6, 1, 12, 0, 40),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_daily_six_field_schedule_starts_one_run_on_the_fall_back_day(
    noop: str,  # noqa: F811
    fake_db_clock: Any,  # noqa: F811
) -> None:
    """End to end, the schedule store's clock faked: workers firing on time every minute
    through the night of 2026-10-25 start one run."""
    WorkflowSchedule.objects.create(
        name="daily6",
        workflow=noop,
        cron="0 30 2 * * *",
        timezone=BERLIN,
        overlap="allow",
        next_tick=to_stored(_utc(2026, 10, 25, 0, 30), connection.alias),
    )
    moment = _utc(2026, 10, 24, 23, 0)
    while moment < _utc(2026, 10, 25, 4, 0):
        fake_db_clock(moment)
        WorkflowSchedule.objects.fire_due()
        moment += timedelta(minutes=1)
    assert len(_runs("daily6")) == 1, _runs("daily6")
