"""The worker and the commands, end to end: the demo's ``build-preview`` workflow on GitHub
push payloads (ours, and the real ones when ``../shared`` is there), in process and through
``manage.py`` subprocesses; SIGTERM; the shutdown grace; a worker whose database connections
are killed; waking idle workers by LISTEN/NOTIFY."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from django_leases import db
from django_leases.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows import step_function, workflow
from django_leases.workflows.channel import STEP_TABLE, channel_name
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.wakeup import WakeSignal, listens
from django_leases.workflows.worker import (
    EXIT_ABANDONED,
    LISTENING_POLL_INTERVAL,
    POLLING_POLL_INTERVAL,
    Worker,
)
from tests.helpers import (
    MANAGE_PY,
    manage,
    on_another_thread,
    start_process,
    start_thread,
    terminate_other_backends,
    wait_until,
)
from tests.payloads import PayloadSet

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "demo_project" / "previews" / "samples"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """:func:`tests.helpers.wait_until`, reconnecting when the check's connection was killed
    under it (the connection-kill tests)."""

    def reconnecting() -> bool:
        try:
            return check()
        except DatabaseError:
            connection.close()
            return False

    wait_until(reconnecting, timeout, what=what)


def expected_build_id(push: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    commits = [c["id"] for c in push["commits"]]
    for part in (push["repository"]["full_name"], push["after"], *commits):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def assert_preview_run(run_id: uuid.UUID, push: dict[str, Any]) -> None:
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    steps = list(WorkflowStep.objects.filter(run_id=run_id).order_by("id"))
    assert all(s.status == StepStatus.SUCCEEDED and s.attempt == 1 for s in steps)
    assert run.output["repository"] == push["repository"]["full_name"]
    assert run.output["ref"] == push["ref"]
    if push.get("deleted"):
        assert [s.step_name for s in steps] == ["checkout"]
        assert run.output["preview"] is None
        return
    assert [s.step_name for s in steps] == ["checkout", "build", "comment"]
    build_id = expected_build_id(push)
    assert run.output["build_id"] == build_id
    assert run.output["sha"] == push["after"]
    assert run.output["preview"].endswith(f"/{push['repository']['full_name']}/{build_id}/")
    comment = steps[2].result
    assert comment["url"] == run.output["preview"] and comment["posted"] is False
    history = WorkflowStep.objects.history(run_id)
    assert [(h.step.step_name, h.attempt, h.status) for h in history] == [
        (s.step_name, 1, "succeeded") for s in steps
    ]


# -- in process --------------------------------------------------------------------------------


def test_the_demo_workflow_runs_github_pushes_to_completion(
    payload_set: PayloadSet, settings: Any
) -> None:
    settings.DEMO_STEP_SECONDS = 0
    pushes = [sample.payload for sample in payload_set.github("push")]
    assert pushes, f"no push payloads in the {payload_set.name!r} set"
    run_ids = [start_workflow("build-preview", push) for push in pushes]
    assert Worker(concurrency=3, poll_interval=0.05).run(once=True, handle_signals=False) == 0
    for run_id, push in zip(run_ids, pushes, strict=True):
        assert_preview_run(run_id, push)
    assert any(not p.get("deleted") for p in pushes) and any(p.get("deleted") for p in pushes)


def test_concurrent_worker_threads_run_every_step_exactly_once(settings: Any) -> None:
    settings.DEMO_STEP_SECONDS = 0.05
    pushes = [json.loads(path.read_text()) for path in sorted(SAMPLES.glob("*.json"))] * 4
    run_ids = [start_workflow("build-preview", push) for push in pushes]
    assert Worker(concurrency=4, poll_interval=0.05).run(once=True, handle_signals=False) == 0
    for run_id, push in zip(run_ids, pushes, strict=True):
        assert_preview_run(run_id, push)


def test_a_draining_worker_runs_what_a_late_claim_left_due(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``once`` mode: one thread claims a unit while the other, having found nothing, decides
    the worker is drained and stops it. The claiming thread finishes its unit as a stopping
    worker does (what it makes due goes to the queue); the worker must then go on, not
    return with the run unfinished."""
    settings.DEMO_STEP_SECONDS = 0
    push = json.loads((SAMPLES / "push-main.json").read_text())
    run_id = start_workflow("build-preview", push)
    worker = Worker(concurrency=2, poll_interval=0.05)
    claimed = Worker._claimed
    held: list[str] = []

    def claimed_once_the_worker_stopped(self: Worker) -> None:
        if not held:  # the first claim: held until the other thread drained the worker
            held.append(threading.current_thread().name)
            wait_until(self._stop.is_set, 60, what="the other thread to drain the worker")
        claimed(self)

    monkeypatch.setattr(Worker, "_claimed", claimed_once_the_worker_stopped)
    assert worker.run(once=True, handle_signals=False) == 0
    assert held
    assert_preview_run(run_id, push)


