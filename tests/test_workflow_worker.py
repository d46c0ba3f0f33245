"""The worker and the commands, end to end: the demo's ``build-preview`` workflow on real GitHub
push payloads, in process and through ``manage.py`` subprocesses; SIGTERM; the shutdown grace;
a worker whose database connections are killed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections

from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import EXIT_ABANDONED, Worker

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "demo_project" / "previews" / "samples"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except DatabaseError:
            connection.close()  # killed under us (the connection-kill test): reconnect
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


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


def test_the_demo_workflow_runs_real_github_pushes_to_completion(
    shared_fixtures: Path, settings: Any
) -> None:
    settings.DEMO_STEP_SECONDS = 0
    pushes = [
        json.loads(path.read_text())
        for path in sorted((shared_fixtures / "github" / "push").glob("*.json"))
    ]
    assert pushes, "no push payloads in the shared fixtures"
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


def test_a_stopped_worker_gives_up_waiting_after_the_grace_and_says_so() -> None:
    _release.clear()
    _entered.clear()
    run_id = start_workflow("tests.blocks", {})
    worker = Worker(concurrency=1, poll_interval=0.05, shutdown_grace=0.5, step_lease_ttl=30)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(worker.run(handle_signals=False)))
    runner.start()
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

        def kill() -> None:
            try:
                with connections["default"].cursor() as cursor:
                    cursor.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    _kills.append(cursor.fetchone()[0])
            finally:
                connections.close_all()

        killer = threading.Thread(target=kill)
        killer.start()
        killer.join()
    return f"attempt {ctx.attempt}"


@workflow("tests.kills-connections")
def killing(run: Any, input: Any) -> Any:
    return run.step("kill", "tests.kills-connections", {}, retries=3)


@pytest.mark.postgres_only
def test_a_worker_survives_its_database_connections_being_killed() -> None:
    _kills.clear()
    run_id = start_workflow("tests.kills-connections", {})
    worker = Worker(concurrency=2, poll_interval=0.1, step_lease_ttl=5.0)
    runner = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    runner.start()
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


def manage(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_workflow_worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    assert not WorkflowStep.objects.filter(run_id=run_id, step_name="comment").exists(), (
        "the stopping worker claimed new work"
    )
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.RUNNING
    # The next worker carries on where it stopped.
    finish = manage("run_workflow_worker", "--once", env={**env, "DEMO_STEP_SECONDS": "0"})
    assert finish.returncode == 0, finish.stderr
    assert_preview_run(run_id, push)
