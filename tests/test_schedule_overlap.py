"""Schedules' overlap policies, skipped ticks, backfills and task schedules (DESIGN §5c),
on the database clock: each policy in one process, the firing raced by threads, and bad
input refused with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases import checks
from django_leases.clock import now_sql, to_aware, to_stored
from django_leases.exceptions import UnknownScheduleError
from django_leases.models import WorkflowRun, WorkflowSchedule, WorkflowScheduleBackfill
from django_leases.workflows import registry
from django_leases.workflows.schedules import (
    MAX_BACKFILL_TICKS,
    declaration,
    from_settings,
    run_key,
    ticks_between,
)
from django_leases.workflows.values import TASK_WORKFLOW, RunStatus
from tests.helpers import race

WORKFLOW = "tests.overlap.noop"


@pytest.fixture
def noop() -> Iterator[str]:
    """A registered workflow that returns its input; withdrawn at the end."""
    registry._workflows[WORKFLOW] = lambda run, input: input
    try:
        yield WORKFLOW
    finally:
        registry._workflows.pop(WORKFLOW, None)


def clock() -> datetime:
    """The database clock, read once (aware UTC)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql(connection).replace('%%', '%')}")
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite's text form
        value = datetime.fromisoformat(value)
    return to_aware(value, connection.alias)


def per_second(name: str, overlap: str, *, due_for: int = 4, **fields: Any) -> WorkflowSchedule:
    """A per-second schedule of :data:`WORKFLOW` whose ticks of the last ``due_for`` seconds
    are due."""
    first = clock().replace(microsecond=0) - timedelta(seconds=due_for)
    return WorkflowSchedule.objects.create(
        name=name,
        workflow=WORKFLOW,
        cron="* * * * * *",
        overlap=overlap,
        next_tick=to_stored(first, connection.alias),
        **fields,
    )


def runs_of(name: str) -> list[WorkflowRun]:
    """The runs schedule ``name`` started, oldest tick first."""
    prefix = f"schedule:{name}:"
    return list(WorkflowRun.objects.filter(key__startswith=prefix).order_by("key"))


def end(run_id: Any) -> None:
    """End a run as a worker would (completed)."""
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.COMPLETED)


# -- the policies -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_skip_starts_nothing_while_the_previous_run_is_live_and_records_the_tick(
    noop: str,
) -> None:
    per_second("s", "skip")
    fired = WorkflowSchedule.objects.fire_due()
    started = [f for f in fired if f.action == "started"]
    skipped = [f for f in fired if f.action == "skipped"]
    assert len(started) == 1 and len(skipped) >= 3, fired
    assert all(f.reason == "overlap" and f.run_id is None for f in skipped)
    (run,) = runs_of("s")
    assert run.id == started[0].run_id
    row = WorkflowSchedule.objects.get(name="s")
    assert row.last_run_id == run.id and row.skipped_ticks == len(skipped)
    assert to_aware(row.last_skipped_tick, "default") == skipped[-1].tick  # type: ignore[arg-type]
    assert row.last_skip_reason == "overlap" and row.buffered_tick is None

    # Once it ended, the next tick starts a run again.
    end(run.id)
    WorkflowSchedule.objects.filter(name="s").update(
        next_tick=to_stored(clock().replace(microsecond=0), "default")
    )
    again = [f for f in WorkflowSchedule.objects.fire_due() if f.action == "started"]
    assert len(again) == 1 and len(runs_of("s")) == 2


@pytest.mark.django_db(transaction=True)
def test_a_suspended_previous_run_is_live(noop: str) -> None:
    per_second("s", "skip", due_for=1)
    (first, *_) = WorkflowSchedule.objects.fire_due()
    WorkflowRun.objects.filter(pk=first.run_id).update(status=RunStatus.SUSPENDED)
    WorkflowSchedule.objects.filter(name="s").update(
        next_tick=to_stored(clock().replace(microsecond=0), "default")
    )
    assert {f.action for f in WorkflowSchedule.objects.fire_due()} == {"skipped"}


