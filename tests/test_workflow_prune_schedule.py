"""``DJANGO_LEASES["PRUNE"]``: the workers prune finished runs on a cron schedule, through the
built-in schedule ``django_leases.prune`` — off by default, checked at start-up (E031), each
tick's prune started once however many workers race it, and its run shows what it deleted."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_leases import checks
from django_leases.clock import db_now_plus, now_sql, to_aware, to_stored
from django_leases.conf import leases_settings
from django_leases.models import RunStatus, WorkflowRun, WorkflowSchedule, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import registry
from django_leases.workflows.retention import PRUNE_RETRIES
from django_leases.workflows.schedules import (
    MISSED_AFTER,
    PRUNE_FUNCTION,
    PRUNE_SCHEDULE,
    PRUNE_STEP,
    PRUNE_WORKFLOW,
    ScheduleDeclaration,
    latest_tick,
    run_key,
)
from tests.helpers import MANAGE_PY, manage, race, start_process, wait_until

HOUR = 3600.0
#: A prune every second of runs finished more than an hour ago, two runs per transaction.
EVERY_SECOND = {"schedule": "* * * * * *", "older_than": timedelta(hours=1), "batch_size": 2}


def db_now() -> datetime:
    """The database clock, read once (aware UTC)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql(connection).replace('%%', '%')}")
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite's text form
        value = datetime.fromisoformat(value)
    return to_aware(value, connection.alias)


def seeded(status: str, finished_hours_ago: float | None) -> WorkflowRun:
    """A run of a workflow nobody registers, in ``status``, finished that many hours ago on
    the database clock (``None``: not finished), with no pass due: no worker touches it."""
    run = WorkflowRun.objects.start("tests.prune-schedule.seed", {})
    finished_at = None if finished_hours_ago is None else db_now_plus(-finished_hours_ago * HOUR)
    WorkflowRun.objects.filter(pk=run.id).update(
        status=status, finished_at=finished_at, pass_due_at=None
    )
    return WorkflowRun.objects.get(pk=run.id)


def prune_runs() -> list[WorkflowRun]:
    """The runs the prune schedule started, oldest tick first."""
    return list(WorkflowRun.objects.filter(workflow=PRUNE_WORKFLOW).order_by("key"))


def tick_of(run: WorkflowRun) -> datetime:
    prefix = f"schedule:{PRUNE_SCHEDULE}:"
    assert run.key is not None and run.key.startswith(prefix), run.key
    return datetime.fromisoformat(run.key[len(prefix) :])


@pytest.fixture
def pruning() -> Iterator[dict[str, Any]]:
    """``DJANGO_LEASES["PRUNE"]`` set to :data:`EVERY_SECOND` (the suite's other settings
    kept), the declarations synced to their rows as a starting worker does."""
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": EVERY_SECOND}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
        yield EVERY_SECOND


def _suite_settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.DJANGO_LEASES)


def make_due(seconds_ago: int) -> datetime:
    """Set the prune schedule's next tick to the whole second ``seconds_ago`` seconds before
    database now; returns that tick."""
    tick = db_now().replace(microsecond=0) - timedelta(seconds=seconds_ago)
    WorkflowSchedule.objects.filter(name=PRUNE_SCHEDULE).update(
        next_tick=to_stored(tick, connection.alias)
    )
    return tick


def e031(prune: object, **others: Any) -> list[str]:
    """The messages of check E031 (and E016 on ``PRUNE``) for ``PRUNE = prune``."""
    with override_settings(DJANGO_LEASES={**others, "PRUNE": prune}):
        found = checks.django_leases_checks()
    return [
        f"{m.id} {m.msg}"
        for m in found
        if m.id == "django_leases.E031" or (m.id == "django_leases.E016" and "PRUNE" in m.msg)
    ]


# -- off by default; the declaration ------------------------------------------------------------


def test_without_the_setting_nothing_is_pruned_on_a_schedule() -> None:
    assert leases_settings.PRUNE is None  # the suite's settings: no prune firing in any test
    assert PRUNE_SCHEDULE not in {s.name for s in registry.declared_schedules()}
    with override_settings(DJANGO_LEASES={"PRUNE": None}):
        assert PRUNE_SCHEDULE not in {s.name for s in registry.declared_schedules()}
        assert registry.prune_problems() == []
    # The built-in workflow and step function are registered all the same.
    assert registry.get_workflow(PRUNE_WORKFLOW) is not None
    assert registry.get_step_function(PRUNE_FUNCTION) is not None


