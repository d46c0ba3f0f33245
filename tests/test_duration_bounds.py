"""Durations with no upper bound to speak of: ``leases_check``'s thresholds and the worker's
poll interval are refused past a year (a day for the poll interval) with a usage error that
names them — never an ``OverflowError`` traceback, a false "problem", or every worker thread
dying on its first idle wait."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import CommandError

from django_leases import health
from django_leases.checks import check_leases_settings
from django_leases.management.base import USAGE_ERROR
from django_leases.models import WorkflowRun
from django_leases.workflows.worker import Worker
from tests.helpers import MANAGE_PY, start_process
from tests.test_health import run_command


@pytest.mark.django_db
@pytest.mark.parametrize("option", ["--overdue-after", "--stuck-after"])
@pytest.mark.parametrize("value", ["1e12", "1e300"])
def test_leases_check_refuses_a_threshold_past_a_year(option: str, value: str) -> None:
    """A threshold past a year is a usage error naming the option (exit 2 from the command
    line), and a year itself runs the checks: a healthy database with one fresh run is
    healthy. (Before: an OverflowError traceback from timedelta, or "the check failed:
    DataError: timestamp out of range" and exit 3.)"""
    WorkflowRun.objects.start("health-test", {"n": 1})
    with pytest.raises(CommandError, match=option):
        run_command(option, value, "--format", "json")
    code, out = run_command(option, str(health.MAX_THRESHOLD), "--format", "json")
    report = json.loads(out)
    failed = [c for c in report["checks"] if "the check failed" in c["message"]]
    assert failed == [] and code == 0, out


@pytest.mark.django_db
def test_run_checks_refuses_a_huge_threshold_with_a_value_error() -> None:
    """``run_checks`` documents ``ValueError`` for a threshold it refuses (1e300 s escaped
    as an ``OverflowError`` before)."""
    with pytest.raises(ValueError, match="overdue_after"):
        health.run_checks(overdue_after=1e300)
    with pytest.raises(ValueError, match="stuck_after"):
        health.run_checks(stuck_after=1e300)


@pytest.mark.timeout(120)
def test_the_worker_refuses_a_poll_interval_past_a_day(subprocess_env: dict[str, Any]) -> None:
    """``--poll-interval 1e10`` is a usage error naming the option (before, the parser took
    it and every idle thread died on ``Condition.wait``, past ``threading.TIMEOUT_MAX``:
    exit 3 "a worker thread died"); so is ``WORKER_POLL_INTERVAL`` past a day (E016)."""
    proc = start_process(
        [*MANAGE_PY, "run_workflow_worker", "--poll-interval", "1e10"], env=subprocess_env
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == USAGE_ERROR, stderr
    assert "--poll-interval" in stderr
    with pytest.raises(ValueError, match="poll_interval"):
        Worker(poll_interval=1e10)
    problems = check_leases_settings({"WORKER_POLL_INTERVAL": 1e10})
    assert [m.id for m in problems] == ["django_leases.E016"], problems
