"""A per-second schedule fired by three real worker processes (``run_workflow_worker``), one of
them SIGKILLed on the way: exactly one run per tick, none skipped, none doubled."""

from __future__ import annotations

import signal
import subprocess
from datetime import datetime, timedelta

import pytest

from django_leases.clock import to_aware
from django_leases.models import WorkflowRun, WorkflowSchedule
from tests.helpers import MANAGE_PY, start_process, wait_until

NAME = "every-second"
WORKERS = 3


def ticks() -> list[datetime]:
    """The ticks the schedule started runs for, from the runs' keys, sorted."""
    prefix = f"schedule:{NAME}:"
    keys = WorkflowRun.objects.filter(key__startswith=prefix).values_list("key", flat=True)
    return sorted(datetime.fromisoformat(key[len(prefix) :]) for key in keys)


@pytest.mark.slow
def test_three_workers_start_one_run_per_tick_and_a_killed_one_changes_nothing(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.schedapp.settings"}
    workers = [
        start_process([*MANAGE_PY, "run_workflow_worker", "--concurrency", "1"], env=env)
        for _ in range(WORKERS)
    ]
    # Every worker has synced and fired at least once when two ticks have runs; then one
    # worker dies without a word, whatever it was doing (a firing transaction included).
    wait_until(lambda: len(ticks()) >= 2, timeout=60, interval=0.1, what="the first ticks")
    victim = workers[0]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    at_kill = len(ticks())
    wait_until(
        lambda: len(ticks()) >= at_kill + 5, timeout=60, interval=0.1, what="five more ticks"
    )
    for worker in workers[1:]:
        worker.send_signal(signal.SIGTERM)
    for worker in workers[1:]:
        try:
            _, stderr = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover - reported below
            worker.kill()
            _, stderr = worker.communicate()
        assert worker.returncode == 0, stderr

    fired = ticks()
    assert len(fired) >= 7
    # One run per tick, consecutive seconds from the first: none skipped, none doubled.
    assert fired == [fired[0] + timedelta(seconds=i) for i in range(len(fired))]
    row = WorkflowSchedule.objects.get(name=NAME)
    assert row.declared and not row.paused
    assert to_aware(row.last_tick, "default") == fired[-1]  # type: ignore[arg-type]
    assert to_aware(row.next_tick, "default") == fired[-1] + timedelta(seconds=1)  # type: ignore[arg-type]
    last = WorkflowRun.objects.get(pk=row.last_run_id)
    assert last.workflow == "tests.sched.tick" and last.input == {"from": "settings"}


def test_a_worker_refuses_to_start_on_a_schedule_that_could_never_fire(
    subprocess_env: dict[str, str],
) -> None:
    from tests.helpers import manage

    env = {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.schedapp.settings",
        "SCHED_BAD_ENTRY": "1",
    }
    worker = manage("run_workflow_worker", "--once", env=env)
    assert worker.returncode != 0
    assert "django_leases.E026" in worker.stderr
    assert "'bad-zone'" in worker.stderr and "unknown time zone 'Europe/Atlantis'" in worker.stderr
    assert not WorkflowSchedule.objects.exists()  # nothing synced, nothing fired
