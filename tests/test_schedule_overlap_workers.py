"""Overlap policies and backfills under real processes: three ``run_workflow_worker``
processes fire per-second schedules whose runs live 2 s, one worker SIGKILLed midway — one
outcome per tick and never two live runs of one schedule; ``workflow_schedules backfill``
run three times at once, then again — each tick of the window started once."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import threading
from datetime import datetime, timedelta

import pytest

from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.workflows.schedules import run_key
from django_leases.workflows.values import TASK_WORKFLOW, RunStatus
from tests.helpers import MANAGE_PY, run_at_once, start_process, wait_until

POLICIES = ("skip", "buffer_one", "cancel_other")
LIVE = (RunStatus.RUNNING, RunStatus.SUSPENDED)


def runs(name: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(key__startswith=f"schedule:{name}:").order_by("key"))


def tick_of(run: WorkflowRun) -> datetime:
    return datetime.fromisoformat(run.key.split(":", 2)[2])  # type: ignore[union-attr]


@pytest.mark.slow
def test_three_workers_one_killed_keep_one_live_run_per_schedule(
    subprocess_env: dict[str, str],
) -> None:
    env = {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.schedapp.settings",
        "SCHED_OVERLAP": "1",
    }
    # A sampler reads, in one statement each time, how many runs of each schedule are live.
    most_live: dict[str, int] = dict.fromkeys(POLICIES, 0)
    stop = threading.Event()

    def sample() -> None:
        from django.db import connections

        try:
            while not stop.is_set():
                live = WorkflowRun.objects.filter(key__startswith="schedule:", status__in=LIVE)
                per: dict[str, int] = {}
                for key in live.values_list("key", flat=True):
                    name = key.split(":", 2)[1]
                    per[name] = per.get(name, 0) + 1
                for name, count in per.items():
                    if name in most_live:
                        most_live[name] = max(most_live[name], count)
                stop.wait(0.05)
        finally:
            connections.close_all()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    workers = [
        start_process([*MANAGE_PY, "run_workflow_worker", "--concurrency", "2"], env=env)
        for _ in range(3)
    ]
    try:
        wait_until(
            lambda: all(len(runs(p)) >= 2 for p in POLICIES),
            timeout=90,
            interval=0.2,
            what="two runs of each schedule",
        )
        victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        at_kill = {p: len(runs(p)) for p in POLICIES}
        wait_until(
            lambda: all(len(runs(p)) >= at_kill[p] + 2 for p in POLICIES),
            timeout=120,
            interval=0.2,
            what="two more runs of each schedule",
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
    finally:
        stop.set()
        sampler.join(30)

    assert most_live == dict.fromkeys(POLICIES, 1), most_live
    # The task schedule: one task run per tick, consecutive seconds, none doubled, across
    # the three schedulers (one killed midway).
    tasks = runs("task-second")
    assert all(run.workflow == TASK_WORKFLOW for run in tasks)
    enqueued = [tick_of(run) for run in tasks]
    assert len(enqueued) >= 5
    assert enqueued == [enqueued[0] + timedelta(seconds=i) for i in range(len(enqueued))]
    for policy in POLICIES:
        row = WorkflowSchedule.objects.get(name=policy)
        started = runs(policy)
        ticks = [tick_of(run) for run in started]
        assert len(ticks) == len(set(ticks))
        # From the runs' own records: each run was created after the one before had ended.
        ordered = sorted(started, key=lambda run: run.created_at)
        for before, after in itertools.pairwise(ordered):
            assert before.finished_at is not None, (policy, before.key, before.status)
            assert after.created_at >= before.finished_at, (policy, before.key, after.key)
        if policy == "skip":
            assert row.skipped_ticks > 0 and row.last_skip_reason == "overlap"
            # Every tick from the first to the last fired either started a run or was
            # skipped: one outcome each, none lost, none doubled.
            span = int((ticks[-1] - ticks[0]).total_seconds()) + 1
            assert len(ticks) + row.skipped_ticks >= span
        if policy == "buffer_one":
            assert row.last_skip_reason == "buffer_full"
        if policy == "cancel_other":
            cancelled = [run for run in started if run.status == RunStatus.CANCELLED]
            assert cancelled and all(
                "overlap cancel_other" in run.error["message"] for run in cancelled
            )


@pytest.mark.slow
def test_a_backfill_run_three_times_at_once_then_again_starts_each_tick_once(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.schedapp.settings"}
    start, end = "2026-01-01T00:00:00+00:00", "2026-01-01T00:02:00+00:00"
    command = [
        *MANAGE_PY,
        "workflow_schedules",
        "backfill",
        "every-second",
        "--start",
        start,
        "--end",
        end,
        "--format",
        "json",
    ]
    done = run_at_once([command] * 3, env=env)
    done += run_at_once([command], env=env)
    for outcome in done:
        assert outcome.returncode == 0, outcome.stderr
    reports = [json.loads(outcome.stdout) for outcome in done]
    assert all(len(report["ticks"]) == 120 for report in reports)
    started = [run for report in reports for run in report["started"]]
    assert len(started) == len(set(started)) == 120
    assert reports[-1]["started"] == []
    first = datetime.fromisoformat(start)
    keys = sorted(run.key for run in runs("every-second"))
    assert keys == sorted(run_key("every-second", first + timedelta(seconds=i)) for i in range(120))
    assert {str(run.id) for run in runs("every-second")} == set(started)


def test_a_bad_backfill_window_is_a_command_error(subprocess_env: dict[str, str]) -> None:
    from tests.helpers import manage

    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.schedapp.settings"}
    base = ["workflow_schedules", "backfill", "every-second"]
    future = manage(*base, "--start", "2026-01-01", "--end", "2999-01-01", env=env)
    assert future.returncode == 1 and "after now" in future.stderr
    garbled = manage(*base, "--start", "yesterday", "--end", "2026-01-01", env=env)
    assert garbled.returncode == 1 and "not an ISO 8601" in garbled.stderr
    unknown = manage(
        "workflow_schedules",
        "backfill",
        "nope",
        "--start",
        "2026-01-01",
        "--end",
        "2026-01-02",
        env=env,
    )
    assert unknown.returncode == 1 and "'nope'" in unknown.stderr
    assert not WorkflowRun.objects.exists()
