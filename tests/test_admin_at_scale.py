"""The operator admin with many rows: what a page or a message lists stays bounded (a run's
latest steps and attempts, the first child runs and forks, the first lease keys, then how
many more), a bulk action over more runs than it names one by one still accounts for every
run, and malformed input from a crafted or stale form is an answer, never a server error."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from django_leases.admin.display import LINKS_SHOWN
from django_leases.admin.workflows import ROWS_SHOWN
from django_leases.clock import db_now_plus
from django_leases.models import (
    Lease,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowRunTag,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows import workflow

pytestmark = pytest.mark.django_db

RUNS = "admin:django_leases_workflowrun_changelist"
RUN = "admin:django_leases_workflowrun_change"


@workflow("tests.admin-scale.flow")
def flow(run: Any, input: Any) -> Any:
    return None


def _runs(count: int, status: str, **fields: Any) -> list[uuid.UUID]:
    rows = [
        WorkflowRun(id=uuid.uuid4(), workflow="tests.admin-scale.flow", status=status, **fields)
        for _ in range(count)
    ]
    WorkflowRun.objects.bulk_create(rows, batch_size=500)
    return [row.id for row in rows]


def _action(client: Client, name: str, ids: list[Any], *, across: bool, query: str = "") -> Any:
    data = {"action": name, "index": 0, "select_across": "1" if across else "0"}
    data["_selected_action"] = [str(i) for i in ids]
    return client.post(reverse(RUNS) + query, data)


def _said(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.fixture
def quiet_admin(admin_user: Any) -> Client:
    """A superuser's client that answers a server error with a 500 instead of raising."""
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    return client


# -- bulk actions -------------------------------------------------------------------------------


def test_a_cancel_summary_counts_the_runs_cancelled_with_their_parent(admin_client: Client) -> None:
    """Past the runs named one by one, the summary says how many were cancelled along with
    a selected run (not changed by their own cancel, not refused), and each gets its own
    history entry."""
    [parent] = _runs(1, RunStatus.RUNNING)
    children = _runs(11, RunStatus.RUNNING, parent_id=parent)
    response = _action(admin_client, "cancel_runs", [parent], across=True)
    assert response.status_code == 302
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 12
    assert _said(response) == [
        "1 run changed (cancelled: 1).",
        "11 more runs were cancelled with runs they belong to.",
    ]
    logged = {entry.object_id for entry in LogEntry.objects.all()}
    assert logged == {str(run_id) for run_id in [parent, *children]}


@pytest.mark.parametrize("selected", ["nope", "", "\x00", "1" * 40])
@pytest.mark.parametrize("name", ["cancel_runs", "fork_runs", "resume_runs"])
def test_an_action_for_an_id_that_is_not_a_run_id_is_refused_with_a_message(
    quiet_admin: Client, selected: str, name: str
) -> None:
    """A stale or crafted form: Django's action would raise while selecting the rows."""
    _runs(3, RunStatus.RUNNING)
    response = _action(quiet_admin, name, [selected], across=False)
    assert response.status_code == 302
    assert _said(response) == [
        f"{selected[:64]!r} is not the id of a workflow run: nothing was done."
    ]
    assert not WorkflowRun.objects.exclude(status=RunStatus.RUNNING).exists()


def test_a_lease_action_for_an_id_that_is_not_a_lease_id_is_refused_with_a_message(
    quiet_admin: Client,
) -> None:
    url = reverse("admin:django_leases_lease_changelist")
    response = quiet_admin.post(
        url, {"action": "force_release", "index": 0, "_selected_action": ["nope"]}
    )
    assert response.status_code == 302
    assert "is not the id of a lease" in _said(response)[0]


def test_a_tag_filter_on_a_tag_named_self_lists_and_operates(quiet_admin: Client) -> None:
    """``self`` is a tag name like any other, in the list's filter and under "select
    all" (``tagged`` takes such a name in its mapping)."""
    ids = _runs(3, RunStatus.RUNNING, tags={"self": "x"})
    WorkflowRunTag.objects.bulk_create(
        [WorkflowRunTag(run_id=run_id, name="self", value="x") for run_id in ids[:2]]
    )
    assert set(WorkflowRun.objects.tagged({"self": "x"}).values_list("pk", flat=True)) == set(
        ids[:2]
    )
    response = quiet_admin.get(reverse(RUNS), {"tag": "self=x"})
    assert response.status_code == 200
    response = _action(quiet_admin, "cancel_runs", [ids[0]], across=True, query="?tag=self=x")
    assert response.status_code == 302
    assert WorkflowRun.objects.filter(status=RunStatus.CANCELLED).count() == 2


