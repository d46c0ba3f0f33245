"""Per-key limits and fair claims with real worker processes (DESIGN §5c, issue 27 item 1).

Limits are measured from the steps' own attempt records (``started_at`` / ``finished_at`` on
the database clock; the claim order from the attempt rows' ids), never from timings. The
rules one claimer at a time are the conformance suite's
(``tests/test_workflow_fairness_conformance.py``)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from django.urls import reverse

from django_leases.clock import DbNow, db_now_plus
from django_leases.models import Lease, RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowStepAttempt
from django_leases.workflows import registry, start_workflow, step_function, workflow
from django_leases.workflows.display import queue_overview
from django_leases.workflows.worker import Worker
from tests.helpers import drain, in_processes, settle, staff_client

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES = {
    "fair-keys": {"key_concurrency": 2, "concurrency": 6},
    "fair-backlog": {"key_concurrency": 8},
    "fair-chaos": {"key_concurrency": 2, "concurrency": 4},
    "fair-key-rated": {"key_rate": "1/h"},
}
FUNCTIONS = {
    "tests.fair.keys": "fair-keys",
    "tests.fair.backlog": "fair-backlog",
    "tests.fair.key_rated": "fair-key-rated",
}

#: Where the chaos test's step function records who ran which attempt (set per test).
EXECUTIONS = "DL_TEST_FAIR_EXECUTIONS"


def _work(data: Any, ctx: Any) -> Any:
    """A step that takes a little while (so that running steps overlap)."""
    time.sleep(float((data or {}).get("sleep", 0.0)))
    return {"step": ctx.step_name}


def _held(data: Any, ctx: Any) -> Any:
    """A step that says which process runs which attempt (a file), then takes a while."""
    folder = Path(os.environ[EXECUTIONS])
    (folder / f"{os.getpid()}~{ctx.run_id}~{ctx.step_name}~{ctx.attempt}").touch()
    time.sleep(float((data or {}).get("sleep", 0.0)))
    return {"step": ctx.step_name}


@workflow("tests.fair.fan")
def fan(run: Any, input: Any) -> Any:
    """``n`` steps of ``function`` at once, under the run's queue key."""
    calls = [
        (f"s{n:04}", input["function"], {"sleep": input.get("sleep", 0.0)})
        for n in range(input["n"])
    ]
    return len(run.parallel(calls, retries=3))


@workflow("tests.fair.idle")
def idle(run: Any, input: Any) -> Any:
    """A run whose steps a test schedules itself."""
    return None


@pytest.fixture(autouse=True)
def queued() -> Iterator[None]:
    with override_settings(DJANGO_LEASES={"QUEUES": QUEUES}):
        for name, queue in FUNCTIONS.items():
            step_function(name, queue=queue)(_work)
        step_function("tests.fair.held", queue="fair-chaos")(_held)
        step_function("tests.fair.plain")(_work)
        try:
            yield
        finally:
            for name in [*FUNCTIONS, "tests.fair.held", "tests.fair.plain"]:
                registry._step_functions.pop(name, None)
                registry._step_options.pop(name, None)


def _intervals(
    queue: str, lapsed: dict[tuple[Any, str, int], Any] | None = None
) -> dict[str, list[tuple[Any, Any]]]:
    """Per queue key, the ``(started_at, finished_at)`` of each attempt of ``queue``'s
    steps. An attempt the test lapsed (``lapsed``: ``(run id, step name, attempt)`` → the
    database time of the lapse) frees its slot from the lapse on: its worker, if alive, may
    still finish it (the fence is the attempt, not the lease). An attempt never finished (a
    write a busy SQLite refused ended its unit, or its worker died before the test saw it
    run; its lease lapsed and the step was taken over) ends where its step's next attempt
    started, at the latest."""
    attempts = list(
        WorkflowStepAttempt.objects.filter(step__queue=queue)
        .order_by("step_id", "attempt")
        .values_list(
            "step_id",
            "step__queue_key",
            "started_at",
            "finished_at",
            "step__run_id",
            "step__step_name",
            "attempt",
        )
    )
    found: dict[str, list[tuple[Any, Any]]] = {}
    for (step_id, key, started, finished, *name), after in zip(
        attempts, [*attempts[1:], None], strict=True
    ):
        ends = [] if finished is None else [finished]
        if after is not None and after[0] == step_id:
            ends.append(after[2])
        if lapsed is not None and tuple(name) in lapsed:
            ends.append(max(started, lapsed[tuple(name)]))
        assert ends, "an attempt never finished"
        found.setdefault(key, []).append((started, min(ends)))
    return found


