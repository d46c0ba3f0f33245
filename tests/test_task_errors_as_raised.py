"""A task that raises fails with ``TaskResult.errors`` naming what it raised — its exception's
class path and a traceback — whatever the exception's message holds (a NUL, a lone surrogate,
more text than one statement to the database may carry): never an engine error that blames the
worker, and never a task left unfinished."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)

from django.db import connection

from django_leases.models import WorkflowRun
from django_leases.tasks import ENGINE_ERROR_PATH
from django_leases.tasks_api import TaskResultStatus, task
from django_leases.testing import drive
from django_leases.workflows.worker import Worker
from tests.helpers import wait_until


@task
def raises_message(message: str, repeat: int = 1) -> None:
    """Raise ``ValueError(message * repeat)``, each ``<NUL>`` in it a NUL character (which
    arguments may not hold)."""
    raise ValueError(message.replace("<NUL>", "\x00") * repeat)


@task
def raises_surrogate() -> None:
    """Raise ``ValueError`` whose message holds a lone surrogate (not encodable as UTF-8)."""
    raise ValueError("bad \ud800 text")


@pytest.mark.django_db
@pytest.mark.parametrize("message", ["nul <NUL> inside", "x" * 50_000])
def test_a_task_raising_an_awkward_message_fails_with_its_own_error(message: str) -> None:
    """Rule: a task whose exception message holds a NUL (refused by jsonb) or is long still
    fails as itself: FAILED, one error with path ``builtins.ValueError`` and a traceback."""
    result = raises_message.enqueue(message)
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError", error.traceback[:300]
    assert "ValueError" in error.traceback
    assert result.attempts == 1 and result.finished_at is not None


@pytest.mark.django_db
def test_a_task_raising_a_lone_surrogate_fails_with_its_own_error() -> None:
    """Rule: a task whose exception message holds a lone surrogate fails as itself."""
    result = raises_surrogate.enqueue()
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError", error.traceback[:300]


def max_allowed_packet() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        return int(cursor.fetchone()[0])


@pytest.mark.mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_task_raising_a_message_larger_than_the_server_takes_fails_as_itself() -> None:
    """Rule: a task that raises an exception whose message (so its traceback) is larger than
    MariaDB's ``max_allowed_packet`` fails with that exception's class path, as a return value
    that large does — not as an engine error ("lost its worker")."""
    result = raises_message.enqueue("z", max_allowed_packet() + 1024 * 1024)
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
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError", (
        error.exception_class_path,
        error.traceback[:300],
    )
    assert error.exception_class_path != ENGINE_ERROR_PATH
