"""``manage.py workflow_runs list|resume|cancel|retry`` and ``start_workflow``'s bad input:
thin commands over the store's operator methods, with exit codes and errors on stderr."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command

from django_leases.management.base import EXIT_CODES, USAGE_ERROR
from django_leases.management.commands.workflow_runs import EXIT_WRONG_STATE
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows.values import STEP_FUNCTION_NOT_FOUND
from tests.helpers import MANAGE_PY, ROOT, failed_run, manage

pytestmark = pytest.mark.django_db(transaction=True)


def runs_command(*args: str) -> str:
    out = StringIO()
    call_command("workflow_runs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def runs() -> dict[str, WorkflowRun]:
    """A running run, a run suspended for a missing step function, and a completed one."""
    running = WorkflowRun.objects.start("shop.order-paid", {"order": 1})
    suspended = WorkflowRun.objects.start("previews.build", {})
    step = WorkflowStep.objects.schedule(suspended.id, "build", "previews.build", retries=0)
    claim = WorkflowStep.objects.claim_for_execution(suspended.id, "build", "previews.build", 60)
    assert claim is not None
    WorkflowStep.objects.suspend_for_missing_function(step.pk, claim.attempt, "previews.build")
    done = WorkflowRun.objects.start("shop.order-paid", {"order": 2})
    WorkflowRun.objects.complete(done.id, {"ok": True})
    return {"running": running, "suspended": suspended, "done": done}


def test_list_shows_runs_and_filters_by_status_and_workflow(runs: dict[str, WorkflowRun]) -> None:
    text = runs_command("list")
    assert text.splitlines()[0].split() == ["RUN", "ID", "WORKFLOW", "STATUS", "CREATED", "ERROR"]
    for run in runs.values():
        assert str(run.id) in text
    assert STEP_FUNCTION_NOT_FOUND in text
    suspended = runs_command("list", "--status", "suspended")
    assert str(runs["suspended"].id) in suspended and str(runs["running"].id) not in suspended
    shop = runs_command("list", "--workflow", "shop.order-paid")
    assert str(runs["running"].id) in shop and str(runs["done"].id) in shop
    assert str(runs["suspended"].id) not in shop
    assert len(runs_command("list", "--limit", "1").splitlines()) == 2
    assert runs_command("list", "--workflow", "nope").strip() == "No workflow runs."


def test_list_as_json_has_typed_fields(runs: dict[str, WorkflowRun]) -> None:
    listed = json.loads(runs_command("list", "--format", "json"))
    assert [row["id"] for row in listed] == [
        str(runs[name].id) for name in ("done", "suspended", "running")
    ]
    for row in listed:
        assert list(row) == [
            "id",
            "workflow",
            "task",
            "status",
            "created_at",
            "error",
            "key",
            "tags",
        ]
        assert row["task"] is None  # a Django task's path, for task runs only
        run = WorkflowRun.objects.get(pk=row["id"])
        assert datetime.fromisoformat(row["created_at"]) == run.created_at
    done, suspended, running = listed
    assert (done["workflow"], done["status"], done["error"]) == (
        "shop.order-paid",
        "completed",
        None,
    )
    assert (running["status"], running["error"]) == ("running", None)
    assert suspended["status"] == "suspended"
    assert suspended["error"] == WorkflowRun.objects.get(pk=runs["suspended"].id).error
    assert suspended["error"]["code"] == STEP_FUNCTION_NOT_FOUND
    limited = json.loads(runs_command("list", "--format", "json", "--limit", "1"))
    assert [row["id"] for row in limited] == [str(runs["done"].id)]
    assert json.loads(runs_command("list", "--workflow", "nope", "--format", "json")) == []


def test_list_as_a_table_keeps_its_columns(runs: dict[str, WorkflowRun]) -> None:
    lines = runs_command("list", "--format", "table").splitlines()
    assert lines == runs_command("list").splitlines()
    header, *rows = lines
    assert header.split() == ["RUN", "ID", "WORKFLOW", "STATUS", "CREATED", "ERROR"]
    assert header.index("WORKFLOW") == rows[0].index("shop.order-paid")
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    created = WorkflowRun.objects.get(pk=runs["done"].id).created_at
    assert cells[str(runs["done"].id)] == [
        "shop.order-paid",
        "completed",
        created.isoformat(timespec="seconds"),
        "-",
    ]
    assert cells[str(runs["suspended"].id)][-1] == STEP_FUNCTION_NOT_FOUND


def test_resume_cancel_and_retry_call_the_store(runs: dict[str, WorkflowRun]) -> None:
    out = runs_command("resume", str(runs["suspended"].id))
    assert "suspended → running" in out and "'build'" in out
    assert WorkflowRun.objects.get(pk=runs["suspended"].id).status == RunStatus.RUNNING
    out = runs_command("cancel", str(runs["running"].id))
    assert "running → cancelled" in out
    assert WorkflowRun.objects.get(pk=runs["running"].id).status == RunStatus.CANCELLED
    failed = failed_run("previews.build", "build", "previews.build")
    out = runs_command("retry", str(failed.id), "build")
    assert "failed → running" in out
    assert WorkflowStep.objects.claim_due(60) is not None


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["resume", "{running}"], "is running", EXIT_WRONG_STATE),
        (["cancel", "{done}"], "is completed", EXIT_WRONG_STATE),
        (["retry", "{running}", "nope"], "no step named 'nope'", 1),
        (["resume", "{unknown}"], "No workflow run with id", 1),
        (["cancel", "not-a-uuid"], "not a workflow run id", 1),
        (["cancel", "{running}", "--database", "nope"], "Unknown database alias 'nope'", 2),
        (["list", "--database", "nope"], "Unknown database alias 'nope'", USAGE_ERROR),
        (["list", "--limit", "0"], "--limit", 1),
    ],
)
def test_refusals_are_clear_errors_with_their_exit_code(
    runs: dict[str, WorkflowRun], args: list[str], message: str, code: int
) -> None:
    ids = {name: str(run.id) for name, run in runs.items()} | {"unknown": str(uuid.uuid4())}
    before = sorted(WorkflowRun.objects.values_list("id", "status", "pass_requests"))
    with pytest.raises(CommandError, match=message) as refused:
        runs_command(*[arg.format(**ids) for arg in args])
    assert refused.value.returncode == code
    assert sorted(WorkflowRun.objects.values_list("id", "status", "pass_requests")) == before


def test_as_a_process_errors_go_to_stderr_with_their_exit_code(
    subprocess_env: dict[str, str],
) -> None:
    run = WorkflowRun.objects.start("shop.order-paid", {})
    wrong_state = manage("workflow_runs", "resume", str(run.id), env=subprocess_env)
    assert wrong_state.returncode == EXIT_WRONG_STATE
    assert "is running" in wrong_state.stderr and wrong_state.stdout == ""
    unknown = manage("workflow_runs", "cancel", str(uuid.uuid4()), env=subprocess_env)
    assert unknown.returncode == 1 and "No workflow run with id" in unknown.stderr
    usage = manage("workflow_runs", "frobnicate", env=subprocess_env)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    done = manage("workflow_runs", "cancel", str(run.id), env=subprocess_env)
    assert done.returncode == 0, done.stderr
    assert "running → cancelled" in done.stdout
    listed = manage("workflow_runs", "list", "--status", "cancelled", env=subprocess_env)
    assert listed.returncode == 0 and str(run.id) in listed.stdout
    unknown_db = manage("workflow_runs", "list", "--database", "nope", env=subprocess_env)
    assert unknown_db.returncode == USAGE_ERROR
    assert "Unknown database alias 'nope'" in unknown_db.stderr
    assert "Traceback" not in unknown_db.stderr and unknown_db.stdout == ""


@pytest.mark.parametrize("command", ["workflow_runs", "start_workflow", "run_workflow_worker"])
def test_help_ends_with_the_exit_codes(subprocess_env: dict[str, str], command: str) -> None:
    result = manage(command, "--help", env=subprocess_env)
    assert result.returncode == 0, result.stderr
    epilog = result.stdout.split("exit codes:\n", 1)[1]
    shown = [line.split()[0] for line in epilog.splitlines() if line[2:3].strip()]
    assert shown == [row.shown for row in EXIT_CODES[command].rows]
    assert "2" in shown


def test_start_workflow_refuses_an_unknown_database_as_usage(
    subprocess_env: dict[str, str],
) -> None:
    result = manage("start_workflow", "build-preview", "--database", "nope", env=subprocess_env)
    assert result.returncode == USAGE_ERROR
    assert "Unknown database alias 'nope'" in result.stderr
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build-preview", "--input", "{not json"], "--input is not valid JSON"),
        (["build-preview", "--input", "[" * 100_000], "JSON"),
        (["no-such-workflow"], "No workflow named 'no-such-workflow'"),
    ],
    ids=["not-json", "too-deep", "unknown-workflow"],
)
def test_start_workflow_refuses_bad_input_on_stderr_exiting_non_zero(
    subprocess_env: dict[str, str], args: list[str], message: str
) -> None:
    result = manage("start_workflow", *args, env=subprocess_env)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("limit", ["99999999999999999999999", "10001", "0"])
def test_list_refuses_a_limit_out_of_bounds_as_usage(limit: str) -> None:
    with pytest.raises(CommandError, match="--limit"):
        call_command("workflow_runs", "list", "--limit", limit)


@pytest.mark.django_db
@pytest.mark.parametrize("days", ["nan", "inf", "1e400", "-1", "36501"])
def test_prune_refuses_a_non_finite_or_out_of_bounds_age_naming_it(days: str) -> None:
    with pytest.raises(CommandError, match="--older-than") as refused:
        call_command("workflow_runs", "prune", "--older-than", days)
    assert "convert float" not in str(refused.value)


@pytest.mark.django_db
@pytest.mark.parametrize("size", ["0", "10001", "1e3"])
def test_prune_refuses_a_batch_size_out_of_bounds_naming_it(size: str) -> None:
    with pytest.raises(CommandError, match="--batch-size"):
        call_command("workflow_runs", "prune", "--older-than", "1", "--batch-size", size)


def test_a_bad_value_is_bad_usage_as_a_process(subprocess_env: dict[str, str]) -> None:
    done = manage("workflow_runs", "prune", "--older-than", "nan", env=subprocess_env)
    assert done.returncode == USAGE_ERROR, done.stderr
    assert "--older-than" in done.stderr and "Traceback" not in done.stderr


def test_every_run_a_bulk_cancel_changes_is_in_the_admin_history_though_stdout_is_gone(
    subprocess_env: dict[str, str],
) -> None:
    """``workflow_runs cancel --tag …`` cancels each matching run and records each change in
    the admin's history (``LogEntry``): a reader that closed the command's stdout (``| head
    -0``, a dead pager) may cost the printed lines, never the history of changes made."""
    runs = [WorkflowRun.objects.start("build-preview", {}, tags={"batch": "b1"}) for _ in range(3)]
    child = subprocess.Popen(
        [*MANAGE_PY, "workflow_runs", "cancel", "--tag", "batch=b1"],
        cwd=ROOT,
        env={**subprocess_env, "PYTHONUNBUFFERED": "1"},  # as in a container's usual setup
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first line
    with child.stderr:
        child.stderr.read()
    child.wait(timeout=120)
    ids = [run.pk for run in runs]
    statuses = set(WorkflowRun.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == {RunStatus.CANCELLED}
    logged = LogEntry.objects.filter(object_id__in=[str(pk) for pk in ids])
    assert set(logged.values_list("object_id", flat=True)) == {str(pk) for pk in ids}