@pytest.mark.django_db(transaction=True)
def test_buffer_one_keeps_one_tick_and_starts_it_when_the_run_ends(noop: str) -> None:
    per_second("b", "buffer_one")
    fired = WorkflowSchedule.objects.fire_due()
    actions = [f.action for f in fired]
    assert actions[:2] == ["started", "buffered"] and set(actions[2:]) == {"skipped"}, actions
    assert {f.reason for f in fired[2:]} == {"buffer_full"}
    waiting = fired[1].tick
    row = WorkflowSchedule.objects.get(name="b")
    assert to_aware(row.buffered_tick, "default") == waiting  # type: ignore[arg-type]
    assert row.last_skip_reason == "buffer_full"
    # Nothing more while the first run is live.
    assert [f for f in WorkflowSchedule.objects.fire_due() if f.action == "started"] == []

    end(fired[0].run_id)
    after = WorkflowSchedule.objects.fire_due()
    started = [f for f in after if f.action == "started"]
    assert started[0].tick == waiting
    assert started[0].run_id == WorkflowRun.objects.get(key=run_key("b", waiting)).id  # type: ignore[arg-type]
    row = WorkflowSchedule.objects.get(name="b")
    assert row.last_run_id == started[0].run_id
    # The buffered tick was taken out of the buffer. A tick that came due since the first
    # firing (a second is a tick here: a slow machine crosses one) takes its place, as the
    # run just started is live.
    newly = [f.tick for f in after if f.action == "buffered"]
    if newly:
        assert newly[-1] > waiting
        assert to_aware(row.buffered_tick, "default") == newly[-1]  # type: ignore[arg-type]
    else:
        assert row.buffered_tick is None
    live = WorkflowRun.objects.filter(key__startswith="schedule:b:", status=RunStatus.RUNNING)
    assert live.count() == 1


@pytest.mark.django_db(transaction=True)
def test_cancel_other_cancels_the_live_run_and_starts_the_tick(noop: str) -> None:
    per_second("c", "cancel_other")
    fired = WorkflowSchedule.objects.fire_due()
    assert {f.action for f in fired} == {"started"} and len(fired) >= 4
    runs = runs_of("c")
    assert [r.id for r in runs] == [f.run_id for f in fired]
    assert [f.cancelled for f in fired] == [None] + [f.run_id for f in fired[:-1]]
    assert [r.status for r in runs] == [RunStatus.CANCELLED] * (len(runs) - 1) + [RunStatus.RUNNING]
    assert "schedule 'c' (overlap cancel_other)" in runs[0].error["message"]


@pytest.mark.django_db(transaction=True)
def test_allow_starts_every_tick(noop: str) -> None:
    per_second("a", "allow")
    fired = WorkflowSchedule.objects.fire_due()
    assert {f.action for f in fired} == {"started"} and len(fired) >= 4
    assert len(runs_of("a")) == len(fired)
    assert all(r.status == RunStatus.RUNNING for r in runs_of("a"))


@pytest.mark.django_db(transaction=True)
def test_missed_ticks_are_recorded_as_skipped(noop: str) -> None:
    row = per_second("m", "allow", due_for=120, catch_up="none")
    WorkflowSchedule.objects.fire_due()
    row.refresh_from_db()
    assert row.last_skip_reason == "missed" and row.skipped_ticks >= 100


def racing_needs_a_server() -> None:
    """Skip on SQLite: threads racing the firing are for PostgreSQL and MariaDB."""
    if connection.vendor == "sqlite":
        pytest.skip("threads race on PostgreSQL and MariaDB")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["skip", "buffer_one", "cancel_other"])
def test_threads_racing_the_firing_leave_one_live_run(
    noop: str, policy: str, sql_path: str
) -> None:
    racing_needs_a_server()
    per_second("raced", policy, due_for=6)
    outcomes = race([WorkflowSchedule.objects.fire_due] * 4)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    ticks = [f.tick for outcome in outcomes for f in outcome]
    assert len(ticks) == len(set(ticks)), "a tick was fired twice"
    live = [r for r in runs_of("raced") if r.status == RunStatus.RUNNING]
    assert len(live) == 1