def _most_at_once(intervals: list[tuple[Any, Any]]) -> int:
    """The most intervals open at one moment (a finish at the moment of a start is before
    it: the step no longer ran)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def _workers(processes: int, threads: int) -> list[tuple[Any, str]]:
    def work() -> int:
        return Worker(threads, step_lease_ttl=LEASE, poll_interval=0.05).run(
            once=True, handle_signals=False
        )

    return in_processes([work] * processes, timeout=300.0)


def test_four_workers_of_four_threads_run_at_most_key_concurrency_of_each_key() -> None:
    """Keys a…f, ``key_concurrency=2``, ``concurrency=6``: never more than 2 of a key, nor
    6 in all, running at once, by the attempts' own records."""
    runs = [
        start_workflow(
            "tests.fair.fan",
            {"n": 12, "function": "tests.fair.keys", "sleep": 0.05},
            queue_key=key,
        )
        for key in "abcdef"
    ]
    assert _workers(4, 4) == [(0, "")] * 4
    for run_id in runs:
        settle(run_id)
    assert set(WorkflowRun.objects.filter(pk__in=runs).values_list("status", flat=True)) == {
        RunStatus.COMPLETED
    }
    succeeded = WorkflowStepAttempt.objects.filter(step__queue="fair-keys", status="succeeded")
    assert succeeded.count() == 72
    per_key = _intervals("fair-keys")
    assert sorted(per_key) == list("abcdef")
    assert max(_most_at_once(intervals) for intervals in per_key.values()) <= 2
    everything = [interval for intervals in per_key.values() for interval in intervals]
    assert 2 <= _most_at_once(everything) <= 6


def test_a_small_key_queued_behind_a_big_backlog_starts_before_its_fiftieth_step(
    tmp_path: Path,
) -> None:
    """1,000 steps of key ``big`` queued before 10 of key ``small``, 4 worker processes × 4
    threads: the 10 all start before big's 50th (claim order: the attempt rows' ids), where
    first come, first served would start them after big's 1,000th. The workers stop once
    that is decided (the small key's 10 and 60 of big's started): the rest of the backlog
    would only take time."""
    runs = [
        start_workflow("tests.fair.fan", {"n": n, "function": "tests.fair.backlog"}, queue_key=key)
        for n, key in ((1000, "big"), (10, "small"))
    ]
    # The two first passes queue the steps (a worker of another queue runs no step here).
    assert drain(Worker(step_lease_ttl=LEASE, queues=["default"])) == 2
    started = WorkflowStepAttempt.objects.filter(step__queue="fair-backlog")

    def decided() -> bool:
        small = started.filter(step__queue_key="small").values("step_id").distinct().count()
        return small == 10 and started.filter(step__queue_key="big").count() >= 60

    connections.close_all()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_serve, args=(str(tmp_path),)) for _ in range(4)]
    for process in workers:
        process.start()
    try:
        _until(decided, "the small key's steps and 60 of the big key's started", limit=300.0)
    finally:
        for process in workers:
            os.kill(process.pid, signal.SIGTERM)
        for process in workers:
            process.join(60)
    assert [process.exitcode for process in workers] == [0] * 4
    # Each step's first attempt, in claim order (a step whose attempt was cut short and run
    # again later started with its first).
    first: dict[int, str] = {}
    for step_id, key in started.order_by("pk").values_list("step_id", "step__queue_key"):
        first.setdefault(step_id, key)
    order = list(first.values())
    assert order.count("small") == 10 and order.count("big") >= 50, runs
    fiftieth_big = [index for index, key in enumerate(order) if key == "big"][49]
    last_small = max(index for index, key in enumerate(order) if key == "small")
    assert last_small < fiftieth_big, (last_small, fiftieth_big)


def _serve(folder: str) -> None:
    """A worker process that runs until SIGTERM (or SIGKILL)."""
    os.environ[EXECUTIONS] = folder
    try:
        Worker(4, step_lease_ttl=LEASE, poll_interval=0.05).run(handle_signals=True)
    finally:
        connections.close_all()
        os._exit(0)


def _ran(folder: Path, pid: int) -> list[tuple[str, str, int]]:
    """The ``(run id, step name, attempt)`` that process ``pid`` started."""
    found = []
    for path in folder.iterdir():
        owner, run_id, step_name, attempt = path.name.split("~")
        if int(owner) == pid:
            found.append((run_id, step_name, int(attempt)))
    return found


