"""A worker that drains tasks chains them: the write of each task's result claims the next due
step (``set_result_completing_run(next_step_ttl=...)``, on PostgreSQL inside the same
statement), and the thread runs it next. The claim must decide as ``claim_due`` does although
the write may wait for row locks first, the claimed step is the thread's from that write on
(its lease renewed while the previous task's signals run), and a stopping worker leaves no
claimed step behind."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest

pytest.importorskip(
    "django_leases.tasks_api",
    reason="needs Django 6 or the django-tasks backport (pip install -e '.[dev]')",
    exc_type=ImportError,
)

from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_leases.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.signals import lease_released
from django_leases.tasks import _task_of
from django_leases.tasks_api import InvalidTask, TaskResultStatus, task, task_finished
from django_leases.workflows.worker import Worker
from tests.helpers import on_another_thread, start_blocked, tuned_sql, wait_until
from tests.test_task_completion import claimed_task, complete_claiming
from tests.workapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)

_ran: Counter[str] = Counter()
_ran_lock = threading.Lock()


@task
def counted(key: str) -> str:
    """Counts its runs by ``key``."""
    with _ran_lock:
        _ran[key] += 1
    return key


@pytest.fixture(autouse=True)
def _forget_runs() -> None:
    _ran.clear()


def past(moment: Any) -> bool:
    """Whether the database clock (PostgreSQL) has passed ``moment``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp() > %s", [moment])
        return bool(cursor.fetchone()[0])


@pytest.mark.postgres_only
@pytest.mark.parametrize("ending", ["fail", "suspend", "complete", "cancel"])
@pytest.mark.parametrize("held", ["step-row", "run-row"])
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_a_step_of_a_run_that_ended_while_the_write_waited_is_not_claimed(
    ending: str, held: str, tuned: bool
) -> None:
    """The write of task A's result waits for a row lock (A's step: as behind a cancel; A's
    run: as behind a pass being picked) while run B ends and commits. B's step is still
    ``pending`` (a fail, a suspension or a completion changes only B's run row): the claim
    must see B's run as it is now, not as the write's snapshot had it."""
    with tuned_sql(tuned):
        first = claimed_task()
        other = uuid.UUID(t.add.enqueue(5, 6).id)
        with transaction.atomic():
            if held == "step-row":
                WorkflowStep.objects.select_for_update().get(pk=first.step_id)
            else:
                WorkflowRun.objects.select_for_update().get(pk=first.run_id)
            blocked = start_blocked(lambda: complete_claiming(first))
            assert blocked.waited, "the write did not wait for the lock"

            def end_other() -> None:
                runs = WorkflowRun.objects
                if ending == "fail":
                    assert runs.fail(other, "boom")
                elif ending == "suspend":
                    assert runs.suspend(other, "operator")
                elif ending == "cancel":
                    runs.cancel(other)
                else:
                    assert runs.complete(other, 0)

            on_another_thread(end_other)
        done = blocked.result()
    assert done.completed
    assert WorkflowRun.objects.get(pk=other).status != RunStatus.RUNNING
    assert done.next_step is None, WorkflowStep.objects.get(run_id=other).status
    assert WorkflowStep.objects.get(run_id=other).status != StepStatus.RUNNING


