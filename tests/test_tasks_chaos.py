"""Chaos acceptance test of the Django Tasks backend (``django_leases.tasks.TaskBackend``), on
every database.

Real ``manage.py run_workflow_worker`` processes run ``@task`` ``tests.chaosapp.tasks.recorded``,
which records each execution (its attempt, the worker's pid) in the chaos execution table and
returns what names that execution. The test enqueues the tasks a few at a time *during* the
chaos: meanwhile workers with a task in flight are SIGKILLed (and replaced) or SIGSTOPped.
The step leases of the victim's tasks in flight are lapsed on the database clock (not waited
for), so other workers take them over as new attempts; a stopped worker is resumed (SIGCONT)
once each of its tasks was taken over — as soon as the new attempt started, or once it
finished — and finishes its superseded execution, whose return value the fence must refuse.
Then:

* every task is ``SUCCESSFUL``, its run completed;
* exactly one attempt of each succeeded — the step's attempt, ``TaskResult.attempts`` — and
  its stored return value (on the step, the run's output and ``TaskResult.return_value``) is
  the one that attempt's execution produced; no earlier attempt's value landed anywhere,
  although stopped workers did finish superseded executions;
* each attempt was executed at most once (one claimer per attempt), the successful one
  exactly once;
* ``task_finished`` was sent exactly once per task, ``SUCCESSFUL`` (counted in the worker
  processes: ``tests/chaosapp``'s receiver appends to a file). A worker SIGKILLed between the
  commit of a run's end and that signal never sends it (Django's signals are in-process):
  only a task whose run a killed worker ended (its run lease's last holder) may miss it.

A SQLite worker stopped while it holds the database's one write lock would stop every other
writer too: after each SIGSTOP the test's lapse tries the write lock for a short while, and a
worker that holds it is resumed at once (that stop does not count). PostgreSQL and MariaDB /
MySQL lapse with ``SKIP LOCKED``: a row the stopped worker keeps locked lapses by itself.

Figures (tasks, kills, stops, superseded executions refused, total time) are printed
(``pytest -s``); ``CHAOS_SEED`` makes the chaos repeatable.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "django_leases.tasks_api",
    reason="needs Django 6 or the django-tasks backport (pip install -e '.[dev]')",
    exc_type=ImportError,
)

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.test import override_settings

from django_leases.clock import db_now_plus
from django_leases.models import (
    AttemptStatus,
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.tasks import TASK_WORKFLOW
from django_leases.tasks_api import TaskResultStatus
from tests.chaosapp.config import TASK_BACKEND, TASK_BACKEND_SETTINGS
from tests.chaosapp.workflows import (
    TABLE,
    busy_pids,
    create_table_sql,
    db_now,
    empty_table_sql,
    executions,
)
from tests.helpers import Chaos, process_stopped, wait_until

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see a worker stopped"),
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

WORKERS = 3
CONCURRENCY = 2
#: Short leases, each with a margin of 3 s or more over what the test waits on them: the
#: test lapses the victims' step leases itself, on the database clock.
STEP_LEASE_TTL = 3.0
RUN_LEASE_TTL = 3.0
POLL_INTERVAL = 0.5
#: Tasks enqueued at least, and while the chaos lasts at most.
MIN_TASKS = 80
MAX_TASKS = 240
#: Per poll of the test's loop, the chance that it enqueues, and how many (random within).
ENQUEUE_CHANCE = 0.3
ENQUEUE_BATCH = (1, 3)
#: Kills, and stops whose tasks were taken over, the chaos makes at least.
MIN_KILLS = 3
MIN_STOPS = 3
#: Pause between two chaos actions, seconds (random within).
CHAOS_PAUSE = (1.0, 2.0)
#: A stopped worker is resumed after this many seconds whatever happened (a stop whose task
#: was not taken over by then does not count).
STOP_AT_MOST = 10.0
#: How long the test tries SQLite's write lock right after a stop, seconds.
SQLITE_PROBE = 2.0
#: Give up on the tasks finishing after this many seconds.
DEADLINE = 300.0


@dataclass
class Stop:
    """A stopped worker: its tasks in flight (result id, attempt) when it was stopped, and
    whether it is resumed once their new attempts finished (else as soon as they started)."""

    pid: int
    in_flight: list[tuple[str, int]]
    after_finish: bool


@pytest.fixture
def chaos_backend() -> Iterator[Any]:
    """The chaos backend in ``TASKS`` (as the workers have it); yields the ``@task``."""
    with override_settings(TASKS={**settings.TASKS, TASK_BACKEND: TASK_BACKEND_SETTINGS}):
        from tests.chaosapp.tasks import recorded

        yield recorded


def in_flight(pid: int, rows: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    """The (result id, attempt) of ``pid``'s executions recorded but not finished."""
    return [(r["run_id"], r["attempt"]) for r in rows if r["pid"] == pid and not r["finished_at"]]


