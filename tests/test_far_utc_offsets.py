"""Aware datetimes whose UTC offset Python allows (up to ±23:59) but PostgreSQL's input does
not (±15:59): "time zone displacement out of range". Every instant a caller gives is written
in UTC, so such a datetime means on PostgreSQL what it means on SQLite and MariaDB (where
Django converts it already): the same instant, never a database error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from io import StringIO

import pytest
from django.core.management import call_command

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.models.timing import check_run_after
from django_leases.workflows import start_workflow
from tests.test_schedule_overlap import noop, per_second  # noqa: F401  (fixture)

#: +20:00: a valid Python offset, refused by PostgreSQL's timestamptz input.
FAR = timezone(timedelta(hours=20))
WHEN = datetime(2030, 1, 2, 4, 0, tzinfo=FAR)
INSTANT = datetime(2030, 1, 1, 8, 0, tzinfo=UTC)


def test_check_run_after_gives_the_same_instant_in_utc() -> None:
    checked = check_run_after(WHEN)
    assert checked == INSTANT and checked.utcoffset() == timedelta(0)  # type: ignore[union-attr]


@pytest.mark.django_db
def test_a_run_after_with_a_far_offset_starts_the_run_at_that_instant() -> None:
    run_id = start_workflow("tests.idle", {}, run_after=WHEN)
    assert WorkflowRun.objects.get(pk=run_id).pass_due_at == INSTANT


@pytest.mark.django_db
def test_a_task_run_after_with_a_far_offset_is_enqueued_for_that_instant() -> None:
    pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)
    from tests.workapp import tasks

    result = tasks.echo.using(run_after=WHEN).enqueue()
    assert WorkflowStep.objects.get(run_id=result.id).available_at == INSTANT
    assert result.task.run_after == WHEN


@pytest.mark.django_db(transaction=True)
def test_a_backfill_window_with_far_offsets_starts_its_ticks(
    noop: str,  # noqa: F811
) -> None:
    per_second("bf-far-offset", "skip", due_for=-3600)
    call_command(
        "workflow_schedules",
        "backfill",
        "bf-far-offset",
        "--start",
        "2026-01-02T20:00:00+20:00",
        "--end",
        "2026-01-02T20:00:03+20:00",
        stdout=StringIO(),
    )
    keys = WorkflowRun.objects.filter(key__startswith="schedule:bf-far-offset:")
    assert keys.count() == 3
