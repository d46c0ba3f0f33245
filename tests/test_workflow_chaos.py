"""Chaos acceptance test of the workflow worker (PostgreSQL and MariaDB / MySQL).

Several real ``manage.py run_workflow_worker`` processes run 200+ runs of a three-step workflow
(``tests/chaosapp``) whose step function records every execution in a table. Meanwhile workers
are SIGKILLed (and replaced) and SIGSTOPped past their step lease (then SIGCONTed). Then:

* every run completed, none was lost, each with its three steps succeeded;
* every step's stored result is the one its final attempt produced (the execution table names
  the execution behind each result), and no earlier attempt's result landed anywhere — neither
  on the step nor in its history — although stopped workers did finish superseded executions;
* no attempt was executed twice (exactly one claimer per attempt);
* a killed worker's step in flight was claimed again by another attempt.

How soon (the re-claim delay, on the database clock: the kill is stamped with
``statement_timestamp()``, or ``UTC_TIMESTAMP(6)``, right after the process is reaped, the new
attempt's ``started_at`` is the database's) is printed against its worst case (step lease +
renewal interval + poll interval) but not asserted: latency is the benchmark's
(``bench/workflows.py``), not a test's.

The figures (runs, kills, stops, re-claim delays, total time) are printed (``pytest -s``).
"""

from __future__ import annotations

import functools
import os
import random
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_leases.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.renewal import renewal_interval
from tests.chaosapp.workflows import (
    STEPS,
    TABLE,
    busy_pids,
    create_table_sql,
    db_now,
    empty_table_sql,
    executions,
)
from tests.helpers import Chaos

pytestmark = [
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="needs PostgreSQL or MariaDB (run with DATABASE_URL=postgres://... or mysql://...)",
    ),
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

RUNS = 200
WORKERS = 3
CONCURRENCY = 2
STEP_LEASE_TTL = 2.0
RUN_LEASE_TTL = 3.0
POLL_INTERVAL = 0.5
#: How long a stopped worker stays stopped: well past its step lease, so its step is claimed
#: by another worker before it wakes up and finishes a superseded execution.
STOP_SECONDS = STEP_LEASE_TTL + 3.0
#: Pause between two chaos actions, seconds (random within).
CHAOS_PAUSE = (1.5, 3.0)
#: Give up on the runs completing after this many seconds.
DEADLINE = 420.0


def completed_runs() -> int:
    return WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count()


def chaos_step(chaos: Chaos, rng: random.Random) -> None:
    """One chaos action: SIGKILL a worker (and start a replacement) or SIGSTOP one."""
    candidates = chaos.running()
    if len(candidates) < 2:
        return  # keep at least one worker running besides the victim's replacement
    # Only a worker with a step in flight: it has started up, and the action tests recovery.
    busy = busy_pids()
    candidates = [p for p in candidates if p.pid in busy]
    if not candidates:
        return
    victim = rng.choice(candidates)
    # Kills and stops take turns (one worker stopped at a time), so a fast drain still sees
    # enough of both; which worker, and when, stay random.
    if chaos.stopped or len(chaos.kills) <= len(chaos.stops):
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        chaos.kills.append((victim.pid, db_now()))
        chaos.spawn()
    else:
        os.kill(victim.pid, signal.SIGSTOP)
        chaos.stops.append(victim.pid)
        chaos.stopped[victim.pid] = time.monotonic() + STOP_SECONDS


def chaos_setup(subprocess_env: dict[str, str], **extra: str) -> dict[str, str]:
    """Create (or empty) the executions table; the workers' environment, with ``extra``."""
    with connection.cursor() as cursor:
        cursor.execute(create_table_sql(connection))
        cursor.execute(empty_table_sql(connection))
    return {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.chaosapp.settings",
        "CHAOS_STEP_LEASE_TTL": str(STEP_LEASE_TTL),
        "CHAOS_RUN_LEASE_TTL": str(RUN_LEASE_TTL),
        "CHAOS_POLL_INTERVAL": str(POLL_INTERVAL),
        "CHAOS_STEP_MIN": "0.05",
        "CHAOS_STEP_MAX": "0.4",
        **extra,
    }