@pytest.mark.parametrize("queues", [["default"], None], ids=["in-the-write", "after-the-write"])
def test_worker_threads_draining_a_backlog_run_each_task_once(queues: list[str] | None) -> None:
    """Four threads of one worker: ``["default"]`` (no limits) claims inside the write on
    PostgreSQL; every queue (the suite's limited ones too) claims after it."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite writes one at a time: there is no race to lose")
    results = [counted.enqueue(f"k{n}") for n in range(60)]
    worker = Worker(4, step_lease_ttl=30, poll_interval=0.2, queues=queues)
    assert worker.run(once=True, handle_signals=False) == 0
    assert sorted(_ran) == sorted(f"k{n}" for n in range(60))
    assert set(_ran.values()) == {1}, {key: n for key, n in _ran.items() if n != 1}
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert not WorkflowStepAttempt.objects.exclude(attempt=1).exists()
    assert not WorkflowStep.objects.filter(status=StepStatus.RUNNING).exists()


@pytest.mark.postgres_only
def test_a_step_claimed_by_the_write_of_a_stopping_worker_is_still_run() -> None:
    """The stop comes while the write of b's result (which claims c) runs: c is run and
    recorded, not left claimed by a worker that stopped."""
    with tuned_sql(True):
        _, b, c = (counted.enqueue(key) for key in "abc")
        worker = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["default"])
        assert worker.work_once() is True  # a; its write picks a pass (the passes' turn)
        assert _ran == {"a": 1}

        def stop(sender: Any, lease: Any, **kwargs: Any) -> None:
            if lease.key.endswith(b.id):
                worker.stop()

        lease_released.connect(stop)
        try:
            assert worker.work_once() is True  # b, whose write claims c
        finally:
            lease_released.disconnect(stop)
    assert _ran == {"a": 1, "b": 1, "c": 1}
    c.refresh()
    assert c.status == TaskResultStatus.SUCCESSFUL
    assert not WorkflowStep.objects.filter(status=StepStatus.RUNNING).exists()


@pytest.mark.postgres_only
def test_the_claimed_steps_lease_is_renewed_while_the_previous_tasks_receivers_run() -> None:
    """The write of a's result claims b; a's signals (user receivers) are sent after it. A
    ``task_finished`` receiver that outlasts b's step lease (3 s) must not lose b to another
    worker: b's lease is renewed meanwhile (every TTL/3), and b runs once, here."""
    with tuned_sql(True):
        _, a, b = (counted.enqueue(key) for key in "xab")
        worker = Worker(1, step_lease_ttl=3, poll_interval=3600, queues=["default"])
        assert worker.work_once() is True  # x; its write picks a pass (the passes' turn)
        looked: list[Any] = []

        def slow(sender: Any, task_result: Any, **kwargs: Any) -> None:
            if task_result.id != a.id or looked:
                return
            step = WorkflowStep.objects.get(run_id=uuid.UUID(b.id))
            assert step.status == StepStatus.RUNNING and step.lease_expires_at is not None
            first_expiry = step.lease_expires_at
            # Outlast the lease b was claimed with, on the database clock; it must have
            # been renewed meanwhile.
            wait_until(lambda: past(first_expiry), timeout=30, what="b's first expiry")
            renewed = WorkflowStep.objects.get(pk=step.pk).lease_expires_at
            assert renewed is not None and renewed > first_expiry, "b's lease was not renewed"
            other = Worker(1, step_lease_ttl=30, poll_interval=3600, queues=["default"])
            looked.append(on_another_thread(other.work_once))

        failed: list[BaseException] = []

        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            try:
                slow(sender, task_result, **kwargs)
            except BaseException as exc:  # sent robustly: kept for the test to raise
                failed.append(exc)

        task_finished.connect(receiver)
        try:
            assert worker.work_once() is True  # a, whose write claims b
        finally:
            task_finished.disconnect(receiver)
    if failed:
        raise failed[0]
    assert looked == [False], "another worker found b due"
    b.refresh()
    assert (b.status, dict(_ran)) == (TaskResultStatus.SUCCESSFUL, {"x": 1, "a": 1, "b": 1})
    assert list(WorkflowStepAttempt.objects.filter(step__run_id=b.id).values_list("attempt")) == [
        (1,)
    ]


def test_a_kept_task_is_built_anew_when_its_queue_leaves_tasks() -> None:
    wide = {**settings.TASKS}
    wide["default"] = {**wide["default"], "QUEUES": ["default", "tests-mail"]}
    with override_settings(TASKS=wide):
        result = t.add.using(queue_name="tests-mail").enqueue(1, 2)
        data = WorkflowRun.objects.get(pk=result.id).input
        assert _task_of(data).queue_name == "tests-mail"
    with pytest.raises(InvalidTask):
        _task_of(data)


def test_a_kept_task_follows_what_its_path_names_now(monkeypatch: pytest.MonkeyPatch) -> None:
    result = t.add.enqueue(1, 2)
    data = WorkflowRun.objects.get(pk=result.id).input
    assert _task_of(data).func is t.add.func
    assert _task_of(data) is _task_of(data)  # kept
    monkeypatch.setattr(t, "add", t.echo)
    assert _task_of(data).func is t.echo.func
