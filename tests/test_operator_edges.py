"""The operator surface (the run admin and the commands) at its edges: an operation on a run
a prune deletes meanwhile, a backfill window at the edge of the calendar, a crafted list
filter, a bulk action that leaves runs alone. Each is a message or a clear error with
nothing written — never a 500 or a traceback — and every run left alone is named."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse

from django_leases.models import WorkflowRun, WorkflowSchedule, WorkflowStep
from django_leases.workflows import registry
from tests.helpers import failed_run, staff_client, start_blocked

CHANGELIST = "admin:django_leases_workflowrun_changelist"
#: A workflow tests/workapp registers (a fork needs the workflow in this code).
REGISTERED = "tests.sub.two-steps"


def _operate_url(run_id: Any, operation: str) -> str:
    return reverse("admin:django_leases_workflowrun_operate", args=[run_id, operation])


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def _pruned_meanwhile(call: Any) -> Any:
    """Run ``call`` on another thread while this thread's transaction has pruned every
    finished run (``workflow_runs prune --older-than 0``, or the PRUNE schedule, on another
    worker) but not committed yet: ``call`` reads the run as it was, then waits on the
    prune's locks; the prune commits; ``call`` goes on with the run gone. Its result."""
    if connection.vendor == "sqlite":
        pytest.skip("needs a backend that shows lock waits (PostgreSQL, MariaDB)")
    with transaction.atomic():
        assert WorkflowRun.objects.prune(0) == 1
        blocked = start_blocked(call)
        assert blocked.waited, "the operation did not wait for the prune"
    return blocked.result()


# -- 1. an operation on a run that a prune removed meanwhile is a 500 --------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("operation", "data"), [("resume", {}), ("retry-step", {"step": "first"})])
def test_an_operation_on_a_run_pruned_meanwhile_is_a_message_not_a_500(
    operation: str, data: dict[str, str]
) -> None:
    client = staff_client("view_workflowrun", "operate_workflowrun", raise_request_exception=False)
    run = failed_run(REGISTERED, "first", "tests.sub.echo", "boom")
    response = _pruned_meanwhile(lambda: client.post(_operate_url(run.pk, operation), data))
    # The store raises WorkflowRun.DoesNotExist (documented): a message, as for an unknown id.
    assert response.status_code == 302, f"{operation}: {response.status_code}"


# -- 2. a fork of a run that a prune removed meanwhile: IntegrityError, a traceback ------------


@pytest.mark.django_db(transaction=True)
def test_workflow_runs_fork_of_a_run_pruned_meanwhile_is_an_error_not_a_traceback() -> None:
    run = failed_run(REGISTERED, "first", "tests.sub.echo", "boom")

    def fork() -> Any:
        try:
            call_command(
                "workflow_runs", "fork", str(run.pk), "--from-step", "first",
                stdout=StringIO(), stderr=StringIO(),
            )  # fmt: skip
        except CommandError as exc:
            return exc
        return None

    # fork() locks the original: it waits for the prune's delete, then finds no run
    # (WorkflowRun.DoesNotExist, as documented), never an IntegrityError of its insert.
    outcome = _pruned_meanwhile(fork)
    assert isinstance(outcome, CommandError)
    assert "No workflow run" in str(outcome)
    assert not WorkflowRun.objects.exists(), "a fork of the pruned run was left behind"


@pytest.mark.django_db(transaction=True)
def test_the_admin_fork_of_a_run_pruned_meanwhile_is_a_message_not_a_500() -> None:
    client = staff_client("view_workflowrun", "operate_workflowrun", raise_request_exception=False)
    run = failed_run(REGISTERED, "first", "tests.sub.echo", "boom")
    response = _pruned_meanwhile(
        lambda: client.post(_operate_url(run.pk, "fork"), {"step": "first"})
    )
    assert response.status_code == 302, response.status_code


# -- 3. backfill of a window near year 1: OverflowError, a traceback ---------------------------


