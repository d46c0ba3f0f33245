"""On MariaDB / MySQL a statement longer than the server's ``max_allowed_packet`` is refused
and the server drops the connection, and the caller's transaction with it. A JSON value that
would make one (a task's arguments, a step's or a task's result) is refused before it is
sent, as a value that is not storable JSON is: ``TaskArgumentsError`` at ``enqueue`` with
the caller's transaction intact, the attempt's own failure at the worker."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)

import threading

from django.db import DatabaseError, connection, transaction

from django_leases.exceptions import TaskArgumentsError
from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.tasks import ENGINE_ERROR_PATH
from django_leases.tasks_api import TaskResultStatus, task
from django_leases.testing import drive
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.worker import Worker
from tests.helpers import wait_until
from tests.workapp import tasks as t


def max_allowed_packet() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        return int(cursor.fetchone()[0])


@task
def returns_text_of(size: int) -> str:
    """A ``str`` of ``size`` characters."""
    return "y" * size


@task
def raises_text_of(size: int) -> None:
    """Raise a ``ValueError`` whose message is ``size`` characters long."""
    raise ValueError("z" * size)


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_return_value_larger_than_the_server_takes_fails_the_attempt_as_itself() -> None:
    """A task returns more than MariaDB's ``max_allowed_packet``: its attempt fails with an
    error that says the value is too large, as a return value that is not JSON does. (Before,
    the write was refused with 1153 and the connection dropped; the engine took it for a lost
    connection, tried again for the whole step lease, and the task failed as "lost its worker
    on every attempt" — an engine error that blamed the worker.)"""
    result = returns_text_of.enqueue(max_allowed_packet() + 1024 * 1024)
    _work_until_it_ended(result)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path != ENGINE_ERROR_PATH, error.traceback


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_task_raising_a_message_larger_than_the_server_takes_fails_as_itself() -> None:
    """A task raises an exception whose message (so its traceback) is larger than
    ``max_allowed_packet``: it fails with that exception's class path, its message and
    traceback cut to what an error record keeps — not as an engine error ("lost its worker",
    after the write of a record too large for the server was retried for the whole lease)."""
    result = raises_text_of.enqueue(max_allowed_packet() + 1024 * 1024)
    _work_until_it_ended(result)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError", error.traceback[-300:]


def _work_until_it_ended(result: Any) -> None:
    """Run a real worker (6 s step leases) until the task of ``result`` has ended; refresh
    ``result``."""
    worker = Worker(1, step_lease_ttl=6, poll_interval=0.1)
    thread = threading.Thread(target=lambda: worker.run(handle_signals=False), daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: WorkflowRun.objects.get(pk=result.id).status != "running",
            90,
            what="the task to end",
        )
    finally:
        worker.stop()
        thread.join(60)
    result.refresh()


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_arguments_larger_than_the_server_takes_are_refused_and_the_transaction_survives() -> None:
    """``enqueue()`` inside the caller's transaction with arguments larger than MariaDB's
    ``max_allowed_packet`` is ``TaskArgumentsError``, nothing stored and the caller's
    transaction untouched, as for arguments nested deeper than MariaDB takes. (Before, the
    statement was refused with 1153 and the dropped connection took the transaction.)"""
    size = max_allowed_packet() + 1024 * 1024
    with transaction.atomic():
        before = t.add.enqueue(1, 2)  # the caller's earlier write in this transaction
        with pytest.raises(TaskArgumentsError):
            try:
                with transaction.atomic():  # a savepoint: the refusal must not cost the rest
                    t.echo.enqueue("x" * size)
            except DatabaseError as exc:
                raise AssertionError(f"enqueue raised {exc!r}, not TaskArgumentsError") from exc
    assert WorkflowRun.objects.filter(pk=before.id).exists()


@step_function("tests.packet.big")
def _big(data: Any, ctx: Any) -> str:
    return "y" * data["size"]


@workflow("tests.packet.one-big-step")
def _one_big_step(run: Any, input: Any) -> Any:
    return run.step("big", "tests.packet.big", input, retries=0)


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_step_result_larger_than_the_server_takes_fails_the_step_as_itself() -> None:
    """The same for a workflow step: its result, larger than ``max_allowed_packet``, is the
    attempt's own failure (a value that cannot be stored), never a lost connection."""
    run_id = start_workflow("tests.packet.one-big-step", {"size": max_allowed_packet() + 1024})
    run = drive(run_id)
    assert run is not None and run.status == "failed"
    step = WorkflowStep.objects.get(run_id=run_id, step_name="big")
    assert "max_allowed_packet" in step.error["message"], step.error
