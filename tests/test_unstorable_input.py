"""Values of the right type that a database cannot store, or cannot give back: a NUL or a
lone surrogate in a queue key, a ``run_after`` whose instant falls outside years 1–9999
in UTC, a schedule's input no run could carry. Each is refused where it enters, with a
``ValueError`` (``InvalidTask`` for a task) naming it, and nothing is written — never a
driver's error, a run replayed for ever, or a stored row no query can read back. (And a
workflow name that is not a ``str``: a ``ValueError`` too, not the registry's
``TypeError``.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_leases.clock import to_stored
from django_leases.models import WorkflowRun, WorkflowSchedule, WorkflowStep
from django_leases.workflows import registry, start_workflow, step_function, workflow
from django_leases.workflows.schedules import declaration
from django_leases.workflows.worker import Worker
from tests.helpers import work_until_idle

#: Text no supported database stores in every backend: a NUL (PostgreSQL refuses it) and a
#: lone surrogate (not encodable as UTF-8). ``check_name`` refuses both for every name.
UNSTORABLE = [pytest.param("a\x00", id="nul"), pytest.param("a\ud800", id="lone-surrogate")]

#: Aware datetimes whose UTC instant is outside years 1..9999 (what Python's ``datetime``, so
#: every driver, can give back), though their own fields are in range.
OUT_OF_YEARS = [
    pytest.param(datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))), id="after-9999"),
    pytest.param(datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5))), id="before-0001"),
]

#: The step's queue key, set by the test (text the run's input could not carry).
STEP_QUEUE_KEY: Any = None


@step_function("tests.unstorable.echo")
def _echo(data: Any, ctx: Any) -> Any:
    return data


@workflow("tests.unstorable.keyed-step")
def _keyed_step(run: Any, input: Any) -> Any:
    return run.step("s", "tests.unstorable.echo", {"x": 1}, queue_key=STEP_QUEUE_KEY)


# -- queue keys ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("queue_key", UNSTORABLE)
def test_start_workflow_refuses_an_unstorable_queue_key(queue_key: str) -> None:
    """A queue key is a name like a run key or a tag: a NUL (which PostgreSQL refuses, and
    the others would store) or a lone surrogate (the driver's ``UnicodeEncodeError``) is a
    ``ValueError`` naming ``queue_key``, with no run written."""
    with pytest.raises(ValueError, match="queue_key") as raised:
        start_workflow("tests.sub.two-steps", queue_key=queue_key)
    assert not isinstance(raised.value, UnicodeError)
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queue_key", UNSTORABLE)
def test_a_step_queue_key_the_database_cannot_store_fails_the_run(queue_key: str) -> None:
    """``run.step(queue_key=...)`` with such a key fails the run at once with a
    ``ValueError`` naming ``queue_key``, as a 256-character key does, and creates no step.
    (Before, on PostgreSQL the pass's write raised ``DataError`` and the run was replayed
    by every worker unit for ever.)"""
    global STEP_QUEUE_KEY
    STEP_QUEUE_KEY = queue_key
    try:
        run_id = start_workflow("tests.unstorable.keyed-step")
        work_until_idle(Worker(step_lease_ttl=60.0), units=20)
    finally:
        STEP_QUEUE_KEY = None
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.error["type"] == "ValueError" and "queue_key" in run.error["message"]
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()


# -- run_after beyond the years a datetime holds ------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("when", OUT_OF_YEARS)
def test_start_workflow_refuses_a_run_after_outside_the_storable_years(when: datetime) -> None:
    """Its fields are in range, its instant in UTC is not: a ``ValueError`` naming
    ``run_after``, nothing stored. (Before: a bare ``OverflowError`` on SQLite and MariaDB;
    on PostgreSQL a stored run that no query could read back — ``timestamp too large``.)"""
    with pytest.raises(ValueError, match="run_after"):
        start_workflow("tests.sub.two-steps", run_after=when)
    assert list(WorkflowRun.objects.all()) == []


@pytest.mark.django_db
def test_enqueue_refuses_a_run_after_outside_the_storable_years() -> None:
    """The same through the Tasks backend: a task whose ``run_after`` is past 9999-12-31 in
    UTC is Django's ``InvalidTask`` naming ``run_after``, with nothing stored."""
    tasks_api = pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)
    from tests.workapp import tasks

    when = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))
    with pytest.raises(tasks_api.InvalidTask, match="run_after"):
        tasks.echo.using(run_after=when).enqueue()
    assert list(WorkflowRun.objects.all()) == []