# -- bad input ----------------------------------------------------------------------------------


def test_an_unknown_overlap_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="overlap must be one of 'skip'") as raised:
        declaration("nightly", WORKFLOW, "0 3 * * *", overlap="queue")
    assert "Schedule 'nightly'" in str(raised.value)
    name = "tests.overlap.bad"
    with pytest.raises(ValueError, match="overlap"):

        @registry.workflow(name, schedule="0 3 * * *", overlap="sometimes")
        def bad(run: Any, input: Any) -> None: ...

    assert name not in registry._workflows
    assert name not in {s.name for s in registry.declared_schedules()}


@pytest.mark.django_db(transaction=True)
def test_bad_settings_entries_are_reported_by_the_check_and_never_synced(noop: str) -> None:
    schedules = {
        "policy": {"workflow": noop, "cron": "* * * * *", "overlap": "Skip"},
        "both": {"workflow": noop, "task": "tests.workapp.tasks.add", "cron": "* * * * *"},
        "loose-args": {"workflow": noop, "cron": "* * * * *", "args": [1]},
        "args-type": {"task": "tests.workapp.tasks.add", "cron": "* * * * *", "args": "1"},
        "not-a-task": {"task": "tests.workapp.tasks.os", "cron": "* * * * *"},
        "no-module": {"task": "tests.nowhere.job", "cron": "* * * * *"},
        "neither": {"cron": "* * * * *"},
    }
    with override_settings(DJANGO_LEASES={"SCHEDULES": schedules}):
        errors = [m for m in checks.django_leases_checks() if m.id == "django_leases.E026"]
        declared = {s.name for s in registry.declared_schedules()}
        WorkflowSchedule.objects.sync(registry.declared_schedules())
    text = "\n".join(m.msg for m in errors)
    assert len(errors) == len(schedules), text
    assert "'policy'" in text and "overlap must be one of" in text
    assert "'both'" in text and "not both" in text
    assert "'loose-args'" in text and "go with a 'task'" in text
    assert "'args-type'" in text and "args must be a list" in text
    assert "'not-a-task'" in text and "is not a Django @task" in text
    assert "'no-module'" in text and "cannot be imported" in text
    assert "'neither'" in text and "missing 'workflow' or 'task'" in text
    assert not declared & set(schedules)
    assert not WorkflowSchedule.objects.exists()


def test_settings_take_the_overlap_policy() -> None:
    found, problems = from_settings(
        {"x": {"workflow": WORKFLOW, "cron": "0 3 * * *", "overlap": "buffer_one"}}
    )
    assert problems == [] and found[0].overlap == "buffer_one"
    (default,) = from_settings({"y": {"workflow": WORKFLOW, "cron": "0 3 * * *"}})[0]
    assert default.overlap == "skip"