_release = threading.Event()
_entered = threading.Event()


@step_function("tests.blocks")
def blocks(data: Any, ctx: Any) -> str:
    _entered.set()
    _release.wait(60)
    return "finished late"


@workflow("tests.blocks")
def blocking(run: Any, input: Any) -> Any:
    return run.step("block", "tests.blocks", {})


def test_a_second_signal_to_an_idle_worker_abandons_nothing() -> None:
    """SIGINT then SIGTERM at once (Ctrl-C under a supervisor that also terminates): the
    idle threads are not "work in flight", so the worker exits 0."""
    worker = Worker(concurrency=3, poll_interval=5, shutdown_grace=30, step_lease_ttl=30)
    codes: list[int] = []
    runner = start_thread(lambda: codes.append(worker.run(handle_signals=False)))
    try:
        wait_for("the threads to go idle", lambda: worker.wake.waiting == 3)
        worker._on_signal(signal.SIGINT)
        worker._on_signal(signal.SIGTERM)
        runner.join(60)
    finally:
        worker.stop()
        runner.join(60)
    assert codes == [0]


def test_a_stopped_worker_gives_up_waiting_after_the_grace_and_says_so() -> None:
    _release.clear()
    _entered.clear()
    run_id = start_workflow("tests.blocks", {})
    worker = Worker(concurrency=1, poll_interval=0.05, shutdown_grace=0.5, step_lease_ttl=30)
    codes: list[int] = []
    runner = start_thread(lambda: codes.append(worker.run(handle_signals=False)))
    try:
        assert _entered.wait(30), "the step never started"
        worker.stop()
        runner.join(30)
        assert codes == [EXIT_ABANDONED]
    finally:
        _release.set()
    # The abandoned step still owns its attempt; nobody replaced it, so its result lands.
    wait_for(
        "the abandoned step to finish",
        lambda: WorkflowStep.objects.filter(run_id=run_id, status="succeeded").exists(),
    )


_kills: list[int] = []


@step_function("tests.kills-connections")
def kills_connections(data: Any, ctx: Any) -> str:
    """On its first attempt, terminate every other backend of this database (the worker's own
    connection and the step lease's renewal connection among them), as a failover would."""
    if ctx.attempt == 1:
        _kills.append(on_another_thread(terminate_other_backends))
    return f"attempt {ctx.attempt}"


@workflow("tests.kills-connections")
def killing(run: Any, input: Any) -> Any:
    return run.step("kill", "tests.kills-connections", {}, retries=3)


@pytest.mark.postgres_only
def test_a_worker_survives_its_database_connections_being_killed() -> None:
    _kills.clear()
    run_id = start_workflow("tests.kills-connections", {})
    worker = Worker(concurrency=2, poll_interval=0.1, step_lease_ttl=5.0)
    runner = start_thread(lambda: worker.run(handle_signals=False))
    try:
        wait_for(
            "the run to complete after its connections were killed",
            lambda: WorkflowRun.objects.filter(pk=run_id, status=RunStatus.COMPLETED).exists(),
        )
    finally:
        worker.stop()
        runner.join(60)
    assert not runner.is_alive()
    assert _kills and _kills[0] >= 1
    connection.close()
    run = WorkflowRun.objects.get(pk=run_id)
    # Attempt 1's result survives its connection: the fenced write reconnected and landed.
    assert run.output == "attempt 1"
    history = WorkflowStep.objects.history(run_id)
    assert [(h.attempt, h.status) for h in history] == [(1, "succeeded")]


# -- waking up -------------------------------------------------------------------------------


def test_the_poll_interval_defaults_to_short_polling_unless_notify_wakes_workers(
    settings: Any, vendor: str
) -> None:
    settings.DJANGO_LEASES = {}
    notified = vendor == "postgresql" and db.psycopg3(connection)  # psycopg2: polling
    expected = LISTENING_POLL_INTERVAL if notified else POLLING_POLL_INTERVAL
    assert listens("default") is notified
    assert Worker().poll_interval == expected
    settings.DJANGO_LEASES = {"WORKER_POLL_INTERVAL": 2.5}
    assert Worker().poll_interval == 2.5
    assert Worker(poll_interval=0.1).poll_interval == 0.1
    with pytest.raises(ValueError, match="poll_interval"):
        Worker(poll_interval=-1)


