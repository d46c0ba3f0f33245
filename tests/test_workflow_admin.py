"""The read-only admin of workflow runs: list with filters and search, run page with its steps
and the attempt history, no way to add, change or delete."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_leases.clock import db_now_plus
from django_leases.models import WorkflowRun, WorkflowStep

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
    history = text[text.index("Attempt history") :]
    assert history.count("<tr><td>checkout</td>") == 2, "one row per attempt"
    assert "<td>running</td>" in history and "<td>succeeded</td>" in history
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
    assert client.get(reverse(CHANGE, args=[runs["done"].id])).status_code == 200