def taken_over(
    attempts: Sequence[tuple[str, int]], rows: Sequence[dict[str, Any]], *, finished: bool
) -> bool:
    """Whether each of ``attempts`` has a later attempt executed (and ``finished``)."""
    return all(
        any(
            r["run_id"] == run_id and r["attempt"] > attempt and (r["finished_at"] or not finished)
            for r in rows
        )
        for run_id, attempt in attempts
    )


@contextlib.contextmanager
def sqlite_busy_timeout(seconds: float) -> Iterator[None]:
    """On SQLite, this connection's busy timeout set to ``seconds`` meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        (before,) = cursor.fetchone()
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        try:
            yield
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {int(before)}")


def lapse(attempts: Sequence[tuple[str, int]]) -> bool:
    """Lapse the step leases of ``attempts`` (result id, attempt) still running, now on the
    database clock, as when their worker died. PostgreSQL, MariaDB / MySQL: a row locked by a
    stopped worker is skipped (its lease lapses by itself). SQLite: ``False`` when the write
    lock stayed taken for :data:`SQLITE_PROBE` seconds (a stopped worker may hold it)."""
    if not attempts:
        return True
    match = Q()
    for run_id, attempt in attempts:
        match |= Q(run_id=run_id, attempt=attempt)
    steps = WorkflowStep.objects.filter(match, status=StepStatus.RUNNING)
    if connection.vendor == "sqlite":
        with sqlite_busy_timeout(SQLITE_PROBE):
            try:
                steps.update(lease_expires_at=db_now_plus(-1))
            except OperationalError:
                return False
        return True
    with transaction.atomic():
        free = list(steps.select_for_update(skip_locked=True).values_list("pk", flat=True))
        WorkflowStep.objects.filter(pk__in=free).update(lease_expires_at=db_now_plus(-1))
    return True


@dataclass
class TaskChaos:
    """The chaos of one test: the workers (:class:`Chaos`), the stops waiting for their
    takeover, and what happened (kills with their tasks in flight, stops that counted,
    stops undone at once)."""

    chaos: Chaos
    rng: random.Random
    waiting: dict[int, Stop]
    killed_in_flight: list[tuple[str, int]]
    stops_taken_over: int = 0
    stops_undone: int = 0

    def act(self) -> bool:
        """One action: SIGKILL a worker with a task in flight (and start a replacement), or
        SIGSTOP one — kills and stops take turns, none while a stopped worker waits for its
        takeover (the chaos's length stays bounded on a loaded machine). ``False``: no
        action now (a stop waits, no worker is busy, or too few run)."""
        candidates = self.chaos.running()
        if self.waiting or len(candidates) < 2:
            return False  # keep a worker running besides the victim (and its replacement)
        busy = busy_pids()
        candidates = [p for p in candidates if p.pid in busy]
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        if len(self.chaos.kills) <= self.stops_taken_over:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            self.chaos.kills.append((victim.pid, db_now()))
            lost = in_flight(victim.pid, executions())
            self.killed_in_flight += lost
            lapse(lost)
            self.chaos.spawn()
            return True
        os.kill(victim.pid, signal.SIGSTOP)
        wait_until(lambda: process_stopped(victim.pid), what="the worker stopped")
        self.chaos.stops.append(victim.pid)
        stopped = in_flight(victim.pid, executions())
        if not stopped or not lapse(stopped):
            os.kill(victim.pid, signal.SIGCONT)  # nothing to take over, or it holds SQLite
            self.stops_undone += 1
            return True
        self.chaos.stopped[victim.pid] = time.monotonic() + STOP_AT_MOST
        self.waiting[victim.pid] = Stop(victim.pid, stopped, self.rng.random() < 0.5)
        return True

    def resume_taken_over(self) -> None:
        """SIGCONT each stopped worker whose tasks were taken over (or whose time is up)."""
        now = time.monotonic()
        rows = executions() if self.waiting else []
        for pid, stop in list(self.waiting.items()):
            if taken_over(stop.in_flight, rows, finished=stop.after_finish):
                self.stops_taken_over += 1
            elif now < self.chaos.stopped[pid]:
                continue  # not yet taken over, nor its time up
            self.chaos.stopped[pid] = now
            del self.waiting[pid]
        self.chaos.cont_due(now)

    def enough(self) -> bool:
        """Whether the chaos did what the test needs, and no worker is stopped."""
        return (
            len(self.chaos.kills) >= MIN_KILLS
            and self.stops_taken_over >= MIN_STOPS
            and not self.chaos.stopped
        )


def finished_signals(path: Path) -> list[tuple[str, str, int]]:
    """The ``task_finished`` the workers counted: (result id, status, pid) each."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [(i, s, int(p)) for i, s, p in (line.split() for line in lines)]


def test_tasks_enqueued_during_kills_and_stops_finish_once_and_no_superseded_value_lands(
    subprocess_env: dict[str, str], tmp_path: Path, chaos_backend: Any
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(create_table_sql(connection))
        cursor.execute(empty_table_sql(connection))
    finished_log = tmp_path / "task_finished.log"
    env = {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "tests.chaosapp.settings",
        "CHAOS_STEP_LEASE_TTL": str(STEP_LEASE_TTL),
        "CHAOS_RUN_LEASE_TTL": str(RUN_LEASE_TTL),
        "CHAOS_POLL_INTERVAL": str(POLL_INTERVAL),
        "CHAOS_STEP_MIN": "0.2",
        "CHAOS_STEP_MAX": "0.8",
        "CHAOS_FINISHED_LOG": str(finished_log),
    }
    rng = random.Random(os.environ.get("CHAOS_SEED"))
    chaos = Chaos(tmp_path, env, CONCURRENCY)
    run = TaskChaos(chaos, rng, waiting={}, killed_in_flight=[])
    results: list[Any] = []
    began = time.monotonic()
    try:
        for _ in range(WORKERS):
            chaos.spawn()
        deadline = began + DEADLINE
        next_action = time.monotonic() + rng.uniform(*CHAOS_PAUSE)

        def settled() -> bool:
            done = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW)
            ended = done.exclude(status=RunStatus.RUNNING)
            lost = ended.exclude(status=RunStatus.COMPLETED).values_list("pk", "error")
            assert not lost, f"tasks that did not complete: {list(lost)}; see {tmp_path}"
            return ended.count() == len(results)

        # -- tasks enqueued while workers are killed and stopped ------------------------------
        while len(results) < MIN_TASKS or not run.enough() or not settled():
            now = time.monotonic()
            assert now < deadline, f"{len(results)} tasks, not all finished in time"
            chaos.check_exits()  # a worker ends only when this test kills it (and replaces it)
            run.resume_taken_over()
            enqueuing = len(results) < MIN_TASKS or not run.enough()
            if enqueuing and len(results) < MAX_TASKS and rng.random() < ENQUEUE_CHANCE:
                for _ in range(rng.randint(*ENQUEUE_BATCH)):
                    results.append(chaos_backend.enqueue(len(results)))
            if enqueuing and now >= next_action and run.act():
                next_action = now + rng.uniform(*CHAOS_PAUSE)  # else: again at the next poll
            time.sleep(0.1)
        elapsed = time.monotonic() - began
    finally:
        chaos.shutdown()

    # -- every task succeeded -------------------------------------------------------------------
    ids = [r.id for r in results]
    assert len(set(ids)) == len(ids) >= MIN_TASKS
    for result in results:
        result.refresh()
    assert {r.status for r in results} == {TaskResultStatus.SUCCESSFUL}

    rows = executions()
    by_attempt: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_attempt.setdefault((row["run_id"], row["attempt"]), []).append(row)
    # Exactly one claimer per attempt: no attempt was executed twice.
    assert all(len(found) == 1 for found in by_attempt.values()), [
        key for key, found in by_attempt.items() if len(found) > 1
    ]
    assert {run_id for run_id, _ in by_attempt} == set(ids), "an execution of no task"

    steps = {str(s.run_id): s for s in WorkflowStep.objects.filter(run_id__in=ids)}
    runs = {str(r.pk): r for r in WorkflowRun.objects.filter(pk__in=ids)}
    history: dict[int, list[WorkflowStepAttempt]] = {}
    for entry in WorkflowStepAttempt.objects.filter(step__run_id__in=ids).order_by("attempt"):
        history.setdefault(entry.step_id, []).append(entry)
    superseded_finished = 0
    for result in results:
        step = steps[result.id]
        # -- the stored value is the one the attempt the engine judged successful produced ----
        assert step.status == StepStatus.SUCCEEDED, (result.id, step.error)
        assert result.attempts == step.attempt, result.id
        (final,) = by_attempt[(result.id, step.attempt)]
        assert final["finished_at"], result.id
        value = {"token": final["token"], "attempt": step.attempt, "pid": final["pid"]}
        assert result.return_value == value, result.id
        assert step.result["return_value"] == value, result.id
        assert runs[result.id].output == value, result.id
        assert result.worker_ids[-1].split(":")[1] == str(final["pid"]), result.id
        # -- exactly one attempt succeeded; no superseded value landed ------------------------
        entries = history[step.pk]
        assert [e.attempt for e in entries] == list(range(1, step.attempt + 1)), result.id
        for entry in entries[:-1]:
            assert entry.status != AttemptStatus.SUCCEEDED and entry.result is None, (
                result.id,
                entry.attempt,
            )
        assert entries[-1].status == AttemptStatus.SUCCEEDED, result.id
        assert entries[-1].result["return_value"] == value, result.id
        for attempt in range(1, step.attempt):
            for row in by_attempt.get((result.id, attempt), []):
                if row["finished_at"]:
                    superseded_finished += 1  # finished, yet its value was refused

    # -- task_finished: once per task, SUCCESSFUL -----------------------------------------------
    signals = finished_signals(finished_log)
    sent = Counter(task_id for task_id, _, _ in signals)
    assert {status for _, status, _ in signals} <= {"SUCCESSFUL"}
    assert all(n == 1 for n in sent.values()), [i for i, n in sent.items() if n > 1]
    assert set(sent) <= set(ids)
    killed = {pid for pid, _ in chaos.kills}
    unsent = [i for i in ids if i not in sent]
    for task_id in unsent:
        # The run lease's last holder is the worker whose pass ended the run.
        holder = Lease.objects.filter(key=f"workflow-run:{task_id}").values_list("holder")
        ender = [h.split(":")[1] for (h,) in holder]
        assert ender and int(ender[0]) in killed, f"task {task_id} never sent task_finished"

    # -- a killed worker's tasks were taken over ------------------------------------------------
    assert run.killed_in_flight, "no worker was killed with a task in flight"
    for run_id, attempt in run.killed_in_flight:
        assert (run_id, attempt + 1) in by_attempt, (run_id, attempt)

    # The resumed workers did try to land those values, and were told they were superseded.
    refused = sum(log.read_text().count("was superseded") for log in tmp_path.glob("worker-*.log"))
    retried = sum(1 for s in steps.values() if s.attempt > 1)
    print(
        f"\ntask chaos ({connection.vendor}): {len(results)} tasks enqueued during the chaos, "
        f"{WORKERS} workers × {CONCURRENCY} threads ({chaos.started} processes started); "
        f"{len(chaos.kills)} SIGKILLs ({len(run.killed_in_flight)} tasks in flight), "
        f"{len(chaos.stops)} SIGSTOPs ({run.stops_taken_over} taken over, "
        f"{run.stops_undone} undone at once); {len(rows)} executions, {retried} tasks needed "
        f"more than one attempt, {superseded_finished} superseded executions finished and "
        f"were refused ({refused} refusals logged); {len(unsent)} task_finished lost with "
        f"a killed worker; total {elapsed:.1f} s"
    )
    # The chaos really happened, and exercised both recoveries.
    assert len(chaos.kills) >= MIN_KILLS and run.stops_taken_over >= MIN_STOPS
    assert superseded_finished >= 1, "no stopped worker finished a superseded execution"
    assert refused >= 1, "no superseded write was refused"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")