def test_a_wake_up_given_while_no_thread_waits_is_kept_for_the_next_wait() -> None:
    signal_ = WakeSignal(capacity=2)
    assert signal_.wait(0.01) is False  # nothing given: times out
    signal_.wake()  # e.g. a notification while the thread was still looking for work
    assert signal_.wait(30) is True
    assert signal_.wait(0.01) is False  # one wake-up, one wait
    for _ in range(5):
        signal_.wake()
    assert [signal_.wait(0.01) for _ in range(3)] == [True, True, False]  # at most capacity kept
    signal_.interrupt()
    assert signal_.wait(30) is True  # a stopping worker's threads never wait again


def test_a_thread_waiting_for_a_wake_up_is_woken() -> None:
    signal_ = WakeSignal(capacity=1)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(signal_.wait(60)))
    waiter.start()
    wait_for("the thread to wait", lambda: signal_.waiting == 1)
    signal_.wake_if_waiting()
    waiter.join(30)
    assert woken == [True]
    signal_.wake_if_waiting()  # nobody waits: no wake-up is kept
    assert signal_.wait(0.01) is False


def test_the_channel_belongs_to_one_database(settings: Any) -> None:
    from django_leases.models import WorkflowStep

    assert WorkflowStep._meta.db_table == STEP_TABLE  # what the channel's digest names
    name = channel_name("default")
    assert name == channel_name("default") and len(name) <= 63 and name.isidentifier()
    original = connection.settings_dict["NAME"]
    try:
        connection.settings_dict["NAME"] = f"{original}_another_project"
        assert channel_name("default") != name
    finally:
        connection.settings_dict["NAME"] = original


def _raw_listener(channel: str) -> Any:
    import psycopg
    from psycopg import sql

    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


def _payloads_until(conn: Any, last: str) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while last not in seen:
        assert time.monotonic() < deadline, f"no {last!r} notification; got {seen}"
        seen += [n.payload for n in conn.notifies(timeout=1)]
    return seen[: seen.index(last)]


@pytest.mark.psycopg3_only  # LISTEN/NOTIFY: on psycopg2 workers poll
def test_work_made_due_notifies_at_commit_and_never_on_rollback() -> None:
    channel = channel_name("default")
    listener = _raw_listener(channel)
    try:

        def fence() -> list[str]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, 'fence')", [channel])
            return _payloads_until(listener, "fence")

        with pytest.raises(RuntimeError), transaction.atomic():
            WorkflowRun.objects.start("tests.blocks", {})
            raise RuntimeError("rolled back")
        assert fence() == []
        run = WorkflowRun.objects.start("tests.blocks", {})
        assert fence() == [""]
        step = WorkflowStep.objects.schedule(run.pk, "block", "tests.blocks", {})
        assert fence() == [""]
        WorkflowStep.objects.schedule(run.pk, "block", "tests.blocks", {})  # exists: not due anew
        WorkflowRun.objects.request_pass(run.pk, delay=30)  # due later: found by polling
        assert fence() == []
        claim = WorkflowStep.objects.claim_due(30)
        assert claim is not None and claim.step_id == step.pk
        WorkflowStep.objects.set_result(claim.step_id, "done", claim.attempt)  # a pass is due
        assert fence() == [""]
    finally:
        listener.close()


@step_function("tests.quick")
def quick(data: Any, ctx: Any) -> Any:
    return {"n": data["n"], "attempt": ctx.attempt}


@workflow("tests.quick")
def quick_workflow(run: Any, input: Any) -> Any:
    first = run.step("first", "tests.quick", {"n": 1})
    second = run.step("second", "tests.quick", {"n": 2})
    return [first, second]


@pytest.mark.psycopg3_only  # LISTEN/NOTIFY: on psycopg2 workers poll
def test_an_idle_worker_is_woken_by_notify_and_its_listener_survives_being_killed() -> None:
    """The worker polls only every 10 minutes here, so every pass and step below starts only
    because a notification woke it. Its connections (persistent, as in production) and its
    LISTEN connection are killed while it is idle; it reconnects and is woken again."""
    conn_max_age = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = None  # new threads' connections persist
    worker = Worker(concurrency=2, poll_interval=600)
    runner = start_thread(lambda: worker.run(handle_signals=False))
    try:
        wait_for("the listener", lambda: worker.listener is not None)
        assert worker.listener is not None
        listener = worker.listener
        wait_for(
            "the idle worker", lambda: listener.listening.is_set() and worker.wake.waiting == 2
        )
        first = start_workflow("tests.quick", {})
        wait_for(
            "a notified run to complete",
            lambda: WorkflowRun.objects.filter(pk=first, status=RunStatus.COMPLETED).exists(),
        )
        killed_pid = listener.backend_pid()
        wait_for("the idle worker", lambda: worker.wake.waiting == 2)
        assert terminate_other_backends() >= 2  # the listener and the threads' idle connections
        connection.close()
        wait_for(
            "the listener to reconnect",
            lambda: (
                listener.connects >= 2
                and listener.listening.is_set()
                and listener.backend_pid() not in (None, killed_pid)
            ),
        )
        wait_for("the idle worker", lambda: worker.wake.waiting == 2)
        second = start_workflow("tests.quick", {})
        wait_for(
            "a run started after the kill to complete",
            lambda: WorkflowRun.objects.filter(pk=second, status=RunStatus.COMPLETED).exists(),
        )
    finally:
        worker.stop()
        runner.join(60)
        connection.settings_dict["CONN_MAX_AGE"] = conn_max_age
    assert not runner.is_alive()
    assert worker.listener is not None and not worker.listener.listening.is_set()
    assert WorkflowRun.objects.get(pk=second).output == [
        {"n": 1, "attempt": 1},
        {"n": 2, "attempt": 1},
    ]


