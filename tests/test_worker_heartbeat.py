"""Each worker process holds a heartbeat lease and records itself: live workers are counted
exactly (``leases_check``, the admin), a stopped one says so, a killed one lapses."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from django_leases import health
from django_leases.models import Lease, WorkflowWorker
from tests.helpers import lapse_lease, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "run_workflow_worker", "--concurrency", "2", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _live() -> list[WorkflowWorker]:
    return list(WorkflowWorker.objects.live())


def test_a_running_worker_is_seen_and_a_stopped_one_is_not(
    subprocess_env: dict[str, str],
) -> None:
    worker = _start(subprocess_env)
    try:
        (row,) = wait_until(_live, 60, what="the worker's heartbeat")
        assert row.pid == worker.pid and row.concurrency == 2
        assert row.lease_key.startswith(f"workflow-worker:{row.host}:{worker.pid}:")
        assert row.stopped_at is None and row.wakeup
        finding = {f.check: f for f in health.run_checks().findings}["workers"]
        assert finding.details["live_workers"] == 1, finding
    finally:
        worker.send_signal(signal.SIGTERM)
        _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    assert _live() == []
    row = WorkflowWorker.objects.get(pid=worker.pid)
    assert row.stopped_at is not None
    assert Lease.objects.with_state().get(key=row.lease_key).state == "released"  # type: ignore[attr-defined]


def test_a_killed_worker_is_gone_once_its_heartbeat_lapses(
    subprocess_env: dict[str, str],
) -> None:
    worker = _start(subprocess_env)
    try:
        (row,) = wait_until(_live, 60, what="the worker's heartbeat")
    finally:
        worker.kill()
        worker.communicate(timeout=60)
    assert [w.pid for w in _live()] == [worker.pid], "gone before its lease lapsed"
    lapse_lease(row.lease_key)  # as its TTL would, on the database clock
    assert _live() == []
    assert WorkflowWorker.objects.get(pk=row.pk).stopped_at is None  # it never said so
    assert WorkflowWorker.objects.forget_gone(0) == 1


@pytest.mark.django_db(transaction=True)
def test_two_workers_with_the_same_host_and_pid_are_both_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Containers on the host's network share its hostname; each runs its worker as a low pid
    # of its own PID namespace.
    from django_leases.workflows import Worker
    from django_leases.workflows import worker as worker_module

    monkeypatch.setattr("os.getpid", lambda: 7)
    beats = []
    for _ in range(2):
        beat = worker_module._Heartbeat(Worker(1))
        beat.tick(0)
        beats.append(beat)
    try:
        live = list(WorkflowWorker.objects.live())
        assert len(live) == 2
        assert {row.pid for row in live} == {7}
        for row in live:  # the key stays readable: prefix, host, pid, then the worker's own id
            assert row.lease_key.startswith(f"workflow-worker:{row.host}:7:")
        finding = health.check_workers("default", health.DEFAULT_OVERDUE_AFTER)
        assert finding.details["live_workers"] == 2, finding.details
    finally:
        for beat in beats:
            beat.stop()
