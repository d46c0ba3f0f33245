"""Workflow schedules (DESIGN §5b): tick arithmetic, declarations, the store's sync, firing,
catch-up and pause/resume, on the database clock; threads racing the firing on PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases import checks
from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.exceptions import UnknownScheduleError
from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.workflows import registry
from django_leases.workflows.schedules import (
    MISSED_AFTER,
    ScheduleDeclaration,
    declaration,
    from_settings,
    latest_tick,
    next_tick,
    run_key,
)
from tests.helpers import race

PARIS = "Europe/Paris"
WORKFLOW = "tests.sched.noop"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.fixture
def noop_workflow() -> Iterator[str]:
    """A registered workflow that returns its input; withdrawn at the end."""
    registry._workflows[WORKFLOW] = lambda run, input: input
    try:
        yield WORKFLOW
    finally:
        registry._workflows.pop(WORKFLOW, None)


def db_now() -> datetime:
    """The database clock, read once (aware UTC)."""
    with connection.cursor() as cursor:
        from django_leases.clock import now_sql

        cursor.execute(f"SELECT {now_sql(connection).replace('%%', '%')}")
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite's text form
        value = datetime.fromisoformat(value)
    return to_aware(value, connection.alias)


def schedule_row(
    name: str,
    cron: str,
    *,
    next_at: datetime | None,
    catch_up: str = "latest",
    timezone: str = "UTC",
    overlap: str = "allow",
    **fields: Any,
) -> WorkflowSchedule:
    """A declared schedule row of :data:`WORKFLOW` whose next tick is ``next_at`` (overlap
    ``allow`` unless told: these tests fire ticks whose runs no worker runs)."""
    return WorkflowSchedule.objects.create(
        name=name,
        workflow=WORKFLOW,
        cron=cron,
        timezone=timezone,
        catch_up=catch_up,
        overlap=overlap,
        next_tick=to_stored(next_at, connection.alias),
        **fields,
    )


def scheduled_runs(name: str) -> list[str]:
    """The keys of the runs schedule ``name`` started, sorted."""
    prefix = f"schedule:{name}:"
    return sorted(WorkflowRun.objects.filter(key__startswith=prefix).values_list("key", flat=True))


def whole_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


# -- ticks --------------------------------------------------------------------------------------


def test_next_tick_is_strictly_after_and_in_utc() -> None:
    assert next_tick("*/5 * * * *", "UTC", utc(2026, 12, 1, 16, 0)) == utc(2026, 12, 1, 16, 5)
    assert next_tick("*/5 * * * *", "UTC", utc(2026, 12, 1, 16, 3, 59)) == utc(2026, 12, 1, 16, 5)
    tick = next_tick("0 3 * * *", PARIS, utc(2026, 12, 1, 12))
    assert tick == utc(2026, 12, 2, 2)  # 03:00 in Paris (UTC+1 in winter)
    assert tick is not None and tick.tzinfo == UTC


def test_six_fields_have_the_seconds_first() -> None:
    after = utc(2026, 12, 1, 16, 0, 0)
    assert next_tick("*/10 * * * * *", "UTC", after) == utc(2026, 12, 1, 16, 0, 10)
    assert next_tick("* * * * * *", "UTC", after.replace(microsecond=400)) == utc(
        2026, 12, 1, 16, 0, 1
    )


def test_latest_tick_is_at_or_before() -> None:
    assert latest_tick("*/5 * * * *", "UTC", utc(2026, 12, 1, 16, 5)) == utc(2026, 12, 1, 16, 5)
    assert latest_tick("*/5 * * * *", "UTC", utc(2026, 12, 1, 16, 9, 59)) == utc(2026, 12, 1, 16, 5)
    at = utc(2026, 12, 1, 16, 0, 7).replace(microsecond=999_999)
    assert latest_tick("* * * * * *", "UTC", at) == utc(2026, 12, 1, 16, 0, 7)


def test_a_tick_in_the_skipped_spring_hour_runs_at_the_change() -> None:
    # 2026-03-29: Paris skips 02:00-03:00. Debian's cron runs a 02:30 job at 03:00 CEST.
    assert next_tick("30 2 * * *", PARIS, utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1)
    assert next_tick("30 2 * * *", PARIS, utc(2026, 3, 29, 1)) == utc(2026, 3, 30, 0, 30)


def test_a_tick_in_the_repeated_autumn_hour_runs_once() -> None:
    # 2026-10-25: Paris lives 02:00-03:00 twice. A daily 02:30 job runs once that day.
    first = next_tick("30 2 * * *", PARIS, utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)
    assert next_tick("30 2 * * *", PARIS, first) == utc(2026, 10, 26, 1, 30)


def test_hourly_ticks_follow_real_hours_across_the_autumn_change() -> None:
    ticks = []
    moment = utc(2026, 10, 24, 23, 30)
    for _ in range(4):
        tick = next_tick("0 * * * *", PARIS, moment)
        assert tick is not None
        ticks.append(tick)
        moment = tick
    assert ticks == [utc(2026, 10, 25, hour) for hour in range(4)]
    # The two 02:00 (local) ticks are distinct UTC instants, so distinct run keys.
    assert len({run_key("hourly", tick) for tick in ticks}) == 4


def test_run_keys_name_the_schedule_and_the_utc_instant() -> None:
    paris = datetime(2026, 3, 29, 3, tzinfo=UTC).astimezone(registry_zone(PARIS))
    assert run_key("nightly", paris) == "schedule:nightly:2026-03-29T03:00:00+00:00"
    with pytest.raises(ValueError, match="aware"):
        run_key("nightly", datetime(2026, 3, 29, 3))


def registry_zone(name: str) -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


# -- declarations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"cron": "* * *"}, "not a cron expression"),
        ({"cron": ""}, "non-empty"),
        ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
        ({"cron": "* * */20 * 1L"}, "never matches"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"catch_up": "all"}, "catch_up"),
        ({"input": {"when": datetime(2026, 1, 1)}}, "storable JSON"),
        ({"input": float("nan")}, "storable JSON"),
    ],
)
def test_a_bad_declaration_is_a_clear_error(fields: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"cron": "*/5 * * * *", **fields}
    cron = values.pop("cron")
    with pytest.raises(ValueError, match=message) as raised:
        declaration("nightly", WORKFLOW, cron, **values)
    assert "Schedule 'nightly'" in str(raised.value)


def test_a_bad_decorator_schedule_raises_and_registers_nothing() -> None:
    name = "tests.sched.bad"
    with pytest.raises(ValueError, match="unknown time zone"):

        @registry.workflow(name, schedule="0 3 * * *", timezone="Nowhere/Else")
        def bad(run: Any, input: Any) -> None: ...

    assert name not in registry._workflows
    assert name not in {s.name for s in registry.declared_schedules()}


def test_a_decorator_schedule_is_declared_under_the_workflow_s_name() -> None:
    name = "tests.sched.decorated"
    try:

        @registry.workflow(name, schedule="0 3 * * *", timezone=PARIS, input={"a": 1})
        def decorated(run: Any, input: Any) -> None: ...

        (found,) = [s for s in registry.declared_schedules() if s.name == name]
        assert found == ScheduleDeclaration(
            name, name, "0 3 * * *", PARIS, {"a": 1}, "latest", "@workflow", "skip"
        )
    finally:
        registry.unregister_schedule(name)
        registry._workflows.pop(name, None)


def test_settings_entries_are_read_and_bad_ones_reported() -> None:
    found, problems = from_settings(
        {
            "ok": {"workflow": WORKFLOW, "cron": "0 3 * * *", "timezone": PARIS},
            "typo": {"workflow": WORKFLOW, "cron": "0 3 * * *", "tz": PARIS},
            "nocron": {"workflow": WORKFLOW},
            "notadict": "0 3 * * *",
            "badcron": {"workflow": WORKFLOW, "cron": "0 25 * * *"},
        }
    )
    assert [s.name for s in found] == ["ok"]
    assert found[0].timezone == PARIS and found[0].input == {} and found[0].catch_up == "latest"
    text = "\n".join(problems)
    assert "'typo'" in text and "unknown key(s) 'tz'" in text
    assert "'nocron'" in text and "missing 'cron'" in text
    assert "'notadict'" in text
    assert "'badcron'" in text and "Bad hour" in text


def test_the_system_check_reports_every_schedule_that_would_never_fire(
    noop_workflow: str,
) -> None:
    name = "tests.sched.taken"
    registry.workflow(name, schedule="0 3 * * *")(lambda run, input: None)
    schedules = {
        "fine": {"workflow": noop_workflow, "cron": "*/5 * * * *"},
        "ghost": {"workflow": "tests.sched.nobody", "cron": "*/5 * * * *"},
        "zone": {"workflow": noop_workflow, "cron": "*/5 * * * *", "timezone": "Paris"},
        name: {"workflow": noop_workflow, "cron": "*/5 * * * *"},
    }
    try:
        with override_settings(DJANGO_LEASES={"SCHEDULES": schedules}):
            errors = [m for m in checks.django_leases_checks() if m.id == "django_leases.E026"]
            declared = {s.name for s in registry.declared_schedules()}
        text = "\n".join(m.msg for m in errors)
        assert len(errors) == 3, text
        assert "'ghost'" in text and "no loaded code registers workflow" in text
        assert "'zone'" in text and "unknown time zone" in text
        assert f"{name!r} (settings): the name is taken" in text
        assert declared >= {"fine", name} and not declared & {"ghost", "zone"}
        with override_settings(DJANGO_LEASES={"SCHEDULES": ["fine"]}):
            (error,) = [m for m in checks.django_leases_checks() if m.id == "django_leases.E016"]
        assert "SCHEDULES" in error.msg
    finally:
        registry.unregister_schedule(name)
        registry._workflows.pop(name, None)


# -- the store: sync ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sync_creates_counts_from_now_and_marks_the_others_undeclared(
    noop_workflow: str,
) -> None:
    now = db_now()
    first = declaration("a", noop_workflow, "0 3 * * *", timezone=PARIS)
    second = declaration("b", noop_workflow, "*/5 * * * *", input={"n": 1})
    rows = WorkflowSchedule.objects.sync([second, first])
    assert [row.name for row in rows] == ["a", "b"]
    a, b = rows
    assert to_aware(a.next_tick, "default") == next_tick("0 3 * * *", PARIS, now)  # type: ignore[arg-type]
    assert b.input == {"n": 1} and b.declared and not b.paused and b.last_tick is None

    WorkflowSchedule.objects.set_paused("a", True)
    kept_tick = b.next_tick
    changed = declaration("a", noop_workflow, "0 4 * * *", timezone=PARIS, catch_up="none")
    rows = WorkflowSchedule.objects.sync([changed])
    a, b = rows
    assert a.cron == "0 4 * * *" and a.catch_up == "none" and a.paused  # pause kept
    assert to_aware(a.next_tick, "default").astimezone(registry_zone(PARIS)).hour == 4  # type: ignore[arg-type]
    assert not b.declared and b.next_tick == kept_tick  # undeclared, kept as it was

    rows = WorkflowSchedule.objects.sync([changed, second])
    assert all(row.declared for row in rows)
    assert rows[1].next_tick == kept_tick  # same expression and zone: not recounted


@pytest.mark.django_db(transaction=True)
def test_sync_refuses_two_declarations_with_one_name(noop_workflow: str) -> None:
    one = declaration("a", noop_workflow, "0 3 * * *")
    with pytest.raises(ValueError, match="same name"):
        WorkflowSchedule.objects.sync([one, one])
    assert not WorkflowSchedule.objects.exists()


# -- firing -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_due_tick_starts_one_run_keyed_by_the_tick(noop_workflow: str) -> None:
    tick = whole_second(db_now()) - timedelta(seconds=1)
    schedule_row("every-second", "* * * * * *", next_at=tick, input={"x": 1})
    fired = WorkflowSchedule.objects.fire_due()
    keys = scheduled_runs("every-second")
    # The tick read and every later one already due are fired, one run each, in order.
    assert fired[0].tick == tick and fired[0].skipped == 0
    assert [f.tick for f in fired] == [tick + timedelta(seconds=i) for i in range(len(fired))]
    assert keys == sorted(run_key("every-second", f.tick) for f in fired if f.tick)
    row = WorkflowSchedule.objects.get(name="every-second")
    last = fired[-1]
    assert to_aware(row.last_tick, "default") == last.tick  # type: ignore[arg-type]
    assert row.last_run_id == last.run_id
    assert to_aware(row.next_tick, "default") > db_now() - timedelta(seconds=1)  # type: ignore[arg-type]
    run = WorkflowRun.objects.get(pk=last.run_id)
    assert run.workflow == noop_workflow and run.input == {"x": 1}
    # Fired again: nothing is due any more, nothing new.
    assert [f for f in WorkflowSchedule.objects.fire_due() if f.tick == tick] == []
    assert WorkflowRun.objects.filter(key=run_key("every-second", tick)).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_tick_that_is_not_due_starts_nothing(noop_workflow: str) -> None:
    schedule_row("later", "0 3 * * *", next_at=db_now() + timedelta(hours=1))
    schedule_row("never", "0 3 * * *", next_at=None)
    assert WorkflowSchedule.objects.fire_due() == []
    assert not WorkflowRun.objects.exists()


def _missed_yearly(catch_up: str) -> tuple[datetime, datetime]:
    """A yearly schedule whose last two ticks were missed: (the older one, the latest)."""
    now = db_now()
    latest = latest_tick("0 0 1 1 *", "UTC", now)
    assert latest is not None
    older = latest_tick("0 0 1 1 *", "UTC", latest - timedelta(days=1))
    assert older is not None
    if (now - latest).total_seconds() <= MISSED_AFTER:  # the first seconds of a year
        pytest.skip("the latest yearly tick is not missed yet")
    schedule_row(f"yearly-{catch_up}", "0 0 1 1 *", next_at=older, catch_up=catch_up)
    return older, latest


@pytest.mark.django_db(transaction=True)
def test_catch_up_latest_starts_one_run_for_the_latest_missed_tick(noop_workflow: str) -> None:
    _, latest = _missed_yearly("latest")
    (fired,) = WorkflowSchedule.objects.fire_due()
    assert fired.tick == latest and fired.skipped == 1
    assert scheduled_runs("yearly-latest") == [run_key("yearly-latest", latest)]
    row = WorkflowSchedule.objects.get(name="yearly-latest")
    assert to_aware(row.next_tick, "default") == next_tick("0 0 1 1 *", "UTC", latest)  # type: ignore[arg-type]
    assert WorkflowSchedule.objects.fire_due() == []


@pytest.mark.django_db(transaction=True)
def test_catch_up_none_starts_nothing_for_missed_ticks(noop_workflow: str) -> None:
    _, latest = _missed_yearly("none")
    (fired,) = WorkflowSchedule.objects.fire_due()
    assert fired.tick is None and fired.run_id is None and fired.skipped == 2
    assert scheduled_runs("yearly-none") == []
    row = WorkflowSchedule.objects.get(name="yearly-none")
    assert row.last_tick is None and row.last_run_id is None
    assert to_aware(row.next_tick, "default") == next_tick("0 0 1 1 *", "UTC", latest)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_catch_up_none_still_fires_a_tick_that_is_due_now(noop_workflow: str) -> None:
    # Missed ticks a minute ago, but the latest per-second tick is current: it runs.
    tick = whole_second(db_now()) - timedelta(seconds=60)
    schedule_row("fresh", "* * * * * *", next_at=tick, catch_up="none")
    fired = WorkflowSchedule.objects.fire_due()
    assert fired[0].tick is not None and fired[0].tick > tick + timedelta(seconds=50)
    assert fired[0].skipped >= 50
    assert len(scheduled_runs("fresh")) == len([f for f in fired if f.tick])


@pytest.mark.django_db(transaction=True)
def test_paused_and_undeclared_schedules_start_nothing(noop_workflow: str) -> None:
    due = whole_second(db_now()) - timedelta(seconds=2)
    schedule_row("paused", "* * * * * *", next_at=due, paused=True)
    schedule_row("gone", "* * * * * *", next_at=due, declared=False)
    assert WorkflowSchedule.objects.fire_due() == []
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_pause_and_resume(noop_workflow: str) -> None:
    _missed_yearly("latest")
    assert WorkflowSchedule.objects.set_paused("yearly-latest", True) is True
    assert WorkflowSchedule.objects.set_paused("yearly-latest", True) is False  # no change
    assert WorkflowSchedule.objects.fire_due() == []
    assert WorkflowSchedule.objects.set_paused("yearly-latest", False) is True
    row = WorkflowSchedule.objects.get(name="yearly-latest")
    # Resumed: counted from now, the ticks that passed meanwhile never run.
    assert not row.paused and to_aware(row.next_tick, "default") > db_now()  # type: ignore[arg-type]
    assert WorkflowSchedule.objects.fire_due() == []
    assert not WorkflowRun.objects.exists()
    with pytest.raises(UnknownScheduleError, match="'nope'"):
        WorkflowSchedule.objects.set_paused("nope", True)
    with pytest.raises(ValueError, match="True or False"):
        WorkflowSchedule.objects.set_paused("yearly-latest", 1)  # type: ignore[arg-type]
    with pytest.raises(UnknownScheduleError):
        WorkflowSchedule.objects.named("nope")


@pytest.mark.django_db(transaction=True)
def test_a_tick_fired_twice_creates_one_run(noop_workflow: str) -> None:
    # The key is the fence of last resort: a doubled start of a tick finds the first run.
    tick = whole_second(db_now()) - timedelta(seconds=1)
    schedule_row("twice", "* * * * * *", next_at=tick)
    (first, *_) = WorkflowSchedule.objects.fire_due()
    again = WorkflowRun.objects.start(noop_workflow, {}, key=run_key("twice", tick))
    assert again.started is False and again.id == first.run_id


@pytest.mark.django_db(transaction=True)
def test_a_schedule_changed_by_a_sync_since_it_was_read_is_not_fired(noop_workflow: str) -> None:
    tick = whole_second(db_now()) - timedelta(seconds=1)
    row = schedule_row("moved", "* * * * * *", next_at=tick)
    due = WorkflowSchedule.objects.filter(pk=row.pk).annotate(db_now=DbNow()).get()
    WorkflowSchedule.objects.filter(pk=row.pk).update(cron="*/2 * * * * *")
    assert WorkflowSchedule.objects.all()._fire("default", due) is None
    assert not WorkflowRun.objects.exists()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_threads_racing_the_firing_start_one_run_per_tick(
    noop_workflow: str, sql_path: str
) -> None:
    # Both paths of the run start (the tuned statement and the portable ORM one) under the race.
    threads = 4
    first = whole_second(db_now()) - timedelta(seconds=5)
    schedule_row("raced", "* * * * * *", next_at=first)
    for _ in range(3):
        outcomes = race([WorkflowSchedule.objects.fire_due] * threads)
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        fired = [f for outcome in outcomes for f in outcome]
        ticks = [f.tick for f in fired]
        assert len(ticks) == len(set(ticks)), "a tick was fired twice"
    keys = scheduled_runs("raced")
    starts = [datetime.fromisoformat(key.split(":", 2)[2]) for key in keys]
    # One run per tick from the first due one on, none skipped, none doubled.
    assert starts == [first + timedelta(seconds=i) for i in range(len(starts))]
    assert len(starts) >= 6
    row = WorkflowSchedule.objects.get(name="raced")
    assert to_aware(row.last_tick, "default") == starts[-1]  # type: ignore[arg-type]


# -- operators: the command and the admin -------------------------------------------------------


@pytest.fixture
def declared_nightly(noop_workflow: str) -> Iterator[str]:
    """Schedule ``nightly`` declared in settings (``0 3 * * *`` in Paris, input ``{"n": 1}``)."""
    entry = {"workflow": noop_workflow, "cron": "0 3 * * *", "timezone": PARIS, "input": {"n": 1}}
    with override_settings(DJANGO_LEASES={"SCHEDULES": {"nightly": entry}}):
        yield "nightly"


def _command(*args: str) -> tuple[int, str, str]:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out, err = StringIO(), StringIO()
    try:
        call_command("workflow_schedules", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_command_lists_pauses_and_resumes(declared_nightly: str) -> None:
    from django.contrib.admin.models import LogEntry

    code, out, _ = _command("list")
    assert code == 0
    header, line = out.splitlines()
    assert header.split()[:5] == ["NAME", "WORKFLOW", "CRON", "TIMEZONE", "CATCH"]
    assert line.startswith("nightly") and "declared" in line and "active" in line
    code, out, _ = _command("list", "--format", "json")
    (listed,) = json.loads(out)
    assert listed["name"] == "nightly" and listed["input"] == {"n": 1}
    assert listed["paused"] is False and listed["last_tick"] is None
    tick = datetime.fromisoformat(listed["next_tick"])
    assert tick.astimezone(registry_zone(PARIS)).hour == 3

    assert _command("pause", "nightly")[:2] == (0, "Schedule 'nightly' paused.\n")
    assert WorkflowSchedule.objects.get(name="nightly").paused
    code, out, _ = _command("pause", "nightly")
    assert code == 0 and "already paused" in out
    code, out, _ = _command("resume", "nightly")
    assert code == 0 and out.startswith("Schedule 'nightly' resumed; next tick ")
    assert [entry.change_message.split(";")[0] for entry in LogEntry.objects.order_by("pk")] == [
        "Paused",
        "Resumed (from the next tick after now)",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_command_refuses_an_unknown_schedule(declared_nightly: str) -> None:
    code, _, message = _command("pause", "nope")
    assert code == 1 and "No workflow schedule named 'nope'" in message
    with override_settings(DJANGO_LEASES={}):
        code, out, _ = _command("list")
        assert code == 0 and "undeclared" in out  # the row stays; it no longer fires
        assert _command("list", "--format", "json")[1].strip().startswith("[")


def test_the_command_s_exit_codes_are_in_the_table() -> None:
    from django_leases.management.base import exit_code_problems

    assert exit_code_problems("workflow_schedules") == []


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_schedules_and_pauses_them_with_the_permission(
    declared_nightly: str,
) -> None:
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse

    from tests.helpers import staff_client

    (row,) = WorkflowSchedule.objects.sync(registry.declared_schedules())
    run = WorkflowRun.objects.start(WORKFLOW, {}, key="k")
    WorkflowSchedule.objects.filter(pk=row.pk).update(last_run_id=run.id, last_tick=row.next_tick)
    changelist = reverse("admin:django_leases_workflowschedule_changelist")

    viewer = staff_client("view_workflowschedule")
    page = viewer.get(changelist)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="schedule-state-{row.pk}" data-state="active"' in html
    assert reverse("admin:django_leases_workflowrun_change", args=[run.id]) in html
    assert page.context["action_form"] is None  # no action this user may take
    viewer.post(changelist, {"action": "pause", "_selected_action": [row.pk]})
    assert not WorkflowSchedule.objects.get(pk=row.pk).paused
    assert not LogEntry.objects.exists()
    assert (
        viewer.get(
            reverse("admin:django_leases_workflowschedule_change", args=[row.pk])
        ).status_code
        == 200
    )

    operator = staff_client("view_workflowschedule", "pause_workflowschedule")
    operator.post(changelist, {"action": "pause", "_selected_action": [row.pk]})
    assert WorkflowSchedule.objects.get(pk=row.pk).paused
    html = operator.get(changelist).content.decode()
    assert 'data-state="paused"' in html
    operator.post(changelist, {"action": "resume", "_selected_action": [row.pk]})
    assert not WorkflowSchedule.objects.get(pk=row.pk).paused
    assert [entry.change_message for entry in LogEntry.objects.order_by("pk")] == [
        "Paused",
        "Resumed (from the next tick after now)",
    ]


# -- the worker's part --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_worker_syncs_once_then_fires_at_most_once_per_interval(
    noop_workflow: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_leases.workflows.worker import SCHEDULE_INTERVAL, Worker, _Schedules

    # Overlapping runs allowed: a run the first look may fire (below) must not make the
    # default policy ("skip") pass over the tick the last look fires.
    entry = {"workflow": noop_workflow, "cron": "* * * * * *", "overlap": "allow"}
    with override_settings(DJANGO_LEASES={"SCHEDULES": {"per-second": entry}}):
        part = _Schedules(Worker())
        assert part.interval == SCHEDULE_INTERVAL == 1.0
        part.tick()
        assert part.synced
        # That look may have fired a tick too, where the sync took over a second (a loaded
        # machine): what counts is that the next look, within the interval, fires nothing.
        fired = scheduled_runs("per-second")
        row = WorkflowSchedule.objects.get(name="per-second")
        due = whole_second(db_now()) - timedelta(seconds=1)
        WorkflowSchedule.objects.filter(pk=row.pk).update(next_tick=to_stored(due, "default"))
        part._next = time.monotonic() + 3600  # within the interval, whatever the load
        part.tick()  # so no look
        assert scheduled_runs("per-second") == fired
        part._next = 0.0
        part.tick()
        assert run_key("per-second", due) in scheduled_runs("per-second")

        # A failure is logged, never raised; the sync is tried again at the next look.
        def broken() -> list[ScheduleDeclaration]:
            raise RuntimeError("declarations unreadable")

        monkeypatch.setattr(registry, "declared_schedules", broken)
        again = _Schedules(Worker())
        again.tick()
        assert not again.synced
        assert "declarations unreadable" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_firing_is_right_with_use_tz_off_in_another_zone(noop_workflow: str) -> None:
    # The library's naive datetimes are then UTC on SQLite and MariaDB, Paris time on
    # PostgreSQL (whose columns hold instants).
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connection.close()  # the next connection takes the zone
        due = whole_second(db_now()) - timedelta(seconds=1)
        schedule_row("naive", "* * * * * *", next_at=due)
        fired = WorkflowSchedule.objects.fire_due()
        assert fired[0].tick == due
        row = WorkflowSchedule.objects.get(name="naive")
        assert row.next_tick is not None and row.next_tick.tzinfo is None
        assert to_aware(row.last_tick, "default") == fired[-1].tick  # type: ignore[arg-type]
        # Read back as the right instant (the database runs on this machine's clock: an hour
        # off would be a zone mix-up).
        off = to_aware(row.next_tick, "default") - datetime.now(UTC)
        assert abs(off) < timedelta(minutes=5), off
    connection.close()