def test_the_setting_declares_the_built_in_schedule() -> None:
    setting = {
        "schedule": "17 3 * * *",
        "older_than": timedelta(days=30),
        "batch_size": 100,
        "timezone": "Europe/Paris",
        "queue": "tests-other",
    }
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": setting}):
        (found,) = [s for s in registry.declared_schedules() if s.name == PRUNE_SCHEDULE]
        assert registry.prune_problems() == []
    assert found == ScheduleDeclaration(
        name=PRUNE_SCHEDULE,
        workflow=PRUNE_WORKFLOW,
        cron="17 3 * * *",
        timezone="Europe/Paris",
        input={"older_than": 30 * 24 * HOUR, "batch_size": 100, "queue": "tests-other"},
        catch_up="latest",
        origin='DJANGO_LEASES["PRUNE"]',
    )
    with override_settings(DJANGO_LEASES={"PRUNE": {"schedule": "0 * * * *", "older_than": 60}}):
        (found,) = [s for s in registry.declared_schedules() if s.name == PRUNE_SCHEDULE]
    assert found.input == {"older_than": 60.0, "batch_size": 500, "queue": "default"}
    assert found.timezone == "UTC" and found.catch_up == "latest"


# -- the system check ---------------------------------------------------------------------------


def test_a_usable_setting_passes_the_checks() -> None:
    assert e031({"schedule": "17 * * * *", "older_than": timedelta(days=30)}) == []
    assert e031({"schedule": "*/10 * * * * *", "older_than": 0, "batch_size": 10_000}) == []
    assert e031(None) == []


@pytest.mark.parametrize(
    ("prune", "said"),
    [
        ({"schedule": "61 * * * *", "older_than": 60}, "[\"schedule\"] = '61 * * * *'"),
        ({"schedule": "61 * * * *", "older_than": 60}, "not a cron expression: Bad minute"),
        ({"schedule": "* * */20 * 1L", "older_than": 60}, "never matches"),
        ({"schedule": "", "older_than": 60}, "non-empty"),
        ({"schedule": "0 * * * *", "older_than": -1}, "at least 0 seconds, got -1"),
        ({"schedule": "0 * * * *", "older_than": timedelta(days=-1)}, "at least 0 seconds"),
        ({"schedule": "0 * * * *", "older_than": "30d"}, "timedelta or a number of seconds"),
        ({"schedule": "0 * * * *", "older_than": True}, "timedelta or a number of seconds"),
        ({"schedule": "0 * * * *", "older_than": float("nan")}, "finite"),
        ({"schedule": "0 * * * *", "older_than": timedelta(days=40_000)}, "longer than"),
        ({"schedule": "0 * * * *", "older_than": 60, "batch_size": 0}, "between 1 and 10000"),
        ({"schedule": "0 * * * *", "older_than": 60, "batch_size": 10_001}, "between 1 and"),
        ({"schedule": "0 * * * *", "older_than": 60, "batch_size": True}, "an int, not bool"),
        ({"schedule": "0 * * * *", "older_than": 60, "batch_size": "500"}, "an int, not str"),
        ({"schedule": "0 * * * *", "older_than": 60, "timezone": "Mars/Olympus"}, "unknown time"),
        ({"schedule": "0 * * * *", "older_than": 60, "queue": ""}, "must not be empty"),
        ({"schedule": "0 * * * *", "older_than": 60, "queue": "nope"}, "does not configure"),
        ({"schedule": "0 * * * *", "older_than": 60, "every": 1}, "unknown key(s) 'every'"),
        ({"schedule": "0 * * * *", "older_than": 60, "cron": "0 * * * *"}, "unknown key(s)"),
        ({"older_than": 60}, "lacks 'schedule'"),
        ({"schedule": "0 * * * *"}, "lacks 'older_than'"),
        ({}, "lacks 'schedule' and 'older_than'"),
    ],
)
def test_the_check_refuses_an_unusable_setting(prune: dict[str, Any], said: str) -> None:
    (message,) = e031(prune)
    assert message.startswith('django_leases.E031 DJANGO_LEASES["PRUNE"]'), message
    assert said in message, message
    with override_settings(DJANGO_LEASES={"PRUNE": prune}):
        # Refused whole: no half-kept prune schedule.
        assert PRUNE_SCHEDULE not in {s.name for s in registry.declared_schedules()}


def test_every_problem_is_reported_at_once() -> None:
    messages = e031({"schedule": "0 25 * * *", "older_than": -5, "size": 3})
    assert len(messages) == 3, messages
    text = "\n".join(messages)
    assert "'size'" in text and "Bad hour" in text and "got -5" in text