@pytest.fixture
def nightly() -> Iterator[str]:
    """Schedule ``nightly`` (``0 3 * * *``, UTC) of a registered no-op workflow."""
    registry._workflows["tests.operator-edges.noop"] = lambda run, input: input
    entry = {"workflow": "tests.operator-edges.noop", "cron": "0 3 * * *", "timezone": "UTC"}
    try:
        with override_settings(DJANGO_LEASES={"SCHEDULES": {"nightly": entry}}):
            yield "nightly"
    finally:
        registry._workflows.pop("tests.operator-edges.noop", None)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("0001-01-01T00:00:00+01:00", "0001-01-05"),  # a typo'd year, with an offset
        ("0001-01-01", "0001-01-05T00:00:00+01:00"),
    ],
)
def test_backfill_of_a_window_at_year_one_is_a_clear_error(
    nightly: str, start: str, end: str
) -> None:
    err = StringIO()
    # The window in UTC falls before year 1: a ValueError (as documented), not OverflowError.
    with pytest.raises(CommandError):
        call_command(
            "workflow_schedules", "backfill", nightly, "--start", start, "--end", end,
            stdout=StringIO(), stderr=err,
        )  # fmt: skip
    assert not WorkflowRun.objects.exists()


# -- 4. a NUL character in a list filter's value: a 500 on PostgreSQL --------------------------


@pytest.mark.django_db
@pytest.mark.postgres_only
@pytest.mark.parametrize(
    "query",
    [
        {"queue": "\x00"},  # RunQueueFilter, django-leases' own
        {"workflow": "\x00"},
        {"status__exact": "\x00"},
    ],
)
def test_a_nul_in_a_run_list_filter_is_not_a_500(query: dict[str, str]) -> None:
    client = staff_client("view_workflowrun", raise_request_exception=False)
    run = WorkflowRun.objects.start(REGISTERED, {})
    WorkflowStep.objects.schedule(run.id, "first", "tests.sub.echo", {})  # a queue to offer
    # ?queue=%00 in a URL: PostgreSQL would refuse the NUL in the query (DataError).
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code in (200, 302, 400), response.status_code


@pytest.mark.django_db
@pytest.mark.postgres_only
def test_a_nul_in_a_schedule_list_filter_is_not_a_500() -> None:
    client = staff_client("view_workflowschedule", raise_request_exception=False)
    WorkflowSchedule.objects.create(
        name="s", workflow="w", cron="* * * * *", timezone="UTC", declared=False
    )
    url = reverse("admin:django_leases_workflowschedule_changelist")
    for query in ({"overlap__exact": "\x00"}, {"workflow": "\x00"}):
        response = client.get(url, query)
        assert response.status_code in (200, 302, 400), (query, response.status_code)


# -- 5. "Fork the selected runs from their failed step": refusals cut off silently -------------


@pytest.mark.django_db
def test_forking_selected_runs_names_every_run_left_alone() -> None:
    client = staff_client("view_workflowrun", "operate_workflowrun")
    forked = failed_run(REGISTERED, "first", "tests.sub.echo", "boom")
    left_alone = []
    for _ in range(7):
        run = WorkflowRun.objects.start(REGISTERED, {})
        WorkflowRun.objects.complete(run.id, None)
        left_alone.append(run)
    selected = [str(forked.pk), *(str(run.pk) for run in left_alone)]
    response = client.post(
        reverse(CHANGELIST), {"action": "fork_runs", "_selected_action": selected}, follow=True
    )
    shown = _messages(response)
    assert any("1 run forked" in m for m in shown), shown
    # Docs (howto/operators.md): "a run without a failed step is named in the message and
    # left alone": 8 runs selected (up to MESSAGES_PER_RUN, a message each), 7 left alone.
    text = " ".join(shown)
    unnamed = [str(run.pk) for run in left_alone if str(run.pk) not in text]
    assert unnamed == [], f"runs left alone but not named: {unnamed}; messages: {shown}"
    assert not any(m.startswith("Nothing forked") for m in shown), shown


@pytest.mark.django_db
def test_an_operation_on_an_id_of_5000_characters_says_so_in_a_short_message() -> None:
    """An unknown id is named in the message, cut to its first 100 characters: a crafted
    URL does not fill the operator's page (or the session's message store)."""
    client = staff_client("view_workflowrun", "operate_workflowrun")
    response = client.post(_operate_url("x" * 5000, "resume"), follow=True)
    (said,) = _messages(response)
    assert "x" * 100 + "…" in said and len(said) < 200, said
