"""Operators' tools on runs (DESIGN §5c "Operators"): tags and the search by tag or key,
operations on many runs, ``fork_run`` and a step's fenced progress."""

from __future__ import annotations

import json
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE as CHANGE_FLAG
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from django_leases.clock import db_now_plus
from django_leases.exceptions import (
    UnknownWorkflowError,
    WorkflowStepCancelledError,
    WorkflowStepSupersededError,
)
from django_leases.management.base import EXIT_WRONG_STATE
from django_leases.models import RunStatus, StepStatus, WorkflowRun, WorkflowRunTag, WorkflowStep
from django_leases.testing import drive
from django_leases.workflows import fork_run, send_event, start_workflow, step_function, workflow
from django_leases.workflows.engine import StepContext
from tests.helpers import (
    failed_run,
    lapse_step_lease,
    run_of,
    staff_client,
    start_blocked,
    tuned_sql,
)

pytestmark = pytest.mark.django_db

#: What the step functions below do: ``fail`` names steps that raise, ``version`` is "the
#: code deployed", ``calls`` records each call (step name).
BEHAVIOUR: dict[str, Any] = {"fail": set(), "version": 1, "calls": []}


@pytest.fixture(autouse=True)
def _fresh_behaviour() -> None:
    BEHAVIOUR.update(fail=set(), version=1, calls=[])


@step_function("tests.ops.record")
def record(data: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    BEHAVIOUR["calls"].append(ctx.step_name)
    ctx.set_progress({"step": ctx.step_name, "half": True})
    if ctx.step_name in BEHAVIOUR["fail"]:
        raise RuntimeError(f"{ctx.step_name} fails")
    return {"step": ctx.step_name, "version": BEHAVIOUR["version"], "data": data}


@step_function("tests.ops.apply-review")
def apply_review(data: dict[str, Any], ctx: StepContext) -> str:
    BEHAVIOUR["calls"].append(ctx.step_name)
    if BEHAVIOUR["version"] >= 2 and "approve" in data:  # the fix: read the old shape too
        return "approved" if data["approve"] else "rejected"
    return "approved" if data["approved"] else "rejected"  # KeyError on the wrong shape


@workflow("tests.ops.three")
def three(run: Any, input: Any) -> Any:
    a = run.step("a", "tests.ops.record", {"n": 1}, retries=0)
    b = run.step("b", "tests.ops.record", {"after": a["version"]}, retries=0)
    c = run.step("c", "tests.ops.record", {"after": b["version"]}, retries=0)
    return [a["version"], b["version"], c["version"]]


@workflow("tests.ops.retrying")
def retrying(run: Any, input: Any) -> Any:
    a = run.step("a", "tests.ops.record", {}, retries=0)
    b = run.step("b", "tests.ops.record", {}, retries=3, retry_delay=3600)
    return [a["version"], b["version"]]


@workflow("tests.ops.kid")
def kid(run: Any, input: Any) -> Any:
    return run.step("k", "tests.ops.record", input, retries=0)["version"]


@workflow("tests.ops.parent")
def parent(run: Any, input: Any) -> Any:
    a = run.step("a", "tests.ops.record", {}, retries=0)
    k = run.child("kid", "tests.ops.kid", {"from": "parent"})
    run.sleep("pause", 1)
    b = run.step("b", "tests.ops.record", {}, retries=0)
    return [a["version"], k, b["version"]]


@workflow("tests.ops.waiting-kid")
def waiting_kid(run: Any, input: Any) -> Any:
    return run.wait_for_event("go")


@workflow("tests.ops.waiting-parent")
def waiting_parent(run: Any, input: Any) -> Any:
    return run.child("kid", "tests.ops.waiting-kid", {})


@workflow("tests.ops.review")
def review(run: Any, input: Any) -> Any:
    event = run.wait_for_event("review")
    return run.step("apply", "tests.ops.apply-review", event, retries=0)


def _steps(run_id: uuid.UUID) -> dict[str, dict[str, Any]]:
    return {
        row["step_name"]: row
        for row in WorkflowStep.objects.filter(run_id=run_id).values(
            "step_name", "status", "result", "attempt"
        )
    }


# -- tags and search ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tags",
    [
        {f"t{i}": "x" for i in range(17)},
        {"": "x"},
        {"n" * 65: "x"},
        {"name": "v" * 256},
        {"name": 1},
        {1: "x"},
        {"name": "nul\x00"},
        ["team", "a"],
        [("team", "a")],
        {"a=b": "c"},
    ],
    ids=[
        "17 tags",
        "empty name",
        "long name",
        "long value",
        "int value",
        "int name",
        "NUL",
        "list",
        "pairs",
        "= in a name",
    ],
)
def test_bad_tags_are_refused_with_nothing_written(tags: Any) -> None:
    with pytest.raises(ValueError):
        start_workflow("tests.ops.three", {}, tags=tags)
    assert not WorkflowRun.objects.exists() and not WorkflowRunTag.objects.exists()


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "portable"])
def test_tags_are_stored_and_every_given_tag_must_match(tuned: bool) -> None:
    with tuned_sql(tuned):
        widest = {f"t{i}": "v" * 255 for i in range(15)} | {"n" * 64: ""}
        a = start_workflow("tests.ops.three", {}, tags={"team": "billing", "pr": "22"})
        b = start_workflow("tests.ops.three", {}, tags={"team": "billing", "pr": "23"})
        c = start_workflow("tests.ops.three", {}, tags=widest)
        untagged = start_workflow("tests.ops.three", {})
    assert run_of(a).tags == {"team": "billing", "pr": "22"}
    assert run_of(untagged).tags is None
    assert run_of(c).tags == widest
    runs = WorkflowRun.objects
    assert set(runs.tagged(team="billing").values_list("pk", flat=True)) == {a, b}
    assert list(runs.tagged(team="billing", pr="22").values_list("pk", flat=True)) == [a]
    assert not runs.tagged(team="billing", pr="24").exists()
    assert not runs.tagged(team="Billing").exists()  # values compare exactly
    assert list(runs.tagged(**{"n" * 64: ""}).values_list("pk", flat=True)) == [c]
    assert runs.tagged().count() == 4
    with pytest.raises(ValueError):
        runs.tagged(**{"x" * 65: "y"})


