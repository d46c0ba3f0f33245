"""The admin of workflow runs: list with filters and search, run page with its steps and the
attempt history, no way to add, change or delete; resume, cancel and retry step for operators
only (a LogEntry and a message each)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE as CHANGE_FLAG
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_leases.clock import db_now_plus
from django_leases.models import WorkflowRun, WorkflowStep
from tests.helpers import failed_run, staff_user

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_leases_workflowrun_changelist"
CHANGE = "admin:django_leases_workflowrun_change"


@pytest.fixture
def runs() -> dict[str, WorkflowRun]:
    """A completed run whose step had a superseded attempt, and a failed run."""
    done = WorkflowRun.objects.start("build-preview", {"ref": "refs/heads/main"})
    WorkflowStep.objects.schedule(done.id, "checkout", "previews.checkout", {"ref": "x"})
    first = WorkflowStep.objects.claim_for_execution(done.id, "checkout", "previews.checkout", 60)
    assert first is not None
    WorkflowStep.objects.filter(pk=first.step_id).update(lease_expires_at=db_now_plus(-1))
    second = WorkflowStep.objects.claim_for_execution(done.id, "checkout", "previews.checkout", 60)
    assert second is not None
    WorkflowStep.objects.set_result(second.step_id, {"sha": "<abc>"}, second.attempt)
    WorkflowRun.objects.complete(done.id, {"preview": "https://previews.example.test/x/"})
    failed = WorkflowRun.objects.start("other-flow", {})
    WorkflowRun.objects.fail(failed.id, RuntimeError("boom"))
    return {"done": done, "failed": failed}


def test_the_run_list_filters_by_status_and_workflow(
    admin_client: Client, runs: dict[str, WorkflowRun]
) -> None:
    page = admin_client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    text = page.content.decode()
    assert str(runs["done"].id) in text and str(runs["failed"].id) in text
    only_failed = admin_client.get(reverse(CHANGELIST), {"status__exact": "failed"}).content
    assert str(runs["failed"].id).encode() in only_failed
    assert str(runs["done"].id).encode() not in only_failed
    by_workflow = admin_client.get(reverse(CHANGELIST), {"workflow": "build-preview"}).content
    assert str(runs["done"].id).encode() in by_workflow
    assert str(runs["failed"].id).encode() not in by_workflow


def test_search_by_run_id_is_exact_and_tolerates_anything_else(
    admin_client: Client, runs: dict[str, WorkflowRun]
) -> None:
    found = admin_client.get(reverse(CHANGELIST), {"q": str(runs["done"].id)})
    assert found.status_code == 200
    assert str(runs["done"].id).encode() in found.content
    assert str(runs["failed"].id).encode() not in found.content
    junk = admin_client.get(reverse(CHANGELIST), {"q": "'; drop table --"})
    assert junk.status_code == 200
    assert str(runs["done"].id).encode() not in junk.content


def test_the_run_page_shows_steps_and_every_attempt_escaped(
    admin_client: Client, runs: dict[str, WorkflowRun]
) -> None:
    page = admin_client.get(reverse(CHANGE, args=[runs["done"].id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "checkout" in text and "previews.checkout" in text
    assert "Attempt history" in text
    history = text[text.index('id="attempt-history"') :]
    history = history[: history.index("</table>")]
    cells = [
        re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[:3]
        for row in re.findall(r"<tr class=\"dl-attempt.*?</tr>", history, re.S)
    ]
    # One row per attempt; the first, replaced by attempt 2, says so (its row says running).
    assert cells == [["checkout", "1", "Superseded"], ["checkout", "2", "Succeeded"]]
    assert 'class="dl-time"' in history
    assert "&lt;abc&gt;" in text and "<abc>" not in text
    assert "https://previews.example.test/x/" in text


def test_the_admin_is_read_only(admin_client: Client, runs: dict[str, WorkflowRun]) -> None:
    run = runs["done"]
    assert admin_client.get(reverse("admin:django_leases_workflowrun_add")).status_code == 403
    response = admin_client.post(reverse(CHANGE, args=[run.id]), {"status": "failed"})
    assert response.status_code == 403
    delete = reverse("admin:django_leases_workflowrun_delete", args=[run.id])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    run.refresh_from_db()
    assert run.status == "completed"
    page = admin_client.get(reverse(CHANGE, args=[uuid.uuid4()]))
    assert page.status_code == 302  # an unknown run: back to the list with a message


def test_staff_without_the_view_permission_sees_nothing(
    client: Client, runs: dict[str, WorkflowRun]
) -> None:
    user = User.objects.create_user("ops", password="x", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(CHANGELIST)).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client.force_login(User.objects.get(pk=user.pk))
    assert client.get(reverse(CHANGELIST)).status_code == 200
    page = client.get(reverse(CHANGE, args=[runs["done"].id]))
    assert page.status_code == 200
    # The run's permission is enough to see its steps (no view_workflowstep needed).
    assert "previews.checkout" in page.content.decode()


# -- operators: resume, cancel, retry step -------------------------------------------------------


@pytest.fixture
def operator(client: Client) -> User:
    user = staff_user("view_workflowrun", "operate_workflowrun")
    client.force_login(user)
    return user


def _failed_build() -> WorkflowRun:
    """A failed run whose step ``build`` failed on its last attempt."""
    return failed_run("build-preview", "build", "previews.build", "compiler crashed")


def _operate_url(run: WorkflowRun, operation: str) -> str:
    return reverse("admin:django_leases_workflowrun_operate", args=[run.pk, operation])


def _logged(run: WorkflowRun) -> list[str]:
    return list(
        LogEntry.objects.filter(object_id=str(run.pk), action_flag=CHANGE_FLAG)
        .order_by("id")
        .values_list("change_message", flat=True)
    )


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_list_actions_resume_and_cancel_log_and_report_each_run(
    client: Client, operator: User
) -> None:
    failed = _failed_build()
    running = WorkflowRun.objects.start("build-preview", {})
    done = WorkflowRun.objects.start("build-preview", {})
    WorkflowRun.objects.complete(done.id, None)
    listing = client.get(reverse(CHANGELIST)).content.decode()
    assert 'value="resume_runs"' in listing and 'value="cancel_runs"' in listing
    assert "delete_selected" not in listing
    response = client.post(
        reverse(CHANGELIST),
        {"action": "resume_runs", "_selected_action": [str(failed.pk), str(done.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    shown = _messages(response)
    assert any("Failed → Running" in m and "'build'" in m for m in shown), shown
    assert any(m.startswith("Nothing changed") and "is completed" in m for m in shown), shown
    assert WorkflowRun.objects.get(pk=failed.pk).status == "running"
    assert WorkflowRun.objects.get(pk=done.pk).status == "completed"
    [logged] = _logged(failed)
    assert "failed → running" in logged
    assert _logged(done) == []
    response = client.post(
        reverse(CHANGELIST),
        {"action": "cancel_runs", "_selected_action": [str(running.pk)]},
        follow=True,
    )
    assert any("Running → Cancelled" in m for m in _messages(response))
    assert WorkflowRun.objects.get(pk=running.pk).status == "cancelled"
    entry = LogEntry.objects.get(object_id=str(running.pk))
    assert entry.user_id == operator.pk and "cancelled" in entry.change_message


def test_the_run_page_offers_an_operator_the_operations_its_state_allows(
    client: Client, operator: User
) -> None:
    failed = _failed_build()
    text = client.get(reverse(CHANGE, args=[failed.pk])).content.decode()
    section = text[text.index('id="workflow-operations"') :]
    assert "Resume run" in section and "Retry step build" in section
    assert "Cancel run" not in section, "a failed run cannot be cancelled"
    assert section.count("csrfmiddlewaretoken") == 3  # resume, retry step, fork
    assert f'action="{_operate_url(failed, "retry-step")}"' in section
    done = WorkflowRun.objects.start("build-preview", {})
    WorkflowRun.objects.complete(done.id, None)
    text = client.get(reverse(CHANGE, args=[done.pk])).content.decode()
    assert "Nothing to do: this run is completed" in text
    assert "Resume run" not in text and "Cancel run" not in text


def test_retry_step_from_the_run_page_resumes_the_run_and_logs_it(
    client: Client, operator: User
) -> None:
    failed = _failed_build()
    response = client.post(_operate_url(failed, "retry-step"), {"step": "build"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse(CHANGE, args=[failed.pk])
    assert any("Failed → Running" in m for m in _messages(response))
    assert WorkflowRun.objects.get(pk=failed.pk).status == "running"
    again = WorkflowStep.objects.claim_due(60)
    assert again is not None and (again.step_name, again.attempt) == ("build", 2)
    assert len(_logged(failed)) == 1
    wrong = client.post(_operate_url(failed, "retry-step"), {"step": "nope"}, follow=True)
    assert any("no step named 'nope'" in m for m in _messages(wrong))
    assert len(_logged(failed)) == 1, "a refused operation was logged"


def test_operations_need_post_and_the_csrf_token(operator: User) -> None:
    run = WorkflowRun.objects.start("build-preview", {})
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.get(_operate_url(run, "cancel")).status_code == 405
    assert strict.post(_operate_url(run, "cancel")).status_code == 403
    assert WorkflowRun.objects.get(pk=run.pk).status == "running"
    page = strict.get(reverse(CHANGE, args=[run.pk]))
    token = page.cookies["csrftoken"].value
    done = strict.post(_operate_url(run, "cancel"), {"csrfmiddlewaretoken": token})
    assert done.status_code == 302
    assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"


def test_staff_without_the_operate_permission_can_do_none_of_it(client: Client) -> None:
    client.force_login(staff_user("view_workflowrun"))
    failed = _failed_build()
    running = WorkflowRun.objects.start("build-preview", {})
    page = client.get(reverse(CHANGE, args=[failed.pk])).content.decode()
    assert "workflow-operations" not in page and "Retry step" not in page
    listing = client.get(reverse(CHANGELIST)).content.decode()
    assert "resume_runs" not in listing and "cancel_runs" not in listing
    for run, operation, data in (
        (failed, "resume", {}),
        (running, "cancel", {}),
        (failed, "retry-step", {"step": "build"}),
    ):
        assert client.post(_operate_url(run, operation), data).status_code == 403
    for action, run in (("resume_runs", failed), ("cancel_runs", running)):
        client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [str(run.pk)]})
    assert WorkflowRun.objects.get(pk=failed.pk).status == "failed"
    assert WorkflowRun.objects.get(pk=running.pk).status == "running"
    assert not LogEntry.objects.exists()


def test_unknown_runs_and_operations_are_refused(client: Client, operator: User) -> None:
    run = WorkflowRun.objects.start("build-preview", {})
    missing = client.post(_operate_url(run, "resume").replace(str(run.pk), str(uuid.uuid4())))
    assert missing.status_code == 302
    assert missing.url == reverse(CHANGELIST)
    assert client.post(_operate_url(run, "delete")).status_code == 403
    assert client.post(_operate_url(run, "resume").replace(str(run.pk), "junk")).status_code == 302
    assert WorkflowRun.objects.get(pk=run.pk).status == "running"
