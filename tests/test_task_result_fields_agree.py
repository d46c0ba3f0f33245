"""A ``TaskResult``'s fields never contradict each other: ``attempts`` is the number of worker
ids, ``errors`` holds one error per failed attempt, and the times run enqueued ≤ started ≤
last attempted ≤ finished, with ``finished_at`` set exactly when the status is final."""

from __future__ import annotations

import pytest

pytest.importorskip("django_leases.tasks_api", exc_type=ImportError)

from django_leases.tasks_api import TaskResultStatus
from django_leases.testing import drive
from tests.workapp import tasks as t


@pytest.mark.django_db
def test_a_task_that_succeeds_on_its_second_attempt_reads_consistently() -> None:
    """Rule: retried once then successful: SUCCESSFUL, 2 attempts, 2 worker ids, 1 error
    (the first attempt's RuntimeError), and ordered times."""
    result = t.flaky.enqueue(fail_until=2)
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2 and len(result.worker_ids) == 2
    [error] = result.errors
    assert error.exception_class_path == "builtins.RuntimeError"
    assert "attempt 1 fails" in error.traceback
    assert result.return_value["attempt"] == 2
    assert result.enqueued_at <= result.started_at < result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at


@pytest.mark.django_db
def test_a_task_out_of_attempts_reads_consistently() -> None:
    """Rule: failed on every attempt: FAILED, one error per attempt, finished_at set."""
    result = t.flaky.enqueue(fail_until=99)
    drive()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3 == len(result.errors) == len(result.worker_ids)
    assert all(e.exception_class_path == "builtins.RuntimeError" for e in result.errors)
    assert result.started_at <= result.last_attempted_at <= result.finished_at