def test_a_keyed_start_that_finds_its_run_keeps_that_runs_tags() -> None:
    first = start_workflow("tests.ops.three", {}, key="owner/repo#22", tags={"team": "a"})
    again = start_workflow("tests.ops.three", {}, key="owner/repo#22", tags={"team": "b"})
    assert again == first and run_of(first).tags == {"team": "a"}
    assert not WorkflowRun.objects.tagged(team="b").exists()


def test_key_search_finds_a_key_and_its_prefix() -> None:
    pr22 = start_workflow("tests.ops.three", {}, key="owner/repo#22")
    pr23 = start_workflow("tests.ops.three", {}, key="owner/repo#23")
    start_workflow("tests.ops.three", {}, key="other/repo#22")
    runs = WorkflowRun.objects
    assert list(runs.key_starts_with("owner/repo#22").values_list("pk", flat=True)) == [pr22]
    assert set(runs.key_starts_with("owner/").values_list("pk", flat=True)) == {pr22, pr23}
    assert not runs.key_starts_with("%").exists()  # a LIKE wildcard is a character here
    assert not runs.key_starts_with("_wner").exists()
    assert not runs.key_starts_with("OWNER/").exists(), "the search is case-sensitive"
    assert not runs.key_starts_with("owner/Repo#").exists()


