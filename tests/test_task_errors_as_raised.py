"""A task that raises fails with ``TaskResult.errors`` naming what it raised — its exception's
class path and a traceback — whatever the exception's message holds (a NUL, a lone surrogate,
a long text; more than one statement to MariaDB may carry: tests/test_mariadb_packet.py):
never an engine error that blames the worker, and never a task left unfinished."""

from __future__ import annotations

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)


from django_leases.tasks_api import TaskResultStatus, task
from django_leases.testing import drive


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
