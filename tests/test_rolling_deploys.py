"""Rolling deploys: the workflow functions a running worker calls can change under it.

Each version of the code calls PostgreSQL functions whose names carry a hash of their
definition, and a functions migration keeps the previous migration's functions (those the
workers of the code before it call) for one more migration. Should a worker still find one
missing — dropped by a newer release's migrations, or by hand — it never fails a unit of work
for it: it takes the portable path from then on and says so once.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, workflow_base
from django_leases.models.workflow import FUNCTIONS_MIGRATION, functions
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import ROOT, spend_steps_first
from tests.workapp.models import LedgerEntry

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@step_function("tests.deploys.step")
def a_step(data: Any, ctx: Any) -> Any:
    return {"n": data["n"]}


@workflow("tests.deploys.three")
def three_steps(run: Any, input: Any) -> Any:
    return [run.step(name, "tests.deploys.step", {"n": n}) for n, name in enumerate("abc")]


@pytest.fixture
def functions_restored() -> Iterator[None]:
    """Put every function of this code back afterwards, and forget that any was missing."""
    yield
    migration = importlib.import_module(f"django_leases.migrations.{FUNCTIONS_MIGRATION}")
    with connection.cursor() as cursor:
        for statement in migration.FUNCTIONS.values():
            cursor.execute(statement)
    workflow_base.without_functions.clear()


def _drop(short: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {functions(connection)[short].name}")


@pytest.mark.parametrize("short", ["pick_pass", "insert_claimed", "set_result_claiming_next"])
def test_a_worker_whose_function_is_dropped_takes_the_portable_path_and_fails_nothing(
    short: str, functions_restored: None, caplog: pytest.LogCaptureFixture
) -> None:
    first = start_workflow("tests.deploys.three", {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [first])
    assert worker.work_once() is True  # on the tuned path: every function is there
    assert WorkflowRun.objects.get(pk=first).status == RunStatus.COMPLETED
    _drop(short)
    runs = [start_workflow("tests.deploys.three", {}) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="django_leases.workflows"):
        for _ in range(4):
            if not worker.work_once():  # raises if a unit failed
                break
    for run_id in runs:
        run = WorkflowRun.objects.get(pk=run_id)
        assert (run.status, run.output) == (
            RunStatus.COMPLETED,
            [{"n": 0}, {"n": 1}, {"n": 2}],
        ), run.error
    said = [r.getMessage() for r in caplog.records if "portable path" in r.getMessage()]
    assert len(said) == 1, said
    assert functions(connection)[short].name in said[0]


@pytest.mark.parametrize("dropped", ["set_result_claiming_next", "every function"])
def test_a_transactional_step_whose_function_is_dropped_runs_once_and_fails_nothing(
    dropped: str, functions_restored: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A transactional step's result is written inside the step's own transaction, so the
    call that finds its function gone is made there. It neither ends the unit of work nor
    costs the step an attempt: the step's writes and its result commit once, on the
    portable path, and the worker says so once."""
    first = start_workflow("tests.tx.three", {})
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    spend_steps_first(worker, [first])
    while worker.work_once():
        pass
    assert WorkflowRun.objects.get(pk=first).status == RunStatus.COMPLETED
    for short in functions(connection) if dropped == "every function" else [dropped]:
        _drop(short)
    three = start_workflow("tests.tx.three", {})
    one = start_workflow("tests.tx.one", {})
    with caplog.at_level(logging.WARNING, logger="django_leases.workflows"):
        for _ in range(10):
            if not worker.work_once():  # raises if a unit failed
                break
    for run_id, steps in ((three, ["first", "second", "third"]), (one, ["only"])):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == RunStatus.COMPLETED, (run.status, run.error)
        ran = LedgerEntry.objects.filter(run_id=run_id).values_list("step", "attempt")
        assert sorted(ran) == [(step, 1) for step in steps]
        attempts = WorkflowStep.objects.filter(run_id=run_id).values_list("step_name", "attempt")
        assert sorted(attempts) == [(step, 1) for step in steps]
    said = [r.getMessage() for r in caplog.records if "portable path" in r.getMessage()]
    assert len(said) <= 1, said


# -- a worker of the previous release while the new migrations apply ------------------------------

DEPLOY_SETTINGS = """
import environ
SECRET_KEY = "rolling-deploy-test"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes", "django.contrib.auth", "django_leases", "deployapp"
]
DATABASES = {"default": environ.Env().db("DATABASE_URL")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DJANGO_LEASES = {"DEFAULT_TTL": 30, "STEP_LEASE_TTL": 30}
LOGGING = {
    "version": 1,
    "handlers": {"err": {"class": "logging.StreamHandler"}},
    "loggers": {"django_leases": {"handlers": ["err"], "level": "INFO"}},
}
"""