@pytest.mark.parametrize("prune", ["17 * * * *", 30, ["17 * * * *", 30]])
def test_a_setting_that_is_not_a_dict_is_e016(prune: object) -> None:
    (message,) = e031(prune)
    assert message.startswith("django_leases.E016 DJANGO_LEASES['PRUNE'] must be None")


def test_a_schedule_named_like_the_built_in_one_is_refused() -> None:
    name = "tests.prune-schedule.noop"
    registry._workflows[name] = lambda run, input: input
    try:
        schedules = {PRUNE_SCHEDULE: {"workflow": name, "cron": "0 * * * *"}}
        prune = {"schedule": "0 * * * *", "older_than": 60}
        (message,) = e031(prune, SCHEDULES=schedules)
        assert f"{PRUNE_SCHEDULE!r}, is taken by the SCHEDULES entry" in message
        with override_settings(DJANGO_LEASES={"SCHEDULES": schedules, "PRUNE": prune}):
            (kept,) = [s for s in registry.declared_schedules() if s.name == PRUNE_SCHEDULE]
        assert kept.workflow == name  # the user's entry stays; the prune is left out
    finally:
        registry._workflows.pop(name, None)


def test_the_check_is_in_the_checks_table() -> None:
    assert "``django_leases.E031``" in (checks.__doc__ or "")


# -- syncing, firing, pruning -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tick_prunes_old_finished_runs_and_leaves_the_others(pruning: dict[str, Any]) -> None:
    old = [seeded(status, 2) for status in ("completed", "failed", "cancelled")] + [
        seeded(RunStatus.COMPLETED, 3) for _ in range(2)
    ]
    recent = seeded(RunStatus.COMPLETED, 0.5)
    running = seeded(RunStatus.RUNNING, None)
    suspended = seeded(RunStatus.SUSPENDED, 2)
    tick = make_due(1)
    fired = [f for f in WorkflowSchedule.objects.fire_due() if f.name == PRUNE_SCHEDULE]
    assert fired[0].tick == tick
    first = WorkflowRun.objects.get(pk=fired[0].run_id)
    assert first.workflow == PRUNE_WORKFLOW and first.key == run_key(PRUNE_SCHEDULE, tick)
    assert first.input == {"older_than": HOUR, "batch_size": 2, "queue": "default"}

    drive()
    assert not WorkflowRun.objects.filter(pk__in=[run.id for run in old]).exists()
    for kept in (recent, running, suspended):
        assert WorkflowRun.objects.get(pk=kept.id).status == kept.status
    runs = prune_runs()
    # The prune schedule skips a tick while its previous prune is live (overlap "skip").
    assert len(runs) == len([f for f in fired if f.run_id is not None])
    assert all(run.status == RunStatus.COMPLETED for run in runs)
    first.refresh_from_db()
    # Each old run deleted once: the outputs add up to what went; the prune that ran first
    # took them all, two per transaction, and the later ones found nothing left.
    deleted = sorted(run.output["deleted"] for run in runs)
    assert deleted == [0] * (len(runs) - 1) + [5]
    step = WorkflowStep.objects.get(run_id=first.id)
    assert (step.step_name, step.function_name) == (PRUNE_STEP, PRUNE_FUNCTION)
    assert step.retries == PRUNE_RETRIES and step.result == first.output
    row = WorkflowSchedule.objects.get(name=PRUNE_SCHEDULE)
    assert row.last_run_id == runs[-1].id


@pytest.mark.django_db(transaction=True)
def test_a_prune_never_deletes_itself_but_earlier_prunes_go(pruning: dict[str, Any]) -> None:
    # Two earlier prunes, finished (as if started by ticks before).
    earlier = [
        WorkflowRun.objects.start(PRUNE_WORKFLOW, {"older_than": HOUR}, key=f"earlier-{i}").id
        for i in range(2)
    ]
    drive()
    assert WorkflowRun.objects.filter(pk__in=earlier, status=RunStatus.COMPLETED).count() == 2
    # With older_than 0 every finished run is old enough: the earlier prunes go, the one
    # pruning (running while its step runs) does not.
    everything = {**EVERY_SECOND, "older_than": 0}
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": everything}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
        tick = make_due(0)
        (fired, *_) = WorkflowSchedule.objects.fire_due()
        assert fired.tick == tick
        drive(fired.run_id)
    pruning_run = WorkflowRun.objects.get(pk=fired.run_id)
    assert pruning_run.status == RunStatus.COMPLETED
    assert pruning_run.output == {"deleted": 2}
    assert not WorkflowRun.objects.filter(pk__in=earlier).exists()


