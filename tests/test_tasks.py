"""The Django Tasks backend (``django_leases.tasks.TaskBackend``) against Django's documented
contract of ``Task`` and ``TaskResult`` (Django 6's ``django.tasks``, or the ``django-tasks``
backport on Django 5.2), on every database: enqueueing, results, errors, retries, the
context's attempt, ``run_after`` on the database clock, priority, queues, signals, and the
attempt fence with a real worker process paused past its step lease."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip(
    "django_leases.tasks_api",
    reason="needs Django 6 or the django-tasks backport (pip install -e '.[dev]')",
    exc_type=ImportError,
)

import time_machine
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_leases import tasks_api
from django_leases.clock import DbNow, db_now_plus
from django_leases.exceptions import TaskArgumentsError
from django_leases.models import (
    AttemptStatus,
    RunStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.tasks import TASK_WORKFLOW, TaskBackend, worker_identity
from django_leases.tasks_api import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_leases.testing import drive
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import (
    lapse_step_lease,
    no_queue_limits,
    on_another_thread,
    process_stopped,
    start_process,
    tuned_sql,
    wait_until,
)
from tests.workapp import tasks as t

#: ``django.tasks`` on Django 6, ``django_tasks`` (the backport) on Django 5.2.
API = tasks_api.SOURCE


def db_clock() -> datetime:
    """The database clock's now (an aware ``datetime``), read through a scratch row."""
    run = WorkflowRun.objects.create(workflow="tests.clock")
    try:
        now = WorkflowRun.objects.filter(pk=run.pk).annotate(now=DbNow())
        return now.values_list("now", flat=True).get()
    finally:
        run.delete()


def step_of(result: Any) -> WorkflowStep:
    return WorkflowStep.objects.get(run_id=result.id)


# -- the backend --------------------------------------------------------------------------------


def test_the_backend_is_djangos_kind_and_claims_only_what_works() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, TaskBackend)
    assert isinstance(backend, tasks_api.BaseTaskBackend)
    assert API in {"django.tasks", "django_tasks"}
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True
    assert backend.queues == {"default"}
    assert (backend.retries, backend.retry_delay, backend.timeout) == (0, 0.0, None)
    assert (backend.retry_backoff, backend.retry_delay_max) == (1.0, None)
    assert (task_backends["retrying"].retries, task_backends["retrying"].retry_delay) == (2, 30.0)


def test_the_backoff_options_are_read() -> None:
    options = {"retries": 4, "retry_delay": 5, "retry_backoff": 3, "retry_delay_max": 60}
    backend = TaskBackend("backing-off", {"OPTIONS": options})
    assert (backend.retries, backend.retry_delay) == (4, 5.0)
    assert (backend.retry_backoff, backend.retry_delay_max) == (3.0, 60.0)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": True}, "retries"),
        ({"retries": 1001}, "retries"),
        ({"retry_delay": "soon"}, "retry_delay"),
        ({"retry_delay": 86401}, "retry_delay"),
        ({"timeout": 0}, "timeout"),
        ({"nope": 1}, "nope"),
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"retry_backoff": float("nan")}, "retry_backoff"),
        ({"retry_backoff": float("inf")}, "retry_backoff"),
        ({"retry_backoff": True}, "retry_backoff"),
        ({"retry_backoff": "2"}, "retry_backoff"),
        ({"retry_backoff": None}, "retry_backoff"),
        ({"retry_delay_max": -1}, "retry_delay_max"),
        ({"retry_delay_max": float("nan")}, "retry_delay_max"),
        ({"retry_delay_max": float("inf")}, "retry_delay_max"),
        ({"retry_delay_max": True}, "retry_delay_max"),
        ({"retry_delay_max": "60"}, "retry_delay_max"),
        ({"retry_delay_max": timedelta(days=2)}, "retry_delay_max"),
        ({"retry_delay_max": 86401}, "retry_delay_max"),
        ({"timeout": 1e12}, "timeout"),  # past the steps' limit: no enqueue could take it
        ({"timeout": timedelta(0)}, "timeout"),
    ],
)
def test_bad_options_are_refused_as_an_invalid_backend(options: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidTaskBackend, match=f"TASKS\\['bad'\\].*{named}"):
        TaskBackend("bad", {"OPTIONS": options})


def test_options_that_are_not_a_dict_are_refused_as_an_invalid_backend() -> None:
    with pytest.raises(InvalidTaskBackend, match="TASKS\\['bad'\\]\\['OPTIONS'\\] must be a dict"):
        TaskBackend("bad", {"OPTIONS": "abc"})


def test_every_duration_option_takes_a_timedelta_as_retry_delay_does() -> None:
    options = {
        "retry_delay": timedelta(seconds=5),
        "retry_delay_max": timedelta(minutes=1),
        "timeout": timedelta(seconds=90),
    }
    backend = TaskBackend("durations", {"OPTIONS": options})
    assert (backend.retry_delay, backend.retry_delay_max, backend.timeout) == (5.0, 60.0, 90.0)