def _command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("workflow_runs", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_workflow_runs_list_filters_by_tags_and_key() -> None:
    a = start_workflow("tests.ops.three", {}, key="owner/repo#22", tags={"team": "a", "env": "x"})
    b = start_workflow("tests.ops.three", {}, tags={"team": "a"})
    out, _ = _command("list", "--tag", "team=a")
    assert str(a) in out and str(b) in out
    out, _ = _command("list", "--tag", "team=a", "--tag", "env=x")
    assert str(a) in out and str(b) not in out
    out, _ = _command("list", "--key", "owner/repo#22", "--format", "json")
    assert '"key": "owner/repo#22"' in out and str(b) not in out and '"team": "a"' in out
    out, _ = _command("list", "--tag", "team=b")
    assert out.strip() == "No workflow runs."
    with pytest.raises(CommandError):
        call_command("workflow_runs", "list", "--tag", "no-equals-sign")


def test_the_admin_list_searches_by_key_and_filters_by_tag(admin_client: Client) -> None:
    a = start_workflow("tests.ops.three", {}, key="owner/repo#22", tags={"team": "a"})
    b = start_workflow("tests.ops.three", {}, key="owner/repo#23", tags={"team": "b"})
    changelist = reverse("admin:django_leases_workflowrun_changelist")
    text = admin_client.get(changelist, {"q": "owner/repo#22"}).content.decode()
    assert str(a) in text and str(b) not in text
    text = admin_client.get(changelist, {"q": "owner/"}).content.decode()
    assert str(a) in text and str(b) in text
    text = admin_client.get(changelist, {"q": str(b)}).content.decode()
    assert str(a) not in text and str(b) in text
    text = admin_client.get(changelist, {"tag": "team=b"}).content.decode()
    assert str(a) not in text and str(b) in text
    assert "team=a" in text  # offered as a choice
    text = admin_client.get(changelist, {"tag": "nonsense"}).content.decode()
    assert str(a) not in text and str(b) not in text
    page = admin_client.get(reverse("admin:django_leases_workflowrun_change", args=[a]))
    assert "?tag=team%3Da" in page.content.decode()


# -- operations on many runs --------------------------------------------------------------------


def test_operate_each_changes_what_it_may_and_reports_the_rest() -> None:
    failed = failed_run("tests.ops.three", "a", "tests.ops.record")
    running = WorkflowRun.objects.start("tests.ops.three", {})
    done = WorkflowRun.objects.start("tests.ops.three", {})
    WorkflowRun.objects.complete(done.id, None)
    outcomes = WorkflowRun.objects.all().operate_each("resume")
    assert [o.run_id for o in outcomes] == [failed.pk, running.pk, done.pk]  # oldest first
    assert outcomes[0].change is not None and outcomes[0].change.after == RunStatus.RUNNING
    assert outcomes[1].change is None and "is running" in str(outcomes[1].refusal)
    assert outcomes[2].change is None and run_of(done.pk).status == RunStatus.COMPLETED
    with pytest.raises(ValueError):
        WorkflowRun.objects.all().operate_each("delete")


def test_retry_runs_every_failed_step_again() -> None:
    failed = failed_run("tests.ops.three", "a", "tests.ops.record")
    change = WorkflowRun.objects.retry(failed.pk)
    assert (change.before, change.after, change.steps) == ("failed", "running", ("a",))
    step = WorkflowStep.objects.get(run=failed, step_name="a")
    assert step.retries == 1 and step.available_at is not None  # one more attempt, due
    drive(failed.pk)
    assert run_of(failed.pk).status == RunStatus.COMPLETED
    fine = WorkflowRun.objects.start("tests.ops.three", {})
    with pytest.raises(Exception, match="no failed step"):
        WorkflowRun.objects.retry(fine.pk)


def test_resume_and_cancel_take_several_ids_or_filters() -> None:
    a = start_workflow("tests.ops.three", {}, tags={"batch": "1"})
    b = start_workflow("tests.ops.three", {}, tags={"batch": "1"})
    c = start_workflow("tests.ops.three", {}, tags={"batch": "2"})
    out, _ = _command("cancel", str(a), str(b))
    assert "2 run(s) changed." in out
    assert {run_of(a).status, run_of(b).status, run_of(c).status} == {"cancelled", "running"}
    assert LogEntry.objects.filter(object_id__in=[str(a), str(b)]).count() == 2
    with pytest.raises(CommandError) as refused:
        call_command(
            "workflow_runs", "cancel", "--tag", "batch=1", stdout=StringIO(), stderr=StringIO()
        )
    assert refused.value.returncode == EXIT_WRONG_STATE
    out, _ = _command("cancel", "--tag", "batch=2", "--workflow", "tests.ops.three")
    assert run_of(c).status == RunStatus.CANCELLED and "1 run(s) changed." in out
    out, _ = _command("resume", "--status", "failed")
    assert "No workflow runs matched" in out
    for wrong in ([str(a), "--tag", "batch=1"], [], [str(a), str(uuid.uuid4())]):
        with pytest.raises(CommandError):
            call_command("workflow_runs", "resume", *wrong, stdout=StringIO(), stderr=StringIO())


def test_a_child_cancelled_with_its_selected_parent_is_no_refusal() -> None:
    parent_id = start_workflow("tests.ops.waiting-parent", {})
    drive(parent_id)
    child = WorkflowRun.objects.get(parent_id=parent_id)
    assert child.status == RunStatus.RUNNING
    out, err = _command("cancel", "--status", "running")
    assert f"Run {child.pk}: cancelled with run {parent_id}" in out and err == ""
    assert "2 run(s) changed." in out
    assert run_of(child.pk).status == RunStatus.CANCELLED
    [outcome] = WorkflowRun.objects.filter(pk=child.pk).operate_each("cancel")
    assert outcome.refused and outcome.with_run is None  # alone, it is a refusal


def test_the_admin_retries_the_selected_runs_with_a_log_entry_each(admin_client: Client) -> None:
    first = failed_run("tests.ops.three", "a", "tests.ops.record")
    second = failed_run("tests.ops.three", "a", "tests.ops.record")
    done = WorkflowRun.objects.start("tests.ops.three", {})
    WorkflowRun.objects.complete(done.id, None)
    selected = [str(first.pk), str(second.pk), str(done.pk)]
    response = admin_client.post(
        reverse("admin:django_leases_workflowrun_changelist"),
        {"action": "retry_runs", "_selected_action": selected},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert sum("Failed → Running" in m for m in shown) == 2, shown
    assert any("Nothing changed" in m for m in shown)
    for run in (first, second):
        assert run_of(run.pk).status == RunStatus.RUNNING
        assert LogEntry.objects.filter(object_id=str(run.pk), action_flag=CHANGE_FLAG).count() == 1
    assert not LogEntry.objects.filter(object_id=str(done.pk)).exists()


def test_many_selected_runs_get_one_summary(admin_client: Client) -> None:
    ids = [start_workflow("tests.ops.three", {}) for _ in range(12)]
    response = admin_client.post(
        reverse("admin:django_leases_workflowrun_changelist"),
        {"action": "cancel_runs", "_selected_action": [str(i) for i in ids]},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("12 runs changed"), shown
    assert LogEntry.objects.filter(object_id__in=[str(i) for i in ids]).count() == 12


def test_bulk_actions_need_the_operate_permission() -> None:
    run_id = start_workflow("tests.ops.three", {})
    viewer = staff_client("view_workflowrun")
    changelist = reverse("admin:django_leases_workflowrun_changelist")
    assert "retry_runs" not in viewer.get(changelist).content.decode()
    viewer.post(changelist, {"action": "cancel_runs", "_selected_action": [str(run_id)]})
    assert run_of(run_id).status == RunStatus.RUNNING


# -- fork_run -----------------------------------------------------------------------------------


def _completed_three() -> uuid.UUID:
    run_id = start_workflow("tests.ops.three", {"order": 7}, tags={"team": "a"})
    assert drive(run_id).status == RunStatus.COMPLETED  # type: ignore[union-attr]
    BEHAVIOUR.update(calls=[], version=2)  # a new deploy
    return run_id


@pytest.mark.parametrize(
    ("from_step", "again", "output"),
    [("a", ["a", "b", "c"], [2, 2, 2]), ("b", ["b", "c"], [1, 2, 2]), ("c", ["c"], [1, 1, 2])],
    ids=["first", "middle", "last"],
)
def test_a_fork_keeps_what_came_before_the_step_and_runs_the_rest_with_todays_code(
    from_step: str, again: list[str], output: list[int]
) -> None:
    original = _completed_three()
    before = (run_of(original).output, _steps(original))
    fork = fork_run(original, from_step=from_step)
    forked = run_of(fork)
    assert forked.forked_from_id == original and forked.input == {"order": 7}
    assert forked.tags == {"team": "a"} and forked.status == RunStatus.RUNNING
    assert drive(fork).output == output  # type: ignore[union-attr]
    assert BEHAVIOUR["calls"] == again
    assert (run_of(original).output, _steps(original)) == before  # untouched


def test_a_fork_from_the_failed_step_runs_it_again_and_the_original_stays_failed() -> None:
    BEHAVIOUR["fail"] = {"b"}
    original = start_workflow("tests.ops.three", {})
    assert drive(original).status == RunStatus.FAILED  # type: ignore[union-attr]
    BEHAVIOUR.update(fail=set(), calls=[], version=2)
    fork = fork_run(original, from_step="b")
    assert drive(fork).output == [1, 2, 2]  # type: ignore[union-attr]
    assert BEHAVIOUR["calls"] == ["b", "c"]
    assert run_of(original).status == RunStatus.FAILED
    assert _steps(original)["b"]["status"] == StepStatus.FAILED


def test_a_fork_of_a_running_run_leaves_it_running() -> None:
    BEHAVIOUR["fail"] = {"b"}
    original = start_workflow("tests.ops.retrying", {})
    drive(original, skip_sleeps=False)  # b failed once; its retry is an hour away
    assert run_of(original).status == RunStatus.RUNNING
    BEHAVIOUR.update(fail=set(), calls=[], version=2)
    fork = fork_run(original, from_step="b")
    assert drive(fork, skip_sleeps=False).output == [1, 2]  # type: ignore[union-attr]
    assert BEHAVIOUR["calls"] == ["b"]
    assert run_of(original).status == RunStatus.RUNNING
    step = _steps(original)["b"]
    assert (step["status"], step["attempt"]) == (StepStatus.FAILED, 1)


def test_a_fork_after_a_child_reads_its_outcome_and_one_before_it_starts_a_new_child() -> None:
    original = start_workflow("tests.ops.parent", {})
    assert drive(original).output == [1, 1, 1]  # type: ignore[union-attr]
    children = WorkflowRun.objects.filter(workflow="tests.ops.kid")
    assert children.count() == 1
    BEHAVIOUR.update(calls=[], version=2)
    after = fork_run(original, from_step="b")
    assert drive(after).output == [1, 1, 2]  # type: ignore[union-attr]
    assert BEHAVIOUR["calls"] == ["b"] and children.count() == 1  # no new child
    BEHAVIOUR["calls"] = []
    before = fork_run(original, from_step="a")
    assert drive(before).output == [2, 2, 2]  # type: ignore[union-attr]
    assert BEHAVIOUR["calls"] == ["a", "k", "b"]
    assert children.count() == 2 and children.filter(parent_id=before).exists()


def test_a_consumed_event_of_the_wrong_shape_is_answered_by_a_fork() -> None:
    original = start_workflow("tests.ops.review", {})
    drive(original)
    send_event(original, "review", {"approve": True})  # the sender's old shape
    failed = drive(original)
    assert failed is not None and failed.status == RunStatus.FAILED
    assert _steps(original)["apply"]["status"] == StepStatus.FAILED
    assert "approved" in str(failed.error)  # KeyError 'approved'
    BEHAVIOUR["version"] = 2  # code that reads both shapes, deployed
    fork = fork_run(original, from_step="apply")
    assert drive(fork).output == "approved"  # type: ignore[union-attr]


def test_a_step_the_run_never_reached_is_refused_with_nothing_written() -> None:
    original = _completed_three()
    count = WorkflowRun.objects.count()
    with pytest.raises(ValueError, match="never reached"):
        fork_run(original, from_step="d")
    with pytest.raises(WorkflowRun.DoesNotExist):
        fork_run(uuid.uuid4(), from_step="a")
    with pytest.raises(ValueError):
        fork_run("not-a-uuid", from_step="a")
    assert WorkflowRun.objects.count() == count


def test_fork_needs_the_workflow_registered() -> None:
    run = WorkflowRun.objects.start("tests.ops.gone", {})
    WorkflowStep.objects.schedule(run.id, "a", "tests.ops.record")
    with pytest.raises(UnknownWorkflowError):
        fork_run(run.id, from_step="a")


def test_workflow_runs_fork_and_the_run_page_fork(admin_client: Client) -> None:
    original = _completed_three()
    out, _ = _command("fork", str(original), "--from-step", "c")
    fork = uuid.UUID(out.strip())
    assert run_of(fork).forked_from_id == original
    assert LogEntry.objects.filter(object_id=str(original)).exists()
    with pytest.raises(CommandError, match="never reached"):
        call_command("workflow_runs", "fork", str(original), "--from-step", "x", stdout=StringIO())
    page = admin_client.get(reverse("admin:django_leases_workflowrun_change", args=[original]))
    text = page.content.decode()
    assert 'id="fork-run"' in text and '<option value="b">' in text
    url = reverse("admin:django_leases_workflowrun_operate", args=[original, "fork"])
    response = admin_client.post(url, {"step": "b"})
    second = WorkflowRun.objects.filter(forked_from_id=original).exclude(pk=fork).get()
    assert response["Location"] == reverse(
        "admin:django_leases_workflowrun_change", args=[second.pk]
    )
    refused = admin_client.post(url, {"step": "nope"}, follow=True)
    assert any("Nothing forked" in str(m) for m in refused.context["messages"])


def test_the_admin_forks_the_selected_runs_from_their_failed_step(admin_client: Client) -> None:
    BEHAVIOUR["fail"] = {"b"}
    failed = [start_workflow("tests.ops.three", {}) for _ in range(2)]
    for run_id in failed:
        drive(run_id)
    BEHAVIOUR["fail"] = set()
    fine = _completed_three()  # then the fix is deployed (version 2)
    response = admin_client.post(
        reverse("admin:django_leases_workflowrun_changelist"),
        {"action": "fork_runs", "_selected_action": [str(i) for i in [*failed, fine]]},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert "2 runs forked." in shown and any("no failed step" in m for m in shown), shown
    for run_id in failed:
        fork = WorkflowRun.objects.get(forked_from_id=run_id)
        assert drive(fork.pk).output == [1, 2, 2]  # type: ignore[union-attr]
        assert LogEntry.objects.filter(object_id=str(run_id)).count() == 1
    assert not WorkflowRun.objects.filter(forked_from_id=fine).exists()


# -- progress -----------------------------------------------------------------------------------


def test_progress_is_kept_on_the_step_and_shown_on_the_run_page(admin_client: Client) -> None:
    run_id = start_workflow("tests.ops.three", {})
    drive(run_id)
    assert WorkflowStep.objects.get(run_id=run_id, step_name="b").progress == {
        "step": "b",
        "half": True,
    }
    page = admin_client.get(reverse("admin:django_leases_workflowrun_change", args=[run_id]))
    assert "&quot;half&quot;: true" in page.content.decode()


def test_a_superseded_attempts_progress_is_refused() -> None:
    run = WorkflowRun.objects.start("tests.ops.three", {})
    step = WorkflowStep.objects.schedule(run.id, "a", "tests.ops.record")
    first = WorkflowStep.objects.claim_for_execution(run.id, "a", "tests.ops.record", 60)
    assert first is not None
    WorkflowStep.objects.set_progress(step.pk, {"done": 1}, first.attempt)
    lapse_step_lease(step.pk)
    second = WorkflowStep.objects.claim_for_execution(run.id, "a", "tests.ops.record", 60)
    assert second is not None and second.attempt == 2
    stale = StepContext(first, threading.Event())
    with pytest.raises(WorkflowStepSupersededError):
        stale.set_progress({"done": 99})
    assert WorkflowStep.objects.get(pk=step.pk).progress == {"done": 1}
    StepContext(second, threading.Event()).set_progress({"done": 2})
    assert WorkflowStep.objects.get(pk=step.pk).progress == {"done": 2}
    with pytest.raises(ValueError):
        WorkflowStep.objects.set_progress(step.pk, {"bad": object()}, second.attempt)
    WorkflowRun.objects.cancel(run.id)
    with pytest.raises(WorkflowStepCancelledError):
        WorkflowStep.objects.set_progress(step.pk, {"done": 3}, second.attempt)
    assert WorkflowStep.objects.get(pk=step.pk).progress == {"done": 2}


def test_the_tag_and_key_searches_read_their_indexes() -> None:
    """PostgreSQL (sequential scans priced out, as with a million runs) reads
    ``dl_run_tag_lookup`` and ``dl_run_key``; MariaDB reads the tag index and may read the
    key index for a prefix (a tiny table is scanned whole, whatever the index)."""
    if connection.vendor == "sqlite":
        pytest.skip("PostgreSQL's and MariaDB's plans")
    for i in range(20):
        start_workflow(
            "tests.ops.three", {}, key=f"owner/repo-{i % 4}#{i}", tags={"team": f"t{i % 4}"}
        )
    searches = {
        "dl_run_tag_lookup": WorkflowRun.objects.tagged(team="t1"),
        "dl_run_key": WorkflowRun.objects.key_starts_with("owner/repo-1#"),
    }
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
        for index, search in searches.items():
            sql, params = search.query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            plan = cursor.fetchall()
            if connection.vendor == "postgresql":
                assert index in "\n".join(row[0] for row in plan), plan
            elif index == "dl_run_tag_lookup":
                assert any(row[5] == index for row in plan), plan  # the key read
            else:
                assert any(index in str(row[4]) for row in plan), plan  # possible keys


@pytest.mark.django_db(transaction=True)
def test_a_stale_progress_write_waiting_on_the_takeover_is_refused_once_it_commits() -> None:
    run = WorkflowRun.objects.start("tests.ops.three", {})
    step = WorkflowStep.objects.schedule(run.id, "a", "tests.ops.record")
    first = WorkflowStep.objects.claim_for_execution(run.id, "a", "tests.ops.record", 60)
    assert first is not None
    lapse_step_lease(step.pk)
    with transaction.atomic():
        second = WorkflowStep.objects.claim_for_execution(run.id, "a", "tests.ops.record", 60)
        assert second is not None and second.attempt == 2  # the step row locked until commit
        stale = start_blocked(
            lambda: WorkflowStep.objects.set_progress(step.pk, {"stale": True}, first.attempt)
        )
        if connection.vendor != "sqlite":
            assert stale.waited, "the stale write did not wait for the takeover"
    with pytest.raises(WorkflowStepSupersededError):
        stale.result()
    assert WorkflowStep.objects.get(pk=step.pk).progress is None


def test_workflow_runs_show_says_tags_fork_and_progress() -> None:
    original = _completed_three()
    fork = fork_run(original, from_step="c")
    drive(fork)
    out, _ = _command("show", str(fork))
    assert f"forked_from: {original}" in out and "tags: team=a" in out
    shown = json.loads(_command("show", str(fork), "--format", "json")[0])
    assert shown["tags"] == {"team": "a"} and shown["forked_from"] == str(original)
    assert shown["steps"][-1]["progress"] == {"step": "c", "half": True}


# -- forks keep the patch decisions, the queue key; only a registered workflow ------------------

#: The version of the code a test "deploys" for tests.ops.patched (1: before the patch).
deployed = {"version": 1}


@workflow("tests.ops.patched")
def patched_flow(run: Any, input: Any) -> Any:
    if deployed["version"] >= 2 and run.patched("extra"):
        run.step("extra-step", "tests.ops.record", {"n": 0})
    first = run.step("a", "tests.ops.record", {"n": 1})
    return [first, run.step("b", "tests.ops.record", {"n": 2})]


def test_a_fork_keeps_the_patch_decisions_made_before_its_step() -> None:
    """The original took the patched path: the fork replays the same path up to ``b``
    (``run.patched`` answers as it did), never a different one."""
    deployed["version"] = 2
    try:
        original = start_workflow("tests.ops.patched", {}, queue_key="tenant-7")
        drive(original)
        fork = fork_run(original, from_step="b")
        assert run_of(fork).queue_key == "tenant-7"
        decisions = WorkflowStep.objects.filter(run_id=fork, status=StepStatus.PATCH)
        assert list(decisions.values_list("step_name", "result")) == [("extra", True)]
        drive(fork)
        names = list(
            WorkflowStep.objects.filter(run_id=fork)
            .order_by("id")
            .values_list("step_name", "status")
        )
        assert names == [
            ("extra", StepStatus.PATCH),
            ("extra-step", StepStatus.SUCCEEDED),
            ("a", StepStatus.SUCCEEDED),
            ("b", StepStatus.SUCCEEDED),
        ]
        with pytest.raises(ValueError, match="patch decision"):
            fork_run(original, from_step="extra")
    finally:
        deployed["version"] = 1


def test_the_admin_forks_only_a_workflow_this_code_runs(admin_client: Client) -> None:
    run = WorkflowRun.objects.start("tests.ops.gone", {})
    WorkflowStep.objects.schedule(run.id, "a", "tests.ops.record")
    url = reverse("admin:django_leases_workflowrun_operate", args=[run.id, "fork"])
    refused = admin_client.post(url, {"step": "a"}, follow=True)
    assert any("Nothing forked" in str(m) for m in refused.context["messages"])
    assert not WorkflowRun.objects.filter(forked_from_id=run.id).exists()


def test_prune_keeps_the_child_a_live_fork_reads_as_its_own() -> None:
    """A fork keeps its original's child waits: pruning the finished original must not take
    the child the live fork will read when it replays."""
    original = start_workflow("tests.ops.parent", {})
    drive(original)
    child = WorkflowRun.objects.get(workflow="tests.ops.kid")
    fork = fork_run(original, from_step="b")  # live: not driven yet
    WorkflowRun.objects.filter(pk__in=[original, child.pk]).update(finished_at=db_now_plus(-60))
    WorkflowRun.objects.prune(1)
    assert not WorkflowRun.objects.filter(pk=original).exists()
    assert WorkflowRun.objects.filter(pk=child.pk).exists(), "the fork's child was pruned"
    assert drive(fork).status == RunStatus.COMPLETED  # type: ignore[union-attr]