@pytest.mark.django_db(transaction=True)
def test_threads_racing_the_firing_start_one_prune_per_tick(pruning: dict[str, Any]) -> None:
    old = [seeded(RunStatus.COMPLETED, 2) for _ in range(5)]
    first = make_due(4)
    # Every tick starts its prune here (not "skip", the prune schedule's own policy).
    WorkflowSchedule.objects.filter(name=PRUNE_SCHEDULE).update(overlap="allow")
    fired = []
    for _ in range(3):
        outcomes = race([WorkflowSchedule.objects.fire_due] * 3)
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        fired += [f for outcome in outcomes for f in outcome if f.name == PRUNE_SCHEDULE]
    ticks = [f.tick for f in fired]
    assert len(ticks) == len(set(ticks)), "a tick was fired twice"
    runs = prune_runs()
    started = [tick_of(run) for run in runs]
    # One prune per tick from the first due one on: none skipped, none doubled.
    assert started == [first + timedelta(seconds=i) for i in range(len(started))]
    assert sorted(t for t in ticks if t is not None) == started and len(started) >= 5

    drive()
    runs = prune_runs()
    assert all(run.status == RunStatus.COMPLETED for run in runs)
    assert sum(run.output["deleted"] for run in runs) == len(old)
    assert not WorkflowRun.objects.filter(pk__in=[run.id for run in old]).exists()


@pytest.mark.django_db(transaction=True)
def test_after_downtime_one_catch_up_prune_runs(pruning: dict[str, Any]) -> None:
    hourly = {"schedule": "0 * * * *", "older_than": timedelta(hours=1)}
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": hourly}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
        now = db_now()
        missed = latest_tick("0 * * * *", "UTC", now - timedelta(hours=5))
        assert missed is not None
        WorkflowSchedule.objects.filter(name=PRUNE_SCHEDULE).update(
            next_tick=to_stored(missed, connection.alias)
        )
        fired = WorkflowSchedule.objects.fire_due()
    (only,) = fired
    assert only.name == PRUNE_SCHEDULE and only.tick is not None
    # The latest hourly tick, whatever the hours missed before it.
    assert only.tick >= missed + timedelta(hours=5)
    assert (db_now() - only.tick).total_seconds() < HOUR + MISSED_AFTER
    assert [tick_of(run) for run in prune_runs()] == [only.tick]


@pytest.mark.django_db(transaction=True)
def test_a_changed_setting_reaches_the_row_and_a_removed_one_stops_it(
    pruning: dict[str, Any],
) -> None:
    row = WorkflowSchedule.objects.get(name=PRUNE_SCHEDULE)
    assert row.declared and row.input["older_than"] == HOUR and row.catch_up == "latest"
    changed = {**EVERY_SECOND, "older_than": 7 * 24 * HOUR, "batch_size": 50}
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": changed}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
    row.refresh_from_db()
    assert row.input == {"older_than": 7 * 24 * HOUR, "batch_size": 50, "queue": "default"}
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": None}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
    row.refresh_from_db()
    assert not row.declared
    make_due(1)
    assert [f for f in WorkflowSchedule.objects.fire_due() if f.name == PRUNE_SCHEDULE] == []


@pytest.mark.django_db(transaction=True)
def test_operators_see_the_schedule_and_can_pause_it(pruning: dict[str, Any]) -> None:
    out = StringIO()
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": EVERY_SECOND}):
        call_command("workflow_schedules", "list", "--format", "json", stdout=out)
        (listed,) = [s for s in json.loads(out.getvalue()) if s["name"] == PRUNE_SCHEDULE]
        assert listed["workflow"] == PRUNE_WORKFLOW and listed["cron"] == "* * * * * *"
        assert listed["input"] == {"older_than": HOUR, "batch_size": 2, "queue": "default"}
        call_command("workflow_schedules", "pause", PRUNE_SCHEDULE, stdout=StringIO())
    make_due(1)
    assert [f for f in WorkflowSchedule.objects.fire_due() if f.name == PRUNE_SCHEDULE] == []
    assert prune_runs() == []


@pytest.mark.django_db(transaction=True)
def test_a_prune_on_another_queue_is_claimed_from_it(
    pruning: dict[str, Any],
) -> None:
    queued = {**EVERY_SECOND, "queue": "tests-other"}
    with override_settings(DJANGO_LEASES={**_suite_settings(), "PRUNE": queued}):
        WorkflowSchedule.objects.sync(registry.declared_schedules())
        make_due(0)
        (fired, *_) = WorkflowSchedule.objects.fire_due()
        drive(fired.run_id)
    step = WorkflowStep.objects.get(run_id=fired.run_id)
    assert step.queue == "tests-other"
    assert WorkflowRun.objects.get(pk=fired.run_id).status == RunStatus.COMPLETED