def test_a_task_queue_that_the_workers_do_not_know_is_a_system_check_error() -> None:
    backend = TaskBackend("x", {"QUEUES": ["default", "mail"]})
    assert [m.id for m in backend.check()] == ["django_leases.E030"]
    with override_settings(DJANGO_LEASES={"QUEUES": {"mail": {"concurrency": 1}}}):
        assert backend.check() == []


def test_an_exception_whose_str_raises_is_still_recorded_as_itself() -> None:
    from django_leases.exceptions import TaskAttemptError
    from django_leases.validation import error_json

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    error = TaskAttemptError(Unprintable(), "Traceback…", "host:1:2")
    fields = error_json(error)
    assert fields["exception_class_path"].endswith("Unprintable")
    assert fields["worker_id"] == "host:1:2"
    assert "str() failed" in fields["message"]


def test_an_attempt_error_records_the_exception_path_traceback_and_worker() -> None:
    from django_leases.exceptions import TaskAttemptError
    from django_leases.validation import error_json

    error = TaskAttemptError(ValueError("k\x00"), "Traceback…\x00", "host:1:2")
    assert error_json(error) == {
        "type": "ValueError",
        "message": "k\ufffd",
        "exception_class_path": "builtins.ValueError",
        "traceback": "Traceback…\ufffd",
        "worker_id": "host:1:2",
    }


# -- enqueue and results ------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_stores_a_ready_result_and_a_worker_makes_it_successful() -> None:
    result = t.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.task is t.add
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.backend == "default"
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert not result.is_finished
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018  (not finished yet)
    run = WorkflowRun.objects.get(pk=result.id)
    assert run.workflow == TASK_WORKFLOW and run.status == RunStatus.RUNNING
    step = step_of(result)
    assert (step.queue, step.priority, step.retries) == ("default", 0, 0)

    stored = t.add.get_result(result.id)
    assert stored.id == result.id and stored.status == TaskResultStatus.READY
    assert stored.enqueued_at == result.enqueued_at

    drive()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.attempts == 1
    assert result.worker_ids == [worker_identity()]  # drive() ran it on this thread
    assert result.errors == []
    assert result.started_at is not None and result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert WorkflowRun.objects.get(pk=result.id).output == 5


@pytest.mark.django_db
def test_the_tasks_attributes_and_another_backend_alias() -> None:
    assert t.add.name == "add"
    assert t.add.module_path == "tests.workapp.tasks.add"
    assert t.add.get_backend() is task_backends["default"]
    assert (t.add.priority, t.add.queue_name, t.add.run_after, t.add.takes_context) == (
        0,
        "default",
        None,
        False,
    )
    assert t.add.call(1, 2) == 3  # called here, not enqueued
    elsewhere = t.add.using(backend="retrying")
    assert elsewhere.get_backend() is task_backends["retrying"]
    result = elsewhere.enqueue(5, 5)
    assert result.backend == "retrying"
    assert step_of(result).retries == 2  # that backend's OPTIONS
    stored = task_backends["default"].get_result(result.id)
    assert stored.backend == "retrying" and stored.task.backend == "retrying"
    drive()
    assert elsewhere.get_result(result.id).return_value == 10


@pytest.mark.django_db
def test_the_async_api_enqueues_and_reads_results() -> None:
    result = async_to_sync(t.echo.aenqueue)("a", n=[1, (2, 3)])
    assert result.kwargs == {"n": [1, [2, 3]]}  # Django's normalisation: tuples are lists
    drive()
    fetched = async_to_sync(t.echo.aget_result)(result.id)
    assert fetched.return_value == {"args": ["a"], "kwargs": {"n": [1, [2, 3]]}}
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert async_to_sync(task_backends["default"].aget_result)(result.id).id == result.id


@pytest.mark.django_db
def test_a_coroutine_task_runs_on_the_worker() -> None:
    result = t.async_double.enqueue(21)
    drive()
    assert t.async_double.get_result(result.id).return_value == 42


@pytest.mark.django_db
def test_an_unknown_or_malformed_result_id_does_not_exist() -> None:
    backend = task_backends["default"]
    for missing in (str(uuid.uuid4()), "not-a-uuid", ""):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(missing)
    # A run of another workflow is no task result either.
    other = WorkflowRun.objects.create(workflow="tests.sub.two-steps")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(other.id))


@pytest.mark.django_db
def test_get_result_through_another_task_is_a_mismatch() -> None:
    result = t.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        t.echo.get_result(result.id)


@pytest.mark.django_db
def test_a_task_that_raises_fails_with_its_exception_path_and_traceback() -> None:
    result = t.explode.enqueue("boom")
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback
    assert "in explode" in error.traceback
    assert result.attempts == 1 and result.worker_ids == [worker_identity()]
    assert WorkflowRun.objects.get(pk=result.id).status == RunStatus.FAILED


@pytest.mark.django_db
def test_a_return_value_that_is_not_json_fails_the_task() -> None:
    result = t.unjsonable.enqueue()
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_leases.exceptions.TaskArgumentsError"