# -- backfill -----------------------------------------------------------------------------------


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def test_a_window_holds_its_ticks_from_start_to_before_end() -> None:
    assert ticks_between("*/15 * * * *", "UTC", utc(2026, 1, 1, 0), utc(2026, 1, 1, 1)) == [
        utc(2026, 1, 1, 0, minute) for minute in (0, 15, 30, 45)
    ]
    assert ticks_between("*/15 * * * *", "UTC", utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 16)) == [
        utc(2026, 1, 1, 0, 15)
    ]
    with pytest.raises(ValueError, match="not after its start"):
        ticks_between("* * * * *", "UTC", utc(2026, 1, 2), utc(2026, 1, 1))
    with pytest.raises(ValueError, match="in parts"):
        ticks_between("* * * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 2))
    with pytest.raises(ValueError, match="aware"):
        ticks_between("* * * * *", "UTC", datetime(2026, 1, 1), utc(2026, 1, 2))


@pytest.mark.django_db(transaction=True)
def test_backfill_starts_each_tick_once_however_often_it_runs(noop: str) -> None:
    per_second("bf", "skip", due_for=-3600)  # its own ticks are not due
    start, stop = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 0, 30)
    first = WorkflowSchedule.objects.backfill("bf", start, stop)
    assert len(first.ticks) == 30 and len(first.started) == 30 and first.existing == []
    # Overlapping and repeated: the ticks that have a run get none.
    again = WorkflowSchedule.objects.backfill(
        "bf", start + timedelta(seconds=20), stop + timedelta(seconds=10)
    )
    assert len(again.started) == 10 and len(again.existing) == 10
    keys = [r.key for r in runs_of("bf")]
    assert keys == [run_key("bf", start + timedelta(seconds=i)) for i in range(40)]
    assert all(r.status == RunStatus.RUNNING for r in runs_of("bf"))  # overlap not applied
    records = list(
        WorkflowScheduleBackfill.objects.order_by("id").values_list("ticks", "started", "existing")
    )
    assert records == [(30, 30, 0), (20, 10, 10)]
    assert not WorkflowScheduleBackfill.objects.filter(finished_at=None).exists()
    row = WorkflowSchedule.objects.get(name="bf")
    assert row.last_run_id is None  # backfilled runs are not the schedule's previous run


@pytest.mark.django_db(transaction=True)
def test_a_bad_backfill_is_refused_with_nothing_written(noop: str) -> None:
    per_second("bf", "skip", due_for=-3600)
    now = clock()
    bad = [
        (datetime(2026, 1, 1), utc(2026, 1, 2), "aware"),
        (utc(2026, 1, 2), utc(2026, 1, 1), "not after its start"),
        (now - timedelta(minutes=1), now + timedelta(hours=1), "after now"),
        (utc(2026, 1, 1), utc(2026, 1, 1) + timedelta(seconds=MAX_BACKFILL_TICKS + 1), "in parts"),
    ]
    for start, stop, message in bad:
        with pytest.raises(ValueError, match=message):
            WorkflowSchedule.objects.backfill("bf", start, stop)
    with pytest.raises(UnknownScheduleError):
        WorkflowSchedule.objects.backfill("nope", utc(2026, 1, 1), utc(2026, 1, 2))
    assert not WorkflowRun.objects.exists()
    assert not WorkflowScheduleBackfill.objects.exists()


# -- task schedules -----------------------------------------------------------------------------

tasks = pytest.importorskip("django_leases.tasks")


@pytest.fixture
def task_schedule() -> Iterator[str]:
    """Schedule ``mail`` enqueueing ``tests.workapp.tasks.echo(1, 2, x=3)`` each second."""
    entry = {
        "task": "tests.workapp.tasks.echo",
        "cron": "* * * * * *",
        "args": [1, 2],
        "kwargs": {"x": 3},
        "overlap": "allow",
    }
    with override_settings(DJANGO_LEASES={"SCHEDULES": {"mail": entry}}):
        assert [m for m in checks.django_leases_checks() if m.id == "django_leases.E026"] == []
        yield "mail"


@pytest.mark.django_db(transaction=True)
def test_a_task_schedule_enqueues_the_task_once_per_tick(task_schedule: str) -> None:
    from django_leases.tasks_api import TaskResultStatus, task_backends
    from django_leases.testing import drive

    (row,) = WorkflowSchedule.objects.sync(registry.declared_schedules())
    assert row.task == "tests.workapp.tasks.echo" and row.workflow == TASK_WORKFLOW
    first = clock().replace(microsecond=0) - timedelta(seconds=3)
    WorkflowSchedule.objects.filter(pk=row.pk).update(next_tick=to_stored(first, "default"))
    # Without a task starter the task schedule is left due; with one it fires.
    assert WorkflowSchedule.objects.fire_due() == []
    fired = WorkflowSchedule.objects.fire_due(start_task=tasks.start_scheduled_task)
    assert len(fired) >= 3 and all(f.action == "started" for f in fired)
    runs = runs_of("mail")
    assert [r.id for r in runs] == [f.run_id for f in fired]
    assert all(r.workflow == TASK_WORKFLOW for r in runs)
    # The tick key is the fence: enqueueing a tick again finds its run.
    tick = fired[0].tick
    assert tick is not None
    again = tasks.start_scheduled_task("default", row.task, [1, 2], {"x": 3}, run_key("mail", tick))
    assert again == (fired[0].run_id, False)
    assert WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).count() == len(fired)

    drive()
    result = task_backends["default"].get_result(str(fired[0].run_id))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"args": [1, 2], "kwargs": {"x": 3}}


