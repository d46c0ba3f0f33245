"""The demo tour's last stage: the shop's ``@task`` receipts on the ``mail`` queue and the
per-second ``demo-tick`` schedule, and the checks the tour makes of them.

The tour itself (``tests/test_demo_tour.py``) runs the stage against real worker processes;
here each part runs on the calling thread (``drive()``, ``fire_due()``), and the tour's
checks are fed runs that break them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)

from django.db import connection
from django.test import override_settings

from demo_project import settings as demo_settings
from demo_project.journal.models import Outcome, StepExecution
from demo_project.journal.workflows import TICK_SCHEDULE, TICK_WORKFLOW
from demo_project.tour import StageFailed, fired_by, one_at_a_time, one_run_per_tick
from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.tasks_api import TaskResultStatus
from django_leases.testing import drive
from django_leases.workflows.registry import declared_schedules
from tests.helpers import race

#: The demo's own task and queue settings (the suite's settings list other queues).
DEMO_TASKS = override_settings(
    TASKS=demo_settings.TASKS,
    DJANGO_LEASES={**demo_settings.DJANGO_LEASES, "QUEUES": demo_settings.DJANGO_LEASES["QUEUES"]},
)
#: The demo's schedules (the suite's settings declare none).
DEMO_SCHEDULES = override_settings(
    DJANGO_LEASES={"SCHEDULES": demo_settings.DJANGO_LEASES["SCHEDULES"]}
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the tour's checks --------------------------------------------------------------------------


def test_one_at_a_time_accepts_spans_that_follow_each_other_in_any_order() -> None:
    one_at_a_time("journal", [("b", at(1), at(2)), ("a", at(0), at(1)), ("c", at(2.5), at(3))])


@pytest.mark.parametrize(
    "spans",
    [
        [("a", at(0), at(1)), ("b", at(0.9), at(2))],  # b started before a finished
        [("a", at(0), at(5)), ("b", at(1), at(2))],  # b inside a
        [("a", at(0), None)],  # never finished
    ],
)
def test_one_at_a_time_refuses_overlapping_or_unfinished_spans(spans: list[Any]) -> None:
    with pytest.raises(StageFailed):
        one_at_a_time("journal", spans)


def key(seconds: float) -> str:
    return f"schedule:{TICK_SCHEDULE}:{at(seconds).isoformat()}"


def test_one_run_per_tick_returns_consecutive_ticks() -> None:
    assert one_run_per_tick(TICK_SCHEDULE, [key(2), key(0), key(1)]) == [at(0), at(1), at(2)]


@pytest.mark.parametrize(
    "keys",
    [
        [],  # no run at all
        [key(0), key(0), key(1)],  # a tick with two runs
        [key(0), key(2)],  # a tick skipped
        [key(0), "schedule:other:" + at(1).isoformat()],  # another schedule's run
    ],
)
def test_one_run_per_tick_refuses_doubles_gaps_and_strangers(keys: list[str]) -> None:
    with pytest.raises(StageFailed):
        one_run_per_tick(TICK_SCHEDULE, keys)


def fired_line(run_id: str, seconds: float = 0) -> str:
    return f"INFO Schedule '{TICK_SCHEDULE}': tick {at(seconds).isoformat()} started run {run_id}"


def test_fired_by_names_the_one_worker_whose_log_reports_each_run() -> None:
    one, two = str(uuid.uuid4()), str(uuid.uuid4())
    logs = {"worker-1": fired_line(one) + "\nnoise\n", "worker-4": fired_line(two, 1)}
    assert fired_by(TICK_SCHEDULE, logs, [one, two]) == {one: "worker-1", two: "worker-4"}


def test_fired_by_refuses_a_run_reported_twice_or_by_nobody() -> None:
    one = str(uuid.uuid4())
    with pytest.raises(StageFailed, match="fired by"):
        fired_by(TICK_SCHEDULE, {"worker-1": fired_line(one), "worker-4": fired_line(one)}, [one])
    with pytest.raises(StageFailed, match="no worker"):
        fired_by(TICK_SCHEDULE, {"worker-1": "nothing"}, [one])


# -- the receipts -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_receipt_task_runs_on_the_mail_queue_and_journals_its_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEMO_MAIL_SECONDS", "0")
    with DEMO_TASKS:
        from demo_project.shop.tasks import JOURNAL_STEP, MAIL_QUEUE, send_receipt_email

        assert send_receipt_email.queue_name == MAIL_QUEUE == "mail"
        result = send_receipt_email.enqueue(order="order-1", email="ada@example.com")
        assert result.status == TaskResultStatus.READY
        drive()
        done = send_receipt_email.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value["order"] == "order-1"
    assert done.return_value["to"] == "ada@example.com"
    assert done.return_value["attempt"] == done.attempts == 1
    entry = StepExecution.objects.get(run_id=uuid.UUID(str(result.id)), step_name=JOURNAL_STEP)
    assert entry.outcome == Outcome.DONE and entry.finished_at is not None
    assert entry.pid == done.return_value["pid"]
    assert str(entry.pid) == done.worker_ids[-1].split(":")[-2]
    one_at_a_time("results", [(done.id, done.started_at, done.finished_at)])


# -- the schedule -------------------------------------------------------------------------------


def declare_and_pause() -> WorkflowSchedule:
    WorkflowSchedule.objects.sync(declared_schedules())
    WorkflowSchedule.objects.set_paused(TICK_SCHEDULE, True)
    return WorkflowSchedule.objects.get(name=TICK_SCHEDULE)


def make_due(row: WorkflowSchedule) -> datetime:
    """Move the schedule's next tick one whole second into the past (database clock)."""
    now = WorkflowSchedule.objects.filter(pk=row.pk).annotate(db=DbNow()).get().db
    tick = to_aware(now, connection.alias).replace(microsecond=0) - timedelta(seconds=1)
    WorkflowSchedule.objects.filter(pk=row.pk).update(next_tick=to_stored(tick, connection.alias))
    return tick


def tick_runs() -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(workflow=TICK_WORKFLOW))


@pytest.mark.django_db(transaction=True)
def test_the_paused_tick_schedule_fires_nothing_and_resumed_fires_each_tick_once() -> None:
    with DEMO_SCHEDULES:
        row = declare_and_pause()
        assert row.cron == "* * * * * *" and row.workflow == TICK_WORKFLOW and row.paused
        make_due(row)
        assert WorkflowSchedule.objects.fire_due() == []
        assert tick_runs() == []

        WorkflowSchedule.objects.set_paused(TICK_SCHEDULE, False)
        tick = make_due(row)
        # Three callers race, as the tour's workers do, for that tick and the current one
        # (due too: a tick less than a second late is fired, not skipped): one run per tick.
        fired = race([WorkflowSchedule.objects.fire_due] * 3)
        assert not [each for each in fired if isinstance(each, BaseException)]
        runs = tick_runs()
        ticks = one_run_per_tick(TICK_SCHEDULE, [run.key or "" for run in runs])
        assert ticks[0] == tick and len(ticks) == len(runs) >= 2
        assert sorted(f.run_id for each in fired for f in each) == sorted(r.id for r in runs)
        WorkflowSchedule.objects.set_paused(TICK_SCHEDULE, True)
        for run in runs:
            done = drive(run.id)
            assert done is not None and isinstance(done.output["pid"], int)