# -- schedule input -----------------------------------------------------------------------------


def _nested(levels: int) -> Any:
    """A list nested ``levels`` levels deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "input",
    [
        pytest.param({"a": "\x00"}, id="nul"),
        pytest.param({"a": "\ud800"}, id="lone-surrogate"),
        pytest.param({1: "a", "1": "b"}, id="two-keys-written-alike"),
        pytest.param(_nested(101), id="nested-101"),
    ],
)
def test_a_schedule_input_the_runs_cannot_store_is_refused_at_declaration(input: Any) -> None:
    """``declaration()`` (``@workflow(schedule=...)``, ``DJANGO_LEASES["SCHEDULES"]``, check
    ``E026``) checks the input as every tick's start will: a NUL, a lone surrogate, nesting
    past the package's limit, or keys written alike (``1`` and ``"1"``: the run would get
    one of them) is refused, naming the schedule."""
    with pytest.raises(ValueError, match="Schedule 'nightly'"):
        declaration("nightly", "tests.sub.two-steps", "0 3 * * *", input=input)


@pytest.mark.django_db(transaction=True)
def test_one_unstorable_schedule_input_does_not_stop_the_other_schedules() -> None:
    """A settings entry with such an input is reported (check ``E026``) and left out; the
    other schedules sync and fire. (Before: on PostgreSQL ``sync`` raised ``DataError`` and
    no schedule fired; elsewhere the bad tick's ``ValueError`` stopped those after it.)"""
    schedules = {
        "a-bad": {"workflow": "tests.sub.two-steps", "cron": "* * * * * *", "input": {"a": "\x00"}},
        "b-good": {"workflow": "tests.sub.two-steps", "cron": "* * * * * *"},
    }
    with override_settings(DJANGO_LEASES={**settings.DJANGO_LEASES, "SCHEDULES": schedules}):
        problems = registry.schedule_problems()
        WorkflowSchedule.objects.sync(registry.declared_schedules())
        WorkflowSchedule.objects.update(
            next_tick=to_stored(datetime.now(UTC) - timedelta(seconds=1), connection.alias)
        )
        WorkflowSchedule.objects.fire_due()
    assert WorkflowRun.objects.filter(key__startswith="schedule:b-good:").exists()
    assert any("'a-bad'" in problem for problem in problems)


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_schedule_input_mariadb_cannot_store_is_not_dropped_silently() -> None:
    """MariaDB's JSON columns refuse a value nested 32 levels or more, which a declaration
    (checked against the package's limit of 100) accepts. ``sync`` refuses it, naming the
    schedule, with nothing written. (Before: ``INSERT IGNORE`` turned the column's check
    into a warning, and the schedule silently got no row.)"""
    deep = declaration("deep", "tests.sub.two-steps", "0 3 * * *", input=_nested(40))
    other = declaration("other", "tests.sub.two-steps", "0 3 * * *")
    with pytest.raises(ValueError, match="Schedule 'deep'"):
        WorkflowSchedule.objects.sync([deep, other])
    assert not WorkflowSchedule.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", [["a"], {"a": 1}, None, 7])
def test_start_workflow_refuses_a_name_that_is_not_a_str(name: Any) -> None:
    """A workflow name of another type is a ``ValueError`` saying so (a list or a dict was a
    bare ``TypeError: unhashable type`` from the registry's lookup), nothing written."""
    with pytest.raises(ValueError, match="A workflow name must be a str"):
        start_workflow(name)
    assert not WorkflowRun.objects.exists()