#: Only what every release's API has: the app both codes run.
DEPLOY_WORKFLOWS = """
import time
from django_leases.workflows import step_function, workflow

@step_function("deploy.step")
def step(data, ctx):
    time.sleep(data["seconds"])
    return {"n": data["n"]}

@workflow("deploy.three")
def three(run, input):
    return [
        run.step(name, "deploy.step", {"n": n, "seconds": input["seconds"]})
        for n, name in enumerate("abc")
    ]
"""


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, (
        f"git {' '.join(args)} failed: the rolling-deploy test needs this checkout's history "
        f"(a clone, not an export): {done.stderr}"
    )
    return done.stdout


def previous_release() -> str:
    """The commit before the one that added the latest functions migration: the code whose
    workers run while that migration is applied."""
    path = f"django_leases/migrations/{FUNCTIONS_MIGRATION}.py"
    # A merge that brings the migration in adds it against its first parent: that parent
    # is the previous release.
    found = _git(
        "log",
        "--diff-filter=A",
        "--diff-merges=first-parent",
        "--name-only",
        "--format=%H",
        "-1",
        "--",
        path,
    ).split()
    added = found[0] if found else ""
    assert added, f"{path} is not in this checkout's history"
    return _git("rev-parse", f"{added}^").strip()


def _deploy_env(base: dict[str, str], code: Path, app: Path) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([str(code), str(app)])
    env["DJANGO_SETTINGS_MODULE"] = "deploy_settings"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _django(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=env["PYTHONPATH"].split(os.pathsep)[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(600)
def test_a_worker_of_the_previous_release_fails_no_unit_while_the_new_migrations_apply(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The previous release's code (its package exported from this checkout's history) runs
    a worker on a database migrated for it; runs are started and worked on while this
    code's migrations apply; more are started by this code afterwards. The old worker
    finishes every run it takes, and no unit of work of it fails."""
    old_code = tmp_path / "previous"
    old_code.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", previous_release(), "django_leases"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as exported:
        exported.extractall(old_code, filter="data")
    app = tmp_path / "app"
    (app / "deployapp").mkdir(parents=True)
    (app / "deployapp" / "__init__.py").write_text("")
    (app / "deployapp" / "workflows.py").write_text(DEPLOY_WORKFLOWS)
    (app / "deploy_settings.py").write_text(DEPLOY_SETTINGS)
    new_code = ROOT
    # A database of its own, migrated by the previous release.
    name = f"{connection.settings_dict['NAME']}_deploy"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cursor.execute(f'CREATE DATABASE "{name}"')
    url = subprocess_env["DATABASE_URL"].rsplit("/", 1)[0] + f"/{name}"
    old = _deploy_env({**subprocess_env, "DATABASE_URL": url}, old_code, app)
    new = _deploy_env({**subprocess_env, "DATABASE_URL": url}, new_code, app)
    try:
        migrated = _django(old, "migrate", "-v", "0")
        assert migrated.returncode == 0, migrated.stderr
        # Work enough for the old worker to be in the middle of it (about 5 s on two
        # threads) while the migrations apply.
        started = _django(old, "shell", "-c", _START_RUNS % (30, 0.1))
        assert started.returncode == 0, started.stderr
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "run_workflow_worker", "--concurrency", "2"],
            cwd=app,
            env=old,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            applied = _django(new, "migrate", "-v", "1")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            assert "Applying django_leases." in applied.stdout, "no migration to apply: no test"
            started = _django(new, "shell", "-c", _START_RUNS % (30, 0.01))
            assert started.returncode == 0, started.stderr
            waited = _django(new, "shell", "-c", _WAIT_FOR_RUNS)
            assert waited.returncode == 0, waited.stdout + waited.stderr
        finally:
            worker.send_signal(signal.SIGTERM)
            log, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, log
        assert "a unit of work failed" not in log, log
        assert "Traceback" not in log, log
        assert "completed 60 of 60" in waited.stdout, waited.stdout
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_START_RUNS = """
from django_leases.workflows import start_workflow
for _ in range(%d):
    start_workflow("deploy.three", {"seconds": %s})
"""

_WAIT_FOR_RUNS = """
import time
from django_leases.models import WorkflowRun
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    done = WorkflowRun.objects.filter(status="completed").count()
    if done == WorkflowRun.objects.count():
        break
    time.sleep(0.2)
print(f"completed {WorkflowRun.objects.filter(status='completed').count()} of "
      f"{WorkflowRun.objects.count()}")
"""