# -- commands ----------------------------------------------------------------------------------


def test_start_workflow_command_prints_the_run_id() -> None:
    out = StringIO()
    call_command(
        "start_workflow", "build-preview", "--input", '{"ref": "refs/heads/x"}', stdout=out
    )
    run = WorkflowRun.objects.get(pk=uuid.UUID(out.getvalue().strip()))
    assert (run.workflow, run.input, run.status) == (
        "build-preview",
        {"ref": "refs/heads/x"},
        "running",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build-preview", "--input", "{not json"], "not valid JSON"),
        (["build-preview", "--input", '{"x": NaN}'], "JSON"),
        (["no-such-workflow"], "no-such-workflow"),
        (["build-preview", "--database", "nope"], "nope"),
    ],
)
def test_start_workflow_command_refuses_bad_input_clearly(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("start_workflow", *args, stdout=StringIO())
    assert not WorkflowRun.objects.exists()


def test_run_workflow_worker_refuses_a_bad_concurrency() -> None:
    with pytest.raises(CommandError):
        call_command("run_workflow_worker", "--concurrency", "0", "--once")


def test_the_worker_command_runs_the_demo_workflow_in_a_subprocess(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "DEMO_STEP_SECONDS": "0.1"}
    push_text = (SAMPLES / "push-main.json").read_text()
    started = manage("start_workflow", "build-preview", "--input", push_text, env=env)
    assert started.returncode == 0, started.stderr
    run_id = uuid.UUID(started.stdout.strip())
    worker = manage("run_workflow_worker", "--once", "--concurrency", "2", env=env)
    assert worker.returncode == 0, worker.stderr
    assert_preview_run(run_id, json.loads(push_text))


def test_sigterm_stops_claiming_and_lets_the_step_in_flight_finish(
    subprocess_env: dict[str, str],
) -> None:
    push = json.loads((SAMPLES / "push-main.json").read_text())
    run_id = start_workflow("build-preview", push)
    env = {**subprocess_env, "DEMO_STEP_SECONDS": "3"}
    proc = start_process([*MANAGE_PY, "run_workflow_worker"], env=env)
    try:
        wait_for(
            "the build step to start",
            lambda: WorkflowStep.objects.filter(
                run_id=run_id, step_name="build", status="running"
            ).exists(),
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr
    build = WorkflowStep.objects.get(run_id=run_id, step_name="build")
    assert (build.status, build.attempt) == ("succeeded", 1), "the step in flight was cut short"
    # The stopping worker wrote the build's result with the next step it leads to, for the
    # queue: created, never claimed (no attempt of it started).
    comment = WorkflowStep.objects.filter(run_id=run_id, step_name="comment")
    assert not comment.exclude(status="pending").exists(), "the stopping worker claimed new work"
    assert not WorkflowStepAttempt.objects.filter(step__in=comment).exists(), (
        "the stopping worker claimed new work"
    )
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.RUNNING
    # The next worker carries on where it stopped.
    finish = manage("run_workflow_worker", "--once", env={**env, "DEMO_STEP_SECONDS": "0"})
    assert finish.returncode == 0, finish.stderr
    assert_preview_run(run_id, push)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--metrics-port", "99999"),
        ("--metrics-port", "-1"),
        ("--metrics-port", "0"),
        ("--concurrency", "100000"),
        ("--concurrency", "0"),
        ("--poll-interval", "nan"),
        ("--shutdown-grace", "-1"),
    ],
)
def test_the_worker_refuses_a_value_out_of_bounds_as_bad_usage(option: str, value: str) -> None:
    from django_leases.management.commands.run_workflow_worker import Command

    parser = Command().create_parser("manage.py", "run_workflow_worker")
    with pytest.raises(CommandError, match=option):  # parsed only: nothing is started
        parser.parse_args([option, value])