def test_force_releasing_many_leases_names_the_first_keys_and_counts_the_rest(
    admin_client: Client,
) -> None:
    count = LINKS_SHOWN + 40
    Lease.objects.bulk_create(
        [
            Lease(key=f"key-{i:03d}", holder="h", token=1, expires_at=db_now_plus(600))
            for i in range(count)
        ]
    )
    first = Lease.objects.order_by("pk").first()
    assert first is not None
    response = admin_client.post(
        reverse("admin:django_leases_lease_changelist"),
        {
            "action": "force_release",
            "index": 0,
            "select_across": "1",
            "_selected_action": [first.pk],
        },
    )
    assert response.status_code == 302
    [message] = _said(response)
    assert message.startswith(f"Force-released {count} leases: key-000, key-001, ")
    assert message.endswith(f"key-{LINKS_SHOWN - 1:03d} … and 40 more.")
    assert Lease.objects.filter(released_at__isnull=True).count() == 0


# -- a run's page ---------------------------------------------------------------------------------


def _run_with_steps(count: int) -> uuid.UUID:
    [run] = _runs(1, RunStatus.FAILED)
    WorkflowStep.objects.bulk_create(
        [
            WorkflowStep(
                run_id=run, step_name=f"s{i:04d}", function_name="m.f", status=StepStatus.FAILED
            )
            for i in range(count)
        ],
        batch_size=500,
    )
    steps = WorkflowStep.objects.filter(run_id=run).values_list("pk", flat=True)
    WorkflowStepAttempt.objects.bulk_create(
        [WorkflowStepAttempt(step_id=step, attempt=1, status="failed") for step in steps],
        batch_size=500,
    )
    return run


def test_a_run_page_shows_its_latest_steps_and_attempts_and_counts_the_rest(
    admin_client: Client,
) -> None:
    """The steps inline, the attempt history, the retry buttons and the fork form's names
    stop at the latest ``ROWS_SHOWN``; the page says how many earlier steps and attempts it
    leaves out. The fork form still takes any step's name."""
    more = 30
    run = _run_with_steps(ROWS_SHOWN + more)
    response = admin_client.get(reverse(RUN, args=[run]))
    assert response.status_code == 200
    text = response.content.decode()
    assert f"The {more} earlier steps are not shown." in text
    assert f"The {more} earlier attempts are not shown." in text
    last = f"s{ROWS_SHOWN + more - 1:04d}"
    assert "<p>s0000</p>" not in text and f"<p>{last}</p>" in text  # the inline
    assert ">s0000</td>" not in text and f">{last}</td>" in text  # the history
    assert 'value="s0000"' not in text and f'value="{last}"' in text  # the fork form
    assert text.count('name="retry-step"') == ROWS_SHOWN
    operate = reverse(RUN, args=[run]).replace("/change/", "/operate/fork/")
    response = admin_client.post(operate, {"step": "s0000"})
    assert response.status_code == 302, response.status_code
    fork = WorkflowRun.objects.filter(forked_from_id=run).first()
    assert fork is not None, _said(response)
    assert f"/workflowrun/{fork.pk}/change/" in response["Location"]


def test_a_run_page_with_few_steps_shows_them_all_without_a_note(admin_client: Client) -> None:
    run = _run_with_steps(5)
    text = admin_client.get(reverse(RUN, args=[run])).content.decode()
    assert "not shown" not in text
    assert all(f"s{i:04d}" in text for i in range(5))


def test_a_run_page_links_its_first_child_runs_and_counts_the_rest(admin_client: Client) -> None:
    [parent] = _runs(1, RunStatus.RUNNING)
    children = _runs(LINKS_SHOWN + 7, RunStatus.COMPLETED, parent_id=parent)
    text = admin_client.get(reverse(RUN, args=[parent])).content.decode()
    assert sum(1 for child in children if str(child) in text) == LINKS_SHOWN
    assert "… and 7 more" in text