def test_workers_killed_and_stopped_at_random_lose_no_run_and_land_no_superseded_write(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    env = chaos_setup(subprocess_env)
    rng = random.Random(os.environ.get("CHAOS_SEED"))
    chaos = Chaos(tmp_path, env, CONCURRENCY)
    began = time.monotonic()
    try:
        run_ids = [WorkflowRun.objects.start("chaos.three-steps", {"n": n}).pk for n in range(RUNS)]
        for _ in range(WORKERS):
            chaos.spawn()
        deadline = began + DEADLINE
        next_action = time.monotonic() + rng.uniform(*CHAOS_PAUSE)
        while completed_runs() < RUNS:
            now = time.monotonic()
            assert now < deadline, f"only {completed_runs()} of {RUNS} runs completed in time"
            chaos.cont_due(now)
            chaos.check_exits()  # a worker ends only when this test kills it (and replaces it)
            if now >= next_action:
                chaos_step(chaos, rng)
                next_action = now + rng.uniform(*CHAOS_PAUSE)
            time.sleep(0.1)
        elapsed = time.monotonic() - began
    finally:
        chaos.shutdown()

    # -- every run completed, none lost ---------------------------------------------------------
    runs = {r.pk: r for r in WorkflowRun.objects.filter(pk__in=run_ids)}
    assert len(runs) == RUNS
    assert all(r.status == RunStatus.COMPLETED for r in runs.values())
    assert WorkflowRun.objects.count() == RUNS

    rows = executions()
    by_attempt: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_attempt.setdefault((str(row["run_id"]), row["step_name"], row["attempt"]), []).append(
            row
        )
    # Exactly one claimer per attempt: no attempt was executed twice.
    assert all(len(found) == 1 for found in by_attempt.values()), [
        key for key, found in by_attempt.items() if len(found) > 1
    ]

    steps = list(WorkflowStep.objects.filter(run_id__in=run_ids))
    assert len(steps) == RUNS * len(STEPS)
    history: dict[int, list[WorkflowStepAttempt]] = {}
    for entry in WorkflowStepAttempt.objects.filter(step__run_id__in=run_ids).order_by("attempt"):
        history.setdefault(entry.step_id, []).append(entry)

    superseded_finished = 0
    for step in steps:
        key = (str(step.run_id), step.step_name, step.attempt)
        # -- the stored result is the final attempt's ----------------------------------------
        assert step.status == StepStatus.SUCCEEDED, (key, step.error)
        (final,) = by_attempt[key]
        assert step.result == {
            "token": final["token"],
            "attempt": step.attempt,
            "pid": final["pid"],
        }, key
        assert final["finished_at"] is not None
        # -- no superseded write landed: only the final attempt has an outcome ---------------
        entries = history[step.pk]
        assert [e.attempt for e in entries] == list(range(1, step.attempt + 1)), key
        for entry in entries[:-1]:
            assert entry.status != "succeeded" and entry.result is None, (key, entry.attempt)
        assert (entries[-1].status, entries[-1].result) == ("succeeded", step.result)
        for attempt in range(1, step.attempt):
            for row in by_attempt.get((str(step.run_id), step.step_name, attempt), []):
                if row["finished_at"] is not None:
                    superseded_finished += 1  # finished, yet its result was refused
        assert runs[step.run_id].output["tokens"][STEPS.index(step.step_name)] == final["token"]

    # -- a killed worker's step was claimed again --------------------------------------------
    attempts_started = {
        (str(e.step.run_id), e.step.step_name, e.attempt): e.started_at
        for e in WorkflowStepAttempt.objects.filter(step__run_id__in=run_ids).select_related("step")
    }
    delays: list[float] = []
    for pid, killed_at in chaos.kills:
        for row in rows:
            if row["pid"] == pid and row["finished_at"] is None:
                assert row["started_at"] <= killed_at
                key = (str(row["run_id"]), row["step_name"], row["attempt"] + 1)
                retaken = attempts_started[key]
                if retaken >= killed_at:  # else superseded already (it had been stopped)
                    delays.append((retaken - killed_at).total_seconds())
    bound = STEP_LEASE_TTL + renewal_interval(STEP_LEASE_TTL) + POLL_INTERVAL
    retried = sum(1 for s in steps if s.attempt > 1)
    print(
        f"\nchaos: {RUNS} runs × {len(STEPS)} steps, {WORKERS} workers × {CONCURRENCY} threads "
        f"({chaos.started} processes started); {len(chaos.kills)} SIGKILLs, "
        f"{len(chaos.stops)} SIGSTOP/SIGCONTs of {STOP_SECONDS:.0f} s; "
        f"{len(rows)} executions for {len(steps)} steps, {retried} steps needed more than "
        f"one attempt, {superseded_finished} superseded executions finished and were refused; "
        f"re-claim after a kill: n={len(delays)} "
        + (
            f"max {max(delays):.2f} s, p50 {statistics.median(delays):.2f} s "
            if delays
            else "(none) "
        )
        + f"(worst case without contention {bound:.2f} s); total {elapsed:.1f} s"
    )
    # The chaos really happened, and exercised both recoveries.
    assert len(chaos.kills) >= 3 and len(chaos.stops) >= 3, "too little chaos to prove anything"
    assert delays, "no worker was killed with a step in flight"
    assert superseded_finished >= 1, "no stopped worker finished a superseded execution"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")


#: Runs of ``chaos.waits`` in the waits chaos test (each starts one child run).
WAIT_RUNS = 40


def test_workflows_that_wait_fan_out_and_start_children_survive_the_chaos(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The same chaos (SIGKILL, SIGSTOP/SIGCONT of workers) over runs that fan out, sleep,
    wait for an event sent during the chaos (some before the run reaches the wait, some
    after; a second copy of each is sent and must be refused) and start a child run: 0 runs
    lost, 0 events lost or consumed twice, 0 superseded writes landed."""
    from django_leases.exceptions import WorkflowEventRefusedError
    from django_leases.models import WorkflowWait
    from django_leases.workflows.engine import send_event

    env = chaos_setup(subprocess_env, CHAOS_SLEEP="0.5")
    rng = random.Random(os.environ.get("CHAOS_SEED"))
    chaos = Chaos(tmp_path, env, CONCURRENCY)
    began = time.monotonic()
    parents = [WorkflowRun.objects.start("chaos.waits", {"n": n}).pk for n in range(WAIT_RUNS)]
    unsent = list(parents)
    rng.shuffle(unsent)
    sent: dict[Any, int] = {}
    refused = 0
    try:
        for _ in range(WORKERS):
            chaos.spawn()
        deadline = began + DEADLINE
        next_action = time.monotonic() + rng.uniform(*CHAOS_PAUSE)
        while WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() < 2 * WAIT_RUNS:
            now = time.monotonic()
            done = WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count()
            assert now < deadline, f"only {done} of {2 * WAIT_RUNS} runs completed in time"
            chaos.cont_due(now)
            chaos.check_exits()
            if unsent and rng.random() < 0.3:  # events arrive during the chaos
                run_id = unsent.pop()
                token = rng.randrange(10**9)
                # A worker stopped mid-transaction may hold the run's row lock: the event
                # waits for it while the stopped workers are resumed on time.
                chaos.call_resuming(functools.partial(send_event, run_id, "go", {"token": token}))
                sent[run_id] = token
                try:
                    chaos.call_resuming(functools.partial(send_event, run_id, "go", {"token": -1}))
                except WorkflowEventRefusedError:
                    refused += 1
            if now >= next_action:
                chaos_step(chaos, rng)
                next_action = now + rng.uniform(*CHAOS_PAUSE)
            time.sleep(0.1)
        elapsed = time.monotonic() - began
    finally:
        chaos.shutdown()

    # -- 0 runs lost: every parent and its one child completed ----------------------------------
    runs = {r.pk: r for r in WorkflowRun.objects.all()}
    assert len(runs) == 2 * WAIT_RUNS
    assert all(r.status == RunStatus.COMPLETED for r in runs.values())
    children = {r.parent_id: r for r in runs.values() if r.parent_id is not None}
    assert set(children) == set(parents)
    # -- 0 events lost or consumed twice ---------------------------------------------------------
    assert refused == WAIT_RUNS, "every second copy of an event was refused"
    for run_id in parents:
        assert runs[run_id].output["event"] == {"token": sent[run_id]}
        wait = WorkflowWait.objects.get(run_id=run_id, name="go")
        assert (wait.status, wait.payload) == ("done", {"token": sent[run_id]})
        assert runs[run_id].output["child"] == children[run_id].output["tokens"]
    # -- 0 superseded writes landed: each stored result is its final attempt's -------------------
    rows = executions()
    by_attempt: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        key = (str(row["run_id"]), row["step_name"], row["attempt"])
        by_attempt.setdefault(key, []).append(row)
    assert all(len(found) == 1 for found in by_attempt.values()), "an attempt ran twice"
    steps = list(WorkflowStep.objects.all())
    assert len(steps) == WAIT_RUNS * (3 + len(STEPS))
    for step in steps:
        key = (str(step.run_id), step.step_name, step.attempt)
        assert step.status == StepStatus.SUCCEEDED, (key, step.error)
        (final,) = by_attempt[key]
        assert step.result == {
            "token": final["token"],
            "attempt": step.attempt,
            "pid": final["pid"],
        }
        earlier = WorkflowStepAttempt.objects.filter(step=step, attempt__lt=step.attempt)
        assert not earlier.filter(status="succeeded").exists(), key
    for run_id in parents:
        fanned = [
            WorkflowStep.objects.get(run_id=run_id, step_name=f"fan-{i}").result["token"]
            for i in range(3)
        ]
        assert runs[run_id].output["fanned"] == fanned
    print(
        f"\nchaos (waits): {WAIT_RUNS} runs (+ {WAIT_RUNS} children), {len(chaos.kills)} "
        f"SIGKILLs, {len(chaos.stops)} SIGSTOP/SIGCONTs; {len(rows)} executions for "
        f"{len(steps)} steps; {refused} duplicate events refused; total {elapsed:.1f} s"
    )
    assert len(chaos.kills) >= 1 and len(chaos.stops) >= 1, "too little chaos to prove anything"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")