@pytest.mark.django_db
def test_a_task_gone_from_the_code_fails_with_its_import_error() -> None:
    result = t.add.enqueue(1, 1)
    step = step_of(result)
    WorkflowStep.objects.filter(pk=step.pk).update(
        data={**step.data, "task": "tests.workapp.tasks.gone"}
    )
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.ImportError"
    assert '"gone"' in result.errors[0].traceback


@pytest.mark.django_db
def test_a_worker_without_the_backend_suspends_the_task_until_resumed() -> None:
    result = t.add.enqueue(2, 2)
    with mock.patch("django_leases.workflows.engine.get_step_function", return_value=None):
        drive()
    assert WorkflowRun.objects.get(pk=result.id).status == RunStatus.SUSPENDED
    result.refresh()
    assert result.status == TaskResultStatus.READY  # resumable: not finished
    WorkflowRun.objects.resume(result.id)
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 4


@pytest.mark.django_db
def test_a_cancelled_task_run_is_failed() -> None:
    result = t.add.enqueue(1, 2)
    WorkflowRun.objects.cancel(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1


# -- retries and the context --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_backoff_option_makes_each_retry_wait_longer() -> None:
    """``OPTIONS = {"retries": 2, "retry_delay": 5, "retry_backoff": 3}``: the first retry is
    due 5 s after the first failure, the second 15 s after the second, on the database
    clock (read from the failed attempts' ends, written with the retries' due times)."""
    backend = {
        "BACKEND": "django_leases.tasks.TaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"retries": 2, "retry_delay": 5, "retry_backoff": 3},
    }
    with override_settings(TASKS={"default": backend}):
        result = t.flaky.using(backend="default").enqueue(4)  # attempts 1-3 fail
        step = step_of(result)
        assert (step.retries, step.retry_delay, step.retry_backoff) == (2, 5.0, 3.0)
        for attempt, delay in ((1, 5), (2, 15)):
            drive(skip_sleeps=False)  # the attempt runs and fails; its retry waits
            step = step_of(result)
            failed = WorkflowStepAttempt.objects.get(step=step, attempt=attempt)
            assert (step.status, step.attempt, failed.status) == ("failed", attempt, "failed")
            assert step.available_at is not None and failed.finished_at is not None
            waits = (step.available_at - failed.finished_at).total_seconds()
            assert abs(waits - delay) < 1, f"retry after attempt {attempt} due {waits} s later"
            WorkflowStep.objects.filter(pk=step.pk).update(available_at=DbNow())
        drive(skip_sleeps=False)  # attempt 3, the last, fails too
        result.refresh()
        assert result.status == TaskResultStatus.FAILED and result.attempts == 3
        assert step_of(result).available_at is None


@pytest.mark.django_db
def test_retries_wait_their_delay_and_the_context_attempt_is_the_fencing_attempt() -> None:
    result = t.flaky.enqueue(3)
    drive(skip_sleeps=False)  # attempt 1 fails; attempt 2 waits out the 30 s retry delay
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1 and len(result.errors) == 1
    step = step_of(result)
    assert step.attempt == 1 and step.available_at is not None
    assert step.available_at >= db_clock() + timedelta(seconds=25)

    drive()  # the retry delays are jumped forward on the database clock
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    seen = result.return_value
    assert seen["attempt"] == 3 == step_of(result).attempt
    assert seen["id"] == result.id
    assert seen["status"] == TaskResultStatus.RUNNING
    assert seen["worker_ids"] == [worker_identity()] * 3  # the live result: one per attempt
    assert result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 1 fails" in result.errors[0].traceback
    assert "attempt 2 fails" in result.errors[1].traceback
    attempts = WorkflowStepAttempt.objects.filter(step__run_id=result.id).order_by("attempt")
    assert [a.status for a in attempts] == [AttemptStatus.FAILED] * 2 + [AttemptStatus.SUCCEEDED]
    assert result.last_attempted_at == attempts[2].started_at
    assert result.started_at == attempts[0].started_at


@pytest.mark.django_db
def test_a_task_out_of_retries_fails_with_every_attempts_error() -> None:
    result = t.flaky.enqueue(10)
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3 and len(result.errors) == 3


@pytest.mark.django_db
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned-sql", "portable-orm"])
def test_tasks_run_the_same_on_both_paths_of_the_sql_switch(tuned: bool) -> None:
    with tuned_sql(tuned):
        ok = t.add.enqueue(20, 22)
        retried = t.flaky.enqueue(2)
        failed = t.explode.enqueue("both ways")
        drive()
    assert t.add.get_result(ok.id).return_value == 42
    assert t.flaky.get_result(retried.id).return_value["attempt"] == 2
    assert t.explode.get_result(failed.id).status == TaskResultStatus.FAILED


#: The columns of a task's run and step that enqueue writes (not ids or write times).
RUN_COLUMNS = (
    "workflow", "status", "input", "output", "error", "pass_due_at", "pass_requests",
    "branches_left", "key", "parent_id", "finished_at",
)  # fmt: skip
STEP_COLUMNS = (
    "step_name", "function_name", "data", "status", "result", "error", "attempt", "retries",
    "retry_delay", "retry_backoff", "retry_delay_max", "timeout", "deadline_at",
    "lease_expires_at", "available_at", "queue", "priority",
)  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deferred", [False, True], ids=["now", "run_after"])
def test_enqueue_writes_the_same_rows_on_both_paths_of_the_sql_switch(deferred: bool) -> None:
    when = db_clock() + timedelta(minutes=5)
    written = []
    for tuned in (True, False):
        task = t.flaky.using(priority=7, run_after=when if deferred else None)
        with tuned_sql(tuned), CaptureQueriesContext(connection) as enqueued:
            result = task.enqueue(1)
        if tuned and connection.vendor == "postgresql":
            assert len(enqueued.captured_queries) == 1, enqueued.captured_queries
        run = WorkflowRun.objects.get(pk=result.id)
        step = WorkflowStep.objects.get(run=run)
        assert result.enqueued_at == run.created_at
        if not deferred:  # due at once: when it was written, on the database clock
            assert step.available_at is not None
            assert run.created_at - timedelta(seconds=1) <= step.available_at <= db_clock()
            step.available_at = None
        written.append(
            (
                {name: getattr(run, name) for name in RUN_COLUMNS},
                {name: getattr(step, name) for name in STEP_COLUMNS},
            )
        )
    assert written[0] == written[1]
    assert written[0][1]["retries"] == 2 and written[0][1]["priority"] == 7


@pytest.mark.django_db(transaction=True)
def test_a_thread_on_a_backlog_of_tasks_still_takes_a_new_runs_pass() -> None:
    tasks = [t.add.enqueue(n, 1) for n in range(3)]
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    run_id = start_workflow("tests.sub.two-steps", {"n": 1})
    # Steps first (once per poll interval): a task. After it, passes first (once per poll
    # interval): the write of its result picks the new run's pass, driven here to its end.
    assert worker.work_once() is True
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    statuses = [t.add.get_result(task.id).status for task in tasks]
    assert statuses == [TaskResultStatus.SUCCESSFUL, *[TaskResultStatus.READY] * 2]
    # Steps first again after a task (the passes' turn has passed): the others, each
    # claimed by the write of the one before.
    assert worker.work_once() is True
    statuses = [t.add.get_result(task.id).status for task in tasks]
    assert statuses == [TaskResultStatus.SUCCESSFUL] * 3
    # A new run waits for the passes' next turn (the poll interval): a look for steps
    # first, then for passes, finds it.
    later = start_workflow("tests.sub.two-steps", {"n": 2})
    assert worker.work_once() is True
    assert WorkflowRun.objects.get(pk=later).status == RunStatus.COMPLETED


def assert_same_result(found: Any, stored: Any) -> None:
    """``found`` (a result a signal carried) says what ``stored`` (read from the tables) says."""
    for name in (
        "id",
        "status",
        "enqueued_at",
        "started_at",
        "finished_at",
        "last_attempted_at",
        "args",
        "kwargs",
        "backend",
        "errors",
        "worker_ids",
    ):
        assert getattr(found, name) == getattr(stored, name), name


@pytest.mark.django_db
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned-sql", "portable-orm"])
def test_the_started_result_is_the_one_the_tables_hold(tuned: bool) -> None:
    """``task_started``'s live result is what the tables say at that moment: built from what
    the claim read back where it can (PostgreSQL's claim returns the times), else read."""
    from django_leases import tasks as backend_module

    seen: list[tuple[Any, Any]] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        run = WorkflowRun.objects.get(pk=task_result.id)
        stored = backend_module._result_of(
            run, task=task_result.task, running=(1, task_result.worker_ids[-1])
        )
        seen.append((task_result, stored))

    task_started.connect(receive)
    try:
        with no_queue_limits(), tuned_sql(tuned):
            t.add.enqueue(1, 2)
            drive()
    finally:
        task_started.disconnect(receive)
    [(live, stored)] = seen
    assert_same_result(live, stored)
    assert live.started_at is not None and live.enqueued_at <= live.started_at


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tuned", [True, False], ids=["tuned-sql", "portable-orm"])
def test_the_finished_result_is_the_one_the_tables_hold(tuned: bool) -> None:
    """``task_finished``'s result is what the tables say once the run ended: for a first
    attempt that completed the run on the worker's thread, built from its live result and
    the attempt's end (PostgreSQL), else read."""
    from django_leases import tasks as backend_module

    seen: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result)

    task_finished.connect(receive)
    try:
        with no_queue_limits(), tuned_sql(tuned):
            enqueued = t.add.enqueue(2, 3)
            drive()
    finally:
        task_finished.disconnect(receive)
    [finished] = seen
    stored = backend_module._result_of(WorkflowRun.objects.get(pk=enqueued.id))
    assert_same_result(finished, stored)
    assert finished.return_value == stored.return_value
    assert finished.status == TaskResultStatus.SUCCESSFUL and finished.return_value == 5