@pytest.mark.django_db(transaction=True)
def test_a_task_schedule_is_backfilled_once(task_schedule: str) -> None:
    WorkflowSchedule.objects.sync(registry.declared_schedules())
    start, stop = utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 5)
    with pytest.raises(ValueError, match="start_task"):
        WorkflowSchedule.objects.backfill("mail", start, stop)
    for _ in range(2):
        WorkflowSchedule.objects.backfill(
            "mail", start, stop, start_task=tasks.start_scheduled_task
        )
    assert WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).count() == 5


@pytest.mark.django_db(transaction=True)
def test_threads_racing_a_task_schedule_enqueue_once_per_tick(
    task_schedule: str, sql_path: str
) -> None:
    racing_needs_a_server()
    (row,) = WorkflowSchedule.objects.sync(registry.declared_schedules())
    first = clock().replace(microsecond=0) - timedelta(seconds=5)
    WorkflowSchedule.objects.filter(pk=row.pk).update(next_tick=to_stored(first, "default"))

    def fire() -> Any:
        return WorkflowSchedule.objects.fire_due(start_task=tasks.start_scheduled_task)

    outcomes = race([fire] * 4)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    fired = [f for outcome in outcomes for f in outcome]
    keys = [r.key for r in runs_of("mail")]
    assert len(keys) == len(set(keys)) == len(fired) >= 5
    assert WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).count() == len(fired)


# -- operators: the admin and the command -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_admin_shows_the_policy_the_last_skipped_tick_and_the_backfills(noop: str) -> None:
    from django.urls import reverse

    from tests.helpers import staff_client

    row = per_second("s", "buffer_one")
    WorkflowSchedule.objects.fire_due()
    done = WorkflowSchedule.objects.backfill("s", utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 3))
    viewer = staff_client("view_workflowschedule")
    listing = viewer.get(reverse("admin:django_leases_workflowschedule_changelist"))
    html = listing.content.decode()
    assert "buffer one" in html
    assert f'id="schedule-skipped-{row.pk}" data-reason="buffer_full"' in html
    page = viewer.get(reverse("admin:django_leases_workflowschedule_change", args=[row.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="schedule-backfills-{row.pk}"' in html
    assert f'data-backfill="{done.backfill_id}"' in html
    assert "a tick was already waiting" in html  # the reason, as operators read it


@pytest.mark.django_db(transaction=True)
def test_the_list_command_shows_the_policy_and_the_last_skipped_tick(noop: str) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    entry = {"workflow": noop, "cron": "* * * * * *", "overlap": "skip"}
    with override_settings(DJANGO_LEASES={"SCHEDULES": {"s": entry}}):
        out = StringIO()
        call_command("workflow_schedules", "list", stdout=out)
        WorkflowSchedule.objects.filter(name="s").update(
            next_tick=to_stored(clock().replace(microsecond=0) - timedelta(seconds=3), "default")
        )
        WorkflowSchedule.objects.fire_due()
        listed = StringIO()
        call_command("workflow_schedules", "list", "--format", "json", stdout=listed)
    assert "OVERLAP" in out.getvalue().splitlines()[0]
    (shown,) = json.loads(listed.getvalue())
    assert shown["overlap"] == "skip" and shown["last_skip_reason"] == "overlap"
    assert shown["skipped_ticks"] >= 2 and shown["last_skipped_tick"] is not None