def test_the_step_refuses_data_without_older_than() -> None:
    from django_leases.workflows.retention import prune_finished_runs

    with pytest.raises(ValueError, match="older_than"):
        prune_finished_runs({"batch_size": 2}, None)


# -- real worker processes ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_worker_processes_prune_once_per_tick(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.pruneapp.settings"}
    old = [seeded(RunStatus.COMPLETED, 2) for _ in range(5)]
    kept = [seeded(RunStatus.COMPLETED, 0.5), seeded(RunStatus.RUNNING, None)]
    workers = [
        start_process([*MANAGE_PY, "run_workflow_worker", "--concurrency", "1"], env=env)
        for _ in range(2)
    ]

    def pruned_and_settled() -> bool:
        finished = WorkflowRun.objects.filter(
            workflow=PRUNE_WORKFLOW, status=RunStatus.COMPLETED
        ).count()
        return finished >= 4 and not WorkflowRun.objects.filter(pk__in=[r.id for r in old]).exists()

    wait_until(pruned_and_settled, timeout=90, interval=0.1, what="four prunes, the old runs gone")
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            _, stderr = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover - reported below
            worker.kill()
            _, stderr = worker.communicate()
        assert worker.returncode == 0, stderr

    runs = prune_runs()
    started = [tick_of(run) for run in runs]
    row = WorkflowSchedule.objects.get(name=PRUNE_SCHEDULE)
    # At most one prune per tick, in tick order: none doubled. A tick while the previous
    # prune was still live starts nothing (overlap "skip") and is counted as skipped.
    assert started == sorted(set(started)), started
    gaps = int((started[-1] - started[0]).total_seconds()) + 1 - len(started)
    assert gaps <= row.skipped_ticks, (started, row.skipped_ticks)
    assert to_aware(row.last_tick, "default") == started[-1]  # type: ignore[arg-type]
    # Each old run deleted by exactly one prune: what the prunes say they deleted adds up.
    results = WorkflowStep.objects.filter(
        run__workflow=PRUNE_WORKFLOW, step_name=PRUNE_STEP, status="succeeded"
    ).values_list("result", flat=True)
    assert sum(result["deleted"] for result in results) == len(old)
    for run in runs:
        if run.status == RunStatus.COMPLETED:
            assert set(run.output) == {"deleted"}
    for run in kept:
        assert WorkflowRun.objects.get(pk=run.id).status == run.status
    assert all(
        run.input == {"older_than": HOUR, "batch_size": 2, "queue": "default"} for run in runs
    )


def test_a_worker_refuses_to_start_on_an_unusable_prune_setting(
    subprocess_env: dict[str, str],
) -> None:
    env = {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.pruneapp.settings",
        "PRUNE_BAD_SETTING": "1",
    }
    worker = manage("run_workflow_worker", "--once", env=env)
    assert worker.returncode != 0
    assert "django_leases.E031" in worker.stderr
    assert 'DJANGO_LEASES["PRUNE"]["older_than"] = -60' in worker.stderr
    assert not WorkflowSchedule.objects.exists()  # nothing synced, nothing fired
    assert not WorkflowRun.objects.filter(workflow=PRUNE_WORKFLOW).exists()


@pytest.mark.django_db(transaction=True)
def test_the_admin_shows_the_schedule_and_its_run_s_output(pruning: dict[str, Any]) -> None:
    from django.urls import reverse

    from tests.helpers import staff_client

    seeded(RunStatus.COMPLETED, 2)
    make_due(0)
    # One tick, or (a per-second schedule on a slow machine) the ticks that passed meanwhile
    # too, those after the first skipped while its run is live (overlap "skip"): the
    # schedule's last run is the last one a tick started.
    fired_all = WorkflowSchedule.objects.fire_due()
    fired = fired_all[0]
    drive(fired.run_id)
    started = [tick.run_id for tick in fired_all if tick.run_id is not None]
    last = WorkflowSchedule.objects.get(name=PRUNE_SCHEDULE).last_run_id
    assert last is not None and last == started[-1]
    client = staff_client("view_workflowschedule", "view_workflowrun")
    html = client.get(reverse("admin:django_leases_workflowschedule_changelist")).content.decode()
    assert PRUNE_SCHEDULE in html
    assert reverse("admin:django_leases_workflowrun_change", args=[last]) in html
    page = client.get(reverse("admin:django_leases_workflowrun_change", args=[fired.run_id]))
    assert page.status_code == 200
    assert '<span class="dl-json">{&quot;deleted&quot;: 1}</span>' in page.content.decode()
