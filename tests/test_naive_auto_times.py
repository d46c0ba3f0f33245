"""With ``USE_TZ = False`` the library writes its own times in naive UTC on SQLite and MariaDB /
MySQL (the database clock), and in ``TIME_ZONE`` on PostgreSQL (whose columns hold instants).
The columns Django fills itself (``auto_now`` / ``auto_now_add``: a run's and a step's
``created_at``, a delivery's ``received_at``, a refusal's ``first_refused_at``) are in the same
zone, or the times of one row would disagree: a run created after it finished, a task enqueued
after it started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import override_settings

pytest.importorskip(
    "django_leases.tasks_api",
    reason="needs Django 6 or the django-tasks backport",
    exc_type=ImportError,
)

from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.testing import drive
from tests.workapp import tasks as t


@pytest.fixture
def tokyo_naive() -> Iterator[None]:
    """USE_TZ off, TIME_ZONE Asia/Tokyo (UTC+9, no daylight saving), on a fresh connection."""
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Tokyo"):
        connection.close()
        try:
            yield
        finally:
            connection.close()
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_run_is_not_created_after_it_finished(tokyo_naive: None) -> None:
    """Rule: a run's ``created_at`` is no later than its step's ``started_at`` and its own
    ``finished_at`` (all read back as the database stores them)."""
    result = t.add.enqueue(1, 2)
    drive()
    run = WorkflowRun.objects.get(pk=result.id)
    step = WorkflowStep.objects.get(run_id=result.id)
    assert run.finished_at is not None
    assert run.created_at <= run.finished_at, (run.created_at, run.finished_at)
    assert step.created_at <= run.finished_at, (step.created_at, run.finished_at)


@pytest.mark.django_db(transaction=True)
def test_a_task_is_not_enqueued_after_it_started(tokyo_naive: None) -> None:
    """Rule: a task result's ``enqueued_at`` <= ``started_at`` <= ``finished_at``."""
    result = t.add.enqueue(1, 2)
    drive()
    result.refresh()
    assert result.enqueued_at <= result.started_at <= result.finished_at, (
        result.enqueued_at,
        result.started_at,
        result.finished_at,
    )