def _until(condition: Callable[[], Any], what: str, limit: float = 120.0) -> Any:
    """Poll ``condition`` until it is true (the test fails after ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while not (found := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)
    return found


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="a SIGSTOPped SQLite writer holds the database's one write lock: every writer stops",
)
def test_killed_and_stopped_workers_keep_their_key_slots_until_their_leases_lapse(
    tmp_path: Path,
) -> None:
    """Keys a…c, ``key_concurrency=2``, ``concurrency=4``; three worker processes; one is
    SIGKILLed and one SIGSTOPped while they run steps. Their steps keep their key's slots
    (the limits hold: counted from the attempt records, an attempt never finished ending
    when its lease was lapsed) until their leases are lapsed on the database clock; then the
    steps are claimed again and every run completes."""
    runs = [
        start_workflow(
            "tests.fair.fan",
            {"n": 6, "function": "tests.fair.held", "sleep": 0.2},
            queue_key=key,
        )
        for key in "abc"
    ]
    connections.close_all()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_serve, args=(str(tmp_path),)) for _ in range(3)]
    for process in workers:
        process.start()
    killed, stopped, _alive = workers
    lapsed_at: list[tuple[str, str, int, Any]] = []  # (run, step, attempt, lapsed at)
    try:
        _until(lambda: _ran(tmp_path, killed.pid), "the first worker ran a step")
        os.kill(killed.pid, signal.SIGKILL)
        killed.join()
        _until(lambda: _ran(tmp_path, stopped.pid), "the second worker ran a step")
        os.kill(stopped.pid, signal.SIGSTOP)
        running = WorkflowStep.objects.filter(
            run_id__in=runs, status=StepStatus.RUNNING, lease_expires_at__gt=DbNow()
        )
        for key in "abc":
            assert running.filter(queue_key=key).count() <= 2

        def lapse(pid: int) -> list[tuple[str, str, int]]:
            """Lapse, on the database clock, the step leases of the attempts process ``pid``
            started and the run leases it holds (as when its worker died)."""
            now = WorkflowRun.objects.annotate(now=DbNow()).values_list("now", flat=True)[0]
            held = _ran(tmp_path, pid)
            lapsed_at.extend((run_id, name, attempt, now) for run_id, name, attempt in held)
            for run_id, step_name, attempt in held:
                WorkflowStep.objects.filter(
                    run_id=run_id, step_name=step_name, attempt=attempt, status=StepStatus.RUNNING
                ).update(lease_expires_at=db_now_plus(-1.0))
            Lease.objects.filter(holder__contains=f":{pid}:").update(expires_at=db_now_plus(-1.0))
            return held

        # The stopped worker may hold row locks (a claim or a write in flight; MariaDB locks
        # every row a locking read scans), so it is woken first; then the dead worker's and
        # its attempts lapse, the latter under it: its late writes are refused by the fence.
        os.kill(stopped.pid, signal.SIGCONT)
        held = lapse(killed.pid) + lapse(stopped.pid)
        _until(
            lambda: (
                WorkflowRun.objects.filter(pk__in=runs, status=RunStatus.COMPLETED).count() == 3
            ),
            "every run completed",
        )
    finally:
        for process in workers:
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)
                os.kill(process.pid, signal.SIGTERM)
        for process in workers:
            process.join(60)
    assert lapsed_at and held
    lapsed = {(uuid.UUID(run_id), name, attempt): when for run_id, name, attempt, when in lapsed_at}
    per_key = _intervals("fair-chaos", lapsed)
    assert max(_most_at_once(intervals) for intervals in per_key.values()) <= 2
    everything = [interval for intervals in per_key.values() for interval in intervals]
    assert _most_at_once(everything) <= 4
    again = WorkflowStepAttempt.objects.filter(step__queue="fair-chaos", attempt__gt=1)
    assert again.exists(), "a dead worker's step was claimed again"


def test_the_overview_and_workflow_queues_show_the_busiest_keys() -> None:
    run_id = start_workflow("tests.fair.idle", {}, queue_key="t1")
    for n in range(3):
        WorkflowStep.objects.schedule(
            run_id, f"t1-{n}", "tests.fair.keys", {}, queue="fair-keys", queue_key="t1"
        )
    WorkflowStep.objects.schedule(
        run_id, "t2-0", "tests.fair.keys", {}, queue="fair-keys", queue_key="t2"
    )
    claim = WorkflowStep.objects.claim_due(LEASE, queues=["fair-keys"])
    assert claim is not None
    keys = WorkflowStep.objects.key_counts("fair-keys")
    assert [(k.key, k.running, k.waiting) for k in keys] == [("t1", 1, 2), ("t2", 0, 1)]
    row = next(row for row in queue_overview() if row.name == "fair-keys")
    assert row.key_concurrency == 2
    assert [(k.key, k.running, k.waiting) for k in row.keys] == [("t1", 1, 2), ("t2", 0, 1)]
    out = io.StringIO()
    call_command("workflow_queues", "list", "--format", "json", stdout=out)
    listed = {entry["name"]: entry for entry in json.loads(out.getvalue())}
    assert listed["fair-keys"]["key_concurrency"] == 2
    assert listed["fair-keys"]["keys"][0] == {"key": "t1", "running": 1, "waiting": 2}
    out = io.StringIO()
    call_command("workflow_queues", "list", stdout=out)
    assert "t1" in out.getvalue()
    page = staff_client("view_workflowqueue").get(
        reverse("admin:django_leases_workflowqueue_changelist")
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="queue-key-fair-keys-t1" data-running="1" data-waiting="2"' in html
    assert 'id="queue-key-fair-keys-t2" data-running="0" data-waiting="1"' in html


def test_a_bad_queue_key_on_a_step_is_refused() -> None:
    run_id = start_workflow("tests.fair.idle", {})
    with pytest.raises(ValueError, match="queue_key"):
        WorkflowStep.objects.schedule(run_id, "x", "tests.fair.keys", {}, queue_key="")
    assert not WorkflowStep.objects.filter(run_id=run_id).exists()
    assert isinstance(run_id, uuid.UUID)


def test_a_task_counts_under_the_keyword_argument_its_backend_names() -> None:
    """``OPTIONS["queue_key_kwarg"]``: a task enqueued with that keyword argument counts
    under its value in a keyed queue; a bad value is refused with nothing stored."""
    pytest.importorskip("django_leases.tasks_api")
    from django_leases.tasks_api import InvalidTask
    from tests.workapp import tasks as t

    keyed = {
        "BACKEND": "django_leases.tasks.TaskBackend",
        "QUEUES": ["default", "fair-keys"],
        "OPTIONS": {"queue_key_kwarg": "tenant"},
    }
    with override_settings(TASKS={"default": keyed}):
        task = t.echo.using(queue_name="fair-keys")
        first = task.enqueue(tenant="acme", n=1)
        second = task.enqueue(tenant=42)
        plain = task.enqueue(n=3)
        before = WorkflowRun.objects.count()
        for bad in ["", "x" * 256, True, 1.5]:
            with pytest.raises(InvalidTask, match="tenant"):
                task.enqueue(tenant=bad)
        assert WorkflowRun.objects.count() == before
    keys = {
        str(run_id): (run_key, step_key)
        for run_id, run_key, step_key in WorkflowStep.objects.values_list(
            "run_id", "run__queue_key", "queue_key"
        )
    }
    assert keys[first.id] == ("acme", "acme")
    assert keys[second.id] == ("42", "42")
    assert keys[plain.id] == ("", "")
    counts = {k.key: k.waiting for k in WorkflowStep.objects.key_counts("fair-keys")}
    assert counts == {"acme": 1, "42": 1, "": 1}


def test_another_queues_backlog_does_not_starve_a_keyed_queue() -> None:
    """A worker of every queue: a keyed queue's steps take their turn at their key's last
    claim, another queue's at the time they became due — so a backlog of a plain queue that
    became due after the key's last claim waits behind the key's next step."""
    run_id = start_workflow("tests.fair.idle", {})
    steps = WorkflowStep.objects
    steps.schedule(run_id, "a0", "tests.fair.keys", {}, queue="fair-keys", queue_key="a")
    first = steps.claim_due(LEASE)
    assert first is not None and first.step_name == "a0"
    for n in range(3):
        steps.schedule(run_id, f"plain{n}", "tests.fair.plain", {}, queue="default")
    steps.schedule(run_id, "a1", "tests.fair.keys", {}, queue="fair-keys", queue_key="a")
    second = steps.claim_due(LEASE)
    assert second is not None
    assert second.step_name == "a1", "key a was claimed before the plain steps became due"


def test_drive_jumps_a_key_rate_window_that_holds_back_a_due_step() -> None:
    """``drive()`` moves a key's used-up ``key_rate`` window back, as a queue's ``rate``:
    three steps of one key on ``"1/h"`` all run."""
    from django_leases.testing import drive

    run_id = start_workflow(
        "tests.fair.fan", {"n": 3, "function": "tests.fair.key_rated"}, queue_key="k"
    )
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED
    assert run.output == 3
