"""The Django Tasks backend (``django_leases.tasks.TaskBackend``, issue 13 item 3) against
Django's documented task contract: ``Task.enqueue`` / ``aenqueue``, ``get_result`` /
``aget_result``, ``TaskResult`` (status, return value, errors, attempts, worker ids, times,
``refresh``), ``priority``, ``queue_name``, ``takes_context`` (the context's attempt is the
fencing attempt), the three signals, and the ``InvalidTask`` refusals. Tasks run on the
workflow worker as one-step runs.

Runs where a Tasks API is installed: Django 6's ``django.tasks``, or the ``django-tasks``
backport on Django 5.2 (``pip install django-leases[tasks]``)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("no Django Tasks API installed", allow_module_level=True)

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.tasks import (
    TASK_WORKFLOW,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from django_leases.workflows.worker import Worker
from tests.helpers import drain, lapse_step_lease


def _api() -> ModuleType:
    try:
        return importlib.import_module("django.tasks")
    except ImportError:
        return importlib.import_module("django_tasks")


task = _api().task
pytestmark = pytest.mark.django_db(transaction=True)


@task(backend="leases")
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@task(backend="leases", queue_name="tests-mail", priority=5)
def receipt(to: str) -> dict[str, str]:
    """A mail-queue task."""
    return {"sent": to}


@task(backend="leases", takes_context=True)
def flaky(context: Any, n: int) -> dict[str, Any]:
    """Fails on its first attempt, then returns its context's attempt and result id."""
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"attempt": context.attempt, "id": context.task_result.id, "n": n}


@task(backend="leases")
def boom() -> None:
    """Always raises."""
    raise KeyError("boom")


def _work() -> None:
    drain(Worker(step_lease_ttl=60.0))


def test_an_enqueued_task_runs_on_the_worker_and_its_result_is_read_back() -> None:
    result = add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "leases")
    assert result.enqueued_at is not None and result.started_at is None
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018  (not finished)
    _work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert ":" in result.worker_ids[0], "host:pid"
    assert result.started_at is not None and result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    again = add.get_result(result.id)
    assert (again.status, again.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_priority_and_queue_name_become_the_steps() -> None:
    result = receipt.enqueue("a@example.com")
    drain(Worker(step_lease_ttl=60.0, queues=["default"]))  # the pass only: not its queue
    step = WorkflowStep.objects.get(run_id=result.id)
    assert (step.queue, step.priority, step.status) == ("tests-mail", 5, "pending")
    drain(Worker(step_lease_ttl=60.0, queues=["tests-mail"]))
    result.refresh()
    assert result.return_value == {"sent": "a@example.com"}
    urgent = add.using(priority=9).enqueue(1, 1)
    drain(Worker(step_lease_ttl=60.0))
    assert WorkflowStep.objects.get(run_id=urgent.id).priority == 9


def test_the_context_attempt_is_the_fencing_attempt_and_each_failure_is_an_error() -> None:
    result = flaky.enqueue(n=7)
    _work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2, "id": result.id, "n": 7}
    assert result.attempts == 2
    step = WorkflowStep.objects.get(run_id=result.id)
    assert step.attempt == 2
    [error] = result.errors
    assert error.exception_class_path == "builtins.RuntimeError"
    assert "first attempt fails" in error.traceback
    assert error.exception_class is RuntimeError


def test_a_task_that_fails_on_every_attempt_is_failed_with_its_errors() -> None:
    result = boom.enqueue()
    _work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018
    assert [e.exception_class_path for e in result.errors] == ["builtins.KeyError"] * 2


def test_the_signals_are_sent_enqueued_started_finished() -> None:
    seen: list[tuple[str, str, str]] = []

    def record(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.id, str(task_result.status)))

        return receiver

    receivers = {
        signal: record(name)
        for signal, name in (
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        )
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        result = add.enqueue(1, 2)
        _work()
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert seen == [
        ("enqueued", result.id, TaskResultStatus.READY),
        ("started", result.id, TaskResultStatus.RUNNING),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL),
    ]


def test_invalid_tasks_are_refused() -> None:
    with pytest.raises(InvalidTaskError):
        add.using(priority=101)
    with pytest.raises(InvalidTaskError):
        add.using(run_after=timezone.now() + timedelta(seconds=5))  # supports_defer is False
    with pytest.raises(InvalidTaskError):
        add.using(queue_name="tests-nowhere")

    def local(a: int) -> int:
        return a

    with pytest.raises(InvalidTaskError):
        task(backend="leases")(local)

    async def coroutine() -> None:
        return None

    coroutine.__qualname__ = "coroutine"
    with pytest.raises(InvalidTaskError):
        task(backend="leases")(coroutine)


def test_arguments_that_are_not_json_are_refused_storing_nothing() -> None:
    with pytest.raises((ValueError, TypeError)):
        add.enqueue(object(), 1)
    with pytest.raises((ValueError, TypeError)):
        add.enqueue(1, float("nan"))
    assert not WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).exists()


def test_an_enqueue_rolled_back_leaves_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).exists()


def test_get_result_of_an_unknown_id_or_another_task() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("not-a-run")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("00000000-0000-0000-0000-000000000000")
    result = add.enqueue(1, 1)
    with pytest.raises(Exception, match="Task does not match"):
        boom.get_result(result.id)


def test_aenqueue_and_aget_result() -> None:
    async def go() -> Any:
        try:
            result = await add.aenqueue(4, 4)
            return await add.aget_result(result.id)
        finally:  # the ORM ran on asgiref's thread-sensitive thread: close its connection
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    found = asyncio.run(go())
    assert found.status == TaskResultStatus.READY
    _work()
    found.refresh()
    assert found.return_value == 8


def test_a_task_whose_worker_died_runs_again_as_the_next_attempt() -> None:
    result = add.enqueue(3, 4)
    drain(Worker(step_lease_ttl=60.0, queues=["tests-mail"]))  # its pass only
    lost = WorkflowStep.objects.claim_due(60.0)  # a worker that then dies
    assert lost is not None and lost.attempt == 1
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    lapse_step_lease(run_id=result.id)
    _work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 7
    assert result.attempts == 2
    assert result.worker_ids[0] == "attempt 1" and ":" in result.worker_ids[1]
    assert result.errors == [], "a superseded attempt is no error of the task"