# -- run_after, priority, queues ----------------------------------------------------------------


@pytest.mark.django_db
def test_run_after_is_the_steps_due_time_judged_on_the_database_clock() -> None:
    later = db_clock() + timedelta(hours=1)
    result = t.add.using(run_after=later).enqueue(1, 2)
    assert result.task.run_after == later
    assert step_of(result).available_at == later
    drive(skip_sleeps=False)
    # The process clock two hours ahead changes nothing: the database's decides.
    with time_machine.travel(datetime.now().astimezone() + timedelta(hours=2), tick=True):
        drive(skip_sleeps=False)
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.attempts == 0
    stored = t.add.get_result(result.id)
    assert stored.task.run_after == later

    due = t.add.using(run_after=db_clock() - timedelta(seconds=1)).enqueue(3, 4)
    drive(skip_sleeps=False)
    assert t.add.get_result(due.id).return_value == 7
    assert t.add.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.django_db
def test_priority_orders_the_claim_higher_first() -> None:
    low = t.add.using(priority=-100).enqueue(1, 1)
    middle = t.add.enqueue(2, 2)
    high = t.add.using(priority=100).enqueue(3, 3)
    assert [step_of(r).priority for r in (low, middle, high)] == [-100, 0, 100]
    order = []
    for _ in range(3):
        claim = WorkflowStep.objects.claim_due(60.0)
        assert claim is not None
        order.append(str(claim.run_id))
    assert order == [high.id, middle.id, low.id]
    assert t.add.get_result(high.id).task.priority == 100


@pytest.mark.django_db
def test_the_queue_name_is_the_steps_queue_and_an_unknown_queue_is_refused() -> None:
    tasks_setting = {"default": {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": []}}
    tasks_setting["default"]["QUEUES"] = ["default", "mail"]
    with override_settings(TASKS=tasks_setting, DJANGO_LEASES={"QUEUES": {"mail": {}}}):
        result = t.add.using(queue_name="mail").enqueue(1, 1)
        assert step_of(result).queue == "mail"
        assert t.add.get_result(result.id).task.queue_name == "mail"
    before = WorkflowRun.objects.count()
    with pytest.raises(InvalidTask):
        t.add.using(queue_name="mail").enqueue(1, 1)
    assert WorkflowRun.objects.count() == before


@pytest.mark.django_db
def test_tasks_on_a_rate_limited_queue_all_finish_under_drive() -> None:
    # drive() jumps the queue's rate window (two starts an hour) as it jumps retry delays.
    backend = {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": ["default", "hourly"]}
    queues = {"QUEUES": {"hourly": {"rate": "2/h"}}}
    with override_settings(TASKS={"default": backend}, DJANGO_LEASES=queues):
        results = [t.add.using(queue_name="hourly").enqueue(n, n) for n in range(5)]
        drive(skip_sleeps=False)
        assert [t.add.get_result(r.id).status for r in results].count("SUCCESSFUL") == 2
        drive()
        assert [t.add.get_result(r.id).return_value for r in results] == [0, 2, 4, 6, 8]


# -- refusals: nothing stored -------------------------------------------------------------------


def nested_task_factory() -> Any:
    def inner() -> None:
        return None

    return inner


def needs_context_but_has_none(x: int) -> int:
    return x


@pytest.mark.django_db
def test_invalid_tasks_are_refused() -> None:
    with pytest.raises(InvalidTask):
        t.add.using(priority=101)
    with pytest.raises(InvalidTask):
        t.add.using(priority=-101)
    with pytest.raises(InvalidTask):
        task(nested_task_factory())
    with pytest.raises(InvalidTask):
        task(takes_context=True)(needs_context_but_has_none)
    with pytest.raises(InvalidTask):
        t.add.using(run_after=datetime(2030, 1, 1))  # naive, with USE_TZ
    with pytest.raises(InvalidTask):
        t.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="priority must be an int"):
        t.add.using(priority=True)
    with pytest.raises(InvalidTask, match="priority must be an int"):
        t.add.using(priority=1.0)  # type: ignore[arg-type]
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_a_backend_open_to_any_queue_still_takes_only_configured_queues() -> None:
    # Django lets QUEUES = [] take any name; a queue the engine does not configure would be
    # one whose limits no worker knows, and that a --queue worker never takes.
    tasks_setting = {"open": {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks_setting):
        for name in ("typo", " default", "default\n", "x" * 300, ["default"]):
            typo = t.add.using(backend="open", queue_name=name)  # type: ignore[arg-type]
            with pytest.raises(InvalidTask, match="not configured in DJANGO_LEASES"):
                typo.enqueue(1, 2)
        t.add.using(backend="open", queue_name="default").enqueue(1, 2)
        with override_settings(DJANGO_LEASES={"QUEUES": {"mail": {"concurrency": 1}}}):
            t.add.using(backend="open", queue_name="mail").enqueue(1, 2)
    assert sorted(WorkflowStep.objects.values_list("queue", flat=True)) == ["default", "mail"]


@pytest.mark.django_db
def test_a_queue_dropped_from_the_settings_after_enqueue_still_runs_its_tasks() -> None:
    # The queue check is the enqueue's: a task built (at import), run or read back later is
    # not refused for a queue the settings stopped configuring (E030 reports that).
    tasks_setting = {"open": {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks_setting):
        with override_settings(DJANGO_LEASES={"QUEUES": {"mail": {}}}):
            result = t.add.using(backend="open", queue_name="mail").enqueue(1, 2)
        drive()
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    listed = {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": ["default", "mail"]}
    with override_settings(TASKS={"listed": listed}):
        assert t.add.using(backend="listed", queue_name="mail").queue_name == "mail"


@pytest.mark.django_db
@pytest.mark.parametrize("active", [None, "Asia/Tokyo", "America/New_York"])
def test_a_naive_run_after_without_time_zones_is_read_in_time_zone(active: str | None) -> None:
    # Due an hour from now on the database clock, whatever zone a request activated.
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        later = datetime.now().replace(microsecond=0) + timedelta(hours=1)
        if active is None:
            result = t.add.using(run_after=later).enqueue(1, 2)
        else:
            with timezone.override(active):
                result = t.add.using(run_after=later).enqueue(1, 2)
        step = WorkflowStep.objects.filter(pk=step_of(result).pk)
        assert step.filter(
            available_at__gt=db_now_plus(3600 - 120), available_at__lt=db_now_plus(3600 + 120)
        ).exists()
        drive()
        result.refresh()
        assert result.status == TaskResultStatus.READY  # not due for an hour


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.django_db
def test_arguments_nested_beyond_recursion_are_refused_with_nothing_stored() -> None:
    with pytest.raises(TaskArgumentsError, match="nested too deeply"):
        t.echo.enqueue(_nested(5000))
    assert WorkflowRun.objects.count() == 0 and WorkflowStep.objects.count() == 0


def _json_depth() -> int:
    """The deepest JSON the suite's database stores: 100 levels (the package's limit), 31 on
    MariaDB, whose ``CHECK (JSON_VALID(...))`` refuses 32."""
    return 31 if connection.vendor == "mysql" and connection.mysql_is_mariadb else 100


@pytest.mark.django_db
@pytest.mark.parametrize("levels", [29, 30, 31, 32, 97, 98, 99, 100, 101])
@pytest.mark.parametrize("where", ["args", "kwargs"])
def test_arguments_nested_to_the_limit_are_stored_or_refused_as_task_arguments(
    levels: int, where: str
) -> None:
    """The arguments are stored one level inside the step's data: a value nesting too deep
    there is a ``TaskArgumentsError`` (nothing stored), never the ``ValueError`` of the
    step's data nor the database's ``IntegrityError``."""
    limit = _json_depth() - 1
    value = _nested(levels - 1)  # ``levels`` lists deep; in args it is one level more
    call = (lambda: t.echo.enqueue(value)) if where == "args" else lambda: t.echo.enqueue(x=value)
    if levels + 1 > limit:  # the args list (or kwargs dict) and the value
        with pytest.raises(TaskArgumentsError, match=f"nests deeper than {limit} levels"):
            call()
        assert WorkflowRun.objects.count() == 0 and WorkflowStep.objects.count() == 0
        return
    result = call()
    assert t.echo.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.django_db
@pytest.mark.parametrize("levels", [29, 30, 31, 32, 98, 99, 100, 101])
def test_a_return_value_nested_past_the_limit_fails_as_task_arguments(levels: int) -> None:
    limit = _json_depth() - 1  # stored under "return_value" of the step's result
    result = t.nested.enqueue(levels)
    drive()
    result.refresh()
    if levels <= limit:
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert result.return_value == _nested(levels - 1)
        return
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "django_leases.exceptions.TaskArgumentsError"
    assert f"nests deeper than {limit} levels" in error.traceback


@pytest.mark.django_db
@pytest.mark.parametrize("value", [1e20, -0.0, {"b": 1e16, "a": [2.5e300]}])
def test_numbers_read_back_as_written_or_are_refused(value: Any) -> None:
    # PostgreSQL's jsonb gives 1e+20 back as the integer 100000000000000000000 and -0.0 as
    # 0.0: refused there, with nothing stored; elsewhere the JSON text round-trips.
    if connection.vendor == "postgresql":
        with pytest.raises(TaskArgumentsError, match="does not read back as written"):
            t.echo.enqueue(value)
        assert WorkflowRun.objects.count() == 0 and WorkflowStep.objects.count() == 0
        return
    result = t.echo.enqueue(value)
    drive()
    got = t.echo.get_result(result.id)
    assert got.status == TaskResultStatus.SUCCESSFUL
    assert repr(got.args) == repr([value]) and repr(got.return_value["args"]) == repr([value])


@pytest.mark.django_db
def test_a_return_value_that_would_not_read_back_fails_where_it_would_not() -> None:
    result = t.huge_float.enqueue()
    drive()
    result.refresh()
    if connection.vendor == "postgresql":
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class_path == "django_leases.exceptions.TaskArgumentsError"
        assert "does not read back as written" in error.traceback
    else:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert repr(result.return_value) == "1e+20"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((object(),), {}),
        ((), {"when": datetime(2030, 1, 1)}),
        (({1: "a"},), {}),  # an int key reads back as "1"
        ((float("nan"),), {}),
        (({1, 2},), {}),
    ],
)
def test_arguments_that_are_not_json_are_refused_with_nothing_stored(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(TaskArgumentsError) as raised:
        t.echo.enqueue(*args, **kwargs)
    assert isinstance(raised.value, TypeError)
    assert "tests.workapp.tasks.echo" in str(raised.value)
    assert WorkflowRun.objects.count() == 0 and WorkflowStep.objects.count() == 0


# -- transactions and signals -------------------------------------------------------------------


@pytest.fixture
def task_signals() -> Iterator[list[tuple[str, str, str]]]:
    seen: list[tuple[str, str, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            assert sender is TaskBackend
            seen.append((name, task_result.id, str(task_result.status)))

        return receive

    receivers = {
        signal: receiver(name)
        for signal, name in (
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        )
    }
    for signal_, receive in receivers.items():
        signal_.connect(receive)
    yield seen
    for signal_, receive in receivers.items():
        signal_.disconnect(receive)


@pytest.mark.django_db(transaction=True)
def test_each_signal_fires_once_with_the_result(task_signals: list[tuple[str, str, str]]) -> None:
    ok = t.add.enqueue(1, 2)
    bad = t.explode.enqueue("no")
    drive()
    assert sorted(task_signals) == sorted(
        [
            ("enqueued", ok.id, "READY"),
            ("started", ok.id, "RUNNING"),
            ("finished", ok.id, "SUCCESSFUL"),
            ("enqueued", bad.id, "READY"),
            ("started", bad.id, "RUNNING"),
            ("finished", bad.id, "FAILED"),
        ]
    )
    assert [s[0] for s in task_signals if s[1] == ok.id] == ["enqueued", "started", "finished"]


@pytest.mark.django_db(transaction=True)
def test_a_retried_task_starts_once_per_attempt_and_finishes_once(
    task_signals: list[tuple[str, str, str]],
) -> None:
    result = t.flaky.enqueue(2)
    drive()
    assert [s[0] for s in task_signals] == ["enqueued", "started", "started", "finished"]
    assert task_signals[-1] == ("finished", result.id, "SUCCESSFUL")


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_transaction_is_seen_by_workers_only_once_it_commits(
    task_signals: list[tuple[str, str, str]],
) -> None:
    def runs_seen_elsewhere() -> int:
        return int(on_another_thread(lambda: WorkflowRun.objects.count()))

    with transaction.atomic():
        kept = t.add.enqueue(1, 1)
        assert runs_seen_elsewhere() == 0
        assert task_signals == []  # task_enqueued waits for the commit
    assert runs_seen_elsewhere() == 1
    assert task_signals == [("enqueued", kept.id, "READY")]

    with pytest.raises(RuntimeError), transaction.atomic():
        t.add.enqueue(2, 2)
        raise RuntimeError("roll back")
    assert WorkflowRun.objects.count() == 1
    assert len(task_signals) == 1


# -- the fence, with a real worker --------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_worker_process_runs_tasks_to_their_results(subprocess_env: dict[str, str]) -> None:
    results = [t.add.enqueue(n, n) for n in range(5)] + [t.explode.enqueue("worker")]
    results.append(t.async_double.using(priority=5).enqueue(4))
    worker = start_process(
        [sys.executable, "manage.py", "run_workflow_worker", "--concurrency", "2"],
        env=subprocess_env,
    )

    def all_finished() -> bool:
        for result in results:
            result.refresh()
        # A task's result is FAILED once its step failed for good; its run fails in the
        # pass after that write, which a worker stopping in between leaves to the next.
        ended = WorkflowRun.objects.filter(pk__in=[r.id for r in results]).exclude(
            status=RunStatus.RUNNING
        )
        return all(result.is_finished for result in results) and ended.count() == len(results)

    wait_until(all_finished, timeout=120, what="every task and its run finished on the worker")
    os.kill(worker.pid, signal.SIGTERM)
    _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    assert [r.return_value for r in results[:5]] == [0, 2, 4, 6, 8]
    assert results[6].return_value == 8
    assert results[5].status == TaskResultStatus.FAILED
    assert results[5].errors[0].exception_class_path == "builtins.ValueError"
    for result in results:
        assert result.attempts == 1
        _, pid, _ = result.worker_ids[0].split(":")
        assert int(pid) == worker.pid
    runs = WorkflowRun.objects.filter(pk__in=[r.id for r in results])
    assert sorted(runs.values_list("status", flat=True)) == ["completed"] * 6 + ["failed"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see the worker stopped")
@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="a stopped SQLite worker may hold the database's one write lock (its heartbeat "
    "thread is stopped too): PostgreSQL or MariaDB, as for the chaos tests",
)
@pytest.mark.timeout(180)
def test_a_superseded_attempts_return_value_never_lands(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Attempt 1 runs on a worker process, which is stopped (SIGSTOP) inside the task; its
    step lease is lapsed on the database clock; attempt 2 runs here and lands; the worker is
    resumed (SIGCONT), its attempt returns, and the fence refuses that value."""
    result = t.hold_first_attempt.enqueue(str(tmp_path))
    worker = start_process(
        [sys.executable, "manage.py", "run_workflow_worker", "--concurrency", "1"],
        env=subprocess_env,
    )
    started = tmp_path / "started"
    wait_until(started.exists, timeout=120, what="attempt 1 started on the worker")
    assert int(started.read_text()) == worker.pid
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: process_stopped(worker.pid), what="the worker stopped")
        lapse_step_lease(run_id=result.id)
        drive(result.id)  # attempt 2, on this process
        done = t.hold_first_attempt.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL
        assert done.return_value == {"attempt": 2}
    finally:
        (tmp_path / "go").touch()  # attempt 1 may return now
        os.kill(worker.pid, signal.SIGCONT)
    os.kill(worker.pid, signal.SIGTERM)  # finish the superseded attempt in flight, then exit
    _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    assert "attempt 1 was superseded" in errors

    result.refresh()
    assert result.return_value == {"attempt": 2}
    assert result.attempts == 2
    assert result.worker_ids[1] == worker_identity()
    assert result.worker_ids[0] == ""  # attempt 1 never reported back: it was superseded
    step = step_of(result)
    assert step.attempt == 2 and step.result["return_value"] == {"attempt": 2}
    history = WorkflowStepAttempt.objects.filter(step=step).order_by("attempt")
    assert [(a.attempt, a.status) for a in history] == [
        (1, AttemptStatus.RUNNING),  # a superseded attempt keeps running
        (2, AttemptStatus.SUCCEEDED),
    ]
    assert history[0].result is None
    assert WorkflowRun.objects.get(pk=result.id).output == {"attempt": 2}


@pytest.mark.django_db
def test_the_commands_check_passes_with_the_backend_configured() -> None:
    call_command("check", "--fail-level", "ERROR", verbosity=0)


# -- the admin: tasks appear as runs ------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_list_filters_tasks_by_kind_queue_and_task_path(admin_client: Any) -> None:
    tasks_setting = {
        "default": {"BACKEND": "django_leases.tasks.TaskBackend", "QUEUES": ["default", "mail"]}
    }
    with override_settings(TASKS=tasks_setting, DJANGO_LEASES={"QUEUES": {"mail": {}}}):
        added = t.add.enqueue(1, 1)
        mailed = t.echo.using(queue_name="mail").enqueue("hi")
    flow = WorkflowRun.objects.start("tests.sub.two-steps", {})
    changelist = reverse("admin:django_leases_workflowrun_changelist")

    def listed(**query: str) -> set[str]:
        page = admin_client.get(changelist, query)
        assert page.status_code == 200
        text = page.content.decode()
        return {str(r) for r in (added.id, mailed.id, flow.id) if str(r) in text}

    assert listed() == {added.id, mailed.id, str(flow.id)}
    assert listed(kind="task") == {added.id, mailed.id}
    assert listed(kind="workflow") == {str(flow.id)}
    assert listed(queue="mail") == {mailed.id}
    assert listed(task="tests.workapp.tasks.add") == {added.id}
    page = admin_client.get(changelist).content.decode()
    assert "tests.workapp.tasks.echo" in page  # offered as a task filter choice


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_finishes_once_and_other_runs_not_at_all(
    task_signals: list[tuple[str, str, str]],
) -> None:
    # A cancel happens anywhere (an operator's process): it is looked up. A workflow run that
    # is not a task's ends without a task_finished (and without a query to tell).
    result = t.add.enqueue(1, 2)
    WorkflowRun.objects.cancel(result.id)
    plain = WorkflowRun.objects.start("tests.tasks.not-a-task", {})
    WorkflowRun.objects.complete(plain.id, {"done": True})
    assert task_signals == [("enqueued", result.id, "READY"), ("finished", result.id, "FAILED")]


# -- the commands: tasks listed with their paths ------------------------------------------------


@pytest.mark.django_db
def test_workflow_runs_lists_and_shows_a_task_run_with_its_task_path() -> None:
    import io
    import json

    added = t.add.enqueue(1, 1)
    flow = WorkflowRun.objects.start("tests.sub.two-steps", {"task": "not a task run"})

    def runs(*args: str) -> str:
        out = io.StringIO()
        call_command("workflow_runs", *args, stdout=out)
        return out.getvalue()

    table = {line.split()[0]: line.split()[1] for line in runs("list").splitlines()[1:]}
    assert table[added.id] == f"{TASK_WORKFLOW}:tests.workapp.tasks.add"
    assert table[str(flow.id)] == "tests.sub.two-steps"  # its input's "task" is not a path
    listed = {row["id"]: row for row in json.loads(runs("list", "--format", "json"))}
    assert listed[added.id]["workflow"] == TASK_WORKFLOW
    assert listed[added.id]["task"] == "tests.workapp.tasks.add"
    assert listed[str(flow.id)]["task"] is None
    first = runs("show", added.id).splitlines()[0]
    assert first.startswith(f"Run {added.id}  {TASK_WORKFLOW}:tests.workapp.tasks.add  ")
