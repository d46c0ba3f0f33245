"""Sending events from outside code: ``manage.py workflow_runs send-event`` and the admin's
"Send event" form on a run's page (operators only), and the run page's list of waits."""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE as CHANGE_FLAG
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_leases.management.base import EXIT_WRONG_STATE
from django_leases.models import WorkflowRun, WorkflowWait
from django_leases.workflows.display import describe_wait
from django_leases.workflows.values import WaitKind, WaitStatus
from tests.helpers import staff_user

pytestmark = pytest.mark.django_db

CHANGE = "admin:django_leases_workflowrun_change"


def _run() -> WorkflowRun:
    """A running run that reached ``run.wait_for_event("approved")``."""
    run = WorkflowRun.objects.start("tests.waits.approval", {})
    WorkflowWait.objects.reach(run.id, "approved", WaitKind.EVENT, seconds=None)
    return run


def _command(*args: str) -> str:
    out = StringIO()
    call_command("workflow_runs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# -- the command -----------------------------------------------------------------------------


def test_send_event_delivers_the_payload_once() -> None:
    run = _run()
    out = _command("send-event", str(run.id), "approved", "--payload", '{"by": "ops"}')
    assert "Event 'approved' sent" in out
    wait = WorkflowWait.objects.get(run=run, name="approved")
    assert (wait.status, wait.payload) == (WaitStatus.DONE, {"by": "ops"})
    with pytest.raises(CommandError, match="already sent") as refused:
        _command("send-event", str(run.id), "approved", "--payload", "2")
    assert refused.value.returncode == EXIT_WRONG_STATE
    assert WorkflowWait.objects.get(run=run, name="approved").payload == {"by": "ops"}


def test_an_event_sent_from_the_command_line_is_in_the_admin_history() -> None:
    """As the admin's form logs it, and as resume, cancel and retry log theirs: an approval
    sent from a shell is an operator's change too. A refused one logs nothing."""
    run = _run()
    _command("send-event", str(run.id), "approved", "--payload", "true")
    (entry,) = LogEntry.objects.filter(object_id=str(run.id))
    assert entry.action_flag == CHANGE_FLAG
    assert "Sent event 'approved'" in entry.change_message
    assert "manage.py workflow_runs send-event" in entry.change_message
    with pytest.raises(CommandError):
        _command("send-event", str(run.id), "approved", "--payload", "true")
    assert LogEntry.objects.filter(object_id=str(run.id)).count() == 1


def test_send_event_refuses_bad_input_clearly_storing_nothing() -> None:
    run = _run()
    with pytest.raises(CommandError, match="not valid JSON"):
        _command("send-event", str(run.id), "approved", "--payload", "{nope")
    with pytest.raises(CommandError, match="nests too deeply"):  # nested past Python's recursion
        _command("send-event", str(run.id), "approved", "--payload", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(CommandError, match="No workflow run"):
        _command("send-event", str(uuid.uuid4()), "approved")
    with pytest.raises(CommandError, match="run id"):
        _command("send-event", "not-a-run", "approved")
    WorkflowRun.objects.fail(run.id, "boom")
    with pytest.raises(CommandError, match="failed") as finished:
        _command("send-event", str(run.id), "approved")
    assert finished.value.returncode == EXIT_WRONG_STATE
    assert WorkflowWait.objects.get(run=run, name="approved").status == WaitStatus.WAITING


def _limited(settings: Any, limit: int) -> None:
    """``DJANGO_LEASES["MAX_EVENT_PAYLOAD"] = limit`` (the suite's other keys kept)."""
    settings.DJANGO_LEASES = {**(settings.DJANGO_LEASES or {}), "MAX_EVENT_PAYLOAD": limit}


def test_send_event_refuses_a_payload_over_the_limit_storing_nothing(settings: Any) -> None:
    _limited(settings, 20)
    run = _run()
    before = WorkflowRun.objects.get(pk=run.pk).pass_requests
    with pytest.raises(CommandError, match="21 bytes of JSON, over the limit of 20 bytes"):
        _command("send-event", str(run.id), "approved", "--payload", '"' + "x" * 19 + '"')
    with pytest.raises(CommandError, match="MAX_EVENT_PAYLOAD"):  # also an early event
        _command("send-event", str(run.id), "later", "--payload", '"' + "x" * 19 + '"')
    assert WorkflowWait.objects.get(run=run, name="approved").status == WaitStatus.WAITING
    assert not WorkflowWait.objects.filter(run=run, name="later").exists()
    assert WorkflowRun.objects.get(pk=run.pk).pass_requests == before
    assert not LogEntry.objects.filter(object_id=str(run.id)).exists()
    _command("send-event", str(run.id), "approved", "--payload", '"' + "x" * 18 + '"')
    assert WorkflowWait.objects.get(run=run, name="approved").payload == "x" * 18


# -- the admin -------------------------------------------------------------------------------


def _send_url(run: WorkflowRun) -> str:
    return reverse("admin:django_leases_workflowrun_operate", args=[run.pk, "send-event"])


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_an_operator_sends_an_event_from_the_run_page(client: Client) -> None:
    client.force_login(staff_user("view_workflowrun", "operate_workflowrun"))
    run = _run()
    page = client.get(reverse(CHANGE, args=[run.pk])).content.decode()
    assert 'id="send-event"' in page and "waiting for event &#x27;approved&#x27;" in page
    response = client.post(
        _send_url(run), {"name": "approved", "payload": '{"ok": true}'}, follow=True
    )
    assert "Event 'approved' sent to run" in " ".join(_messages(response))
    assert WorkflowWait.objects.get(run=run, name="approved").payload == {"ok": True}
    logged = LogEntry.objects.filter(object_id=str(run.pk), action_flag=CHANGE_FLAG)
    assert list(logged.values_list("change_message", flat=True)) == ["Sent event 'approved'"]
    again = client.post(_send_url(run), {"name": "approved", "payload": "1"}, follow=True)
    assert "Nothing sent" in " ".join(_messages(again))
    assert "already sent" in " ".join(_messages(again))
    bad = client.post(_send_url(run), {"name": "other", "payload": "{"}, follow=True)
    assert "not JSON" in " ".join(_messages(bad))
    deep = "[" * 100_000 + "]" * 100_000  # past Python's recursion: still a message, no 500
    bad = client.post(_send_url(run), {"name": "other", "payload": deep}, follow=True)
    assert "not JSON" in " ".join(_messages(bad))
    assert not WorkflowWait.objects.filter(run=run, name="other").exists()


def test_the_form_refuses_a_payload_over_the_limit_storing_nothing(
    client: Client, settings: Any
) -> None:
    _limited(settings, 20)
    client.force_login(staff_user("view_workflowrun", "operate_workflowrun"))
    run = _run()
    payload = '{"by": "' + "é" * 6 + '"}'  # 21 bytes of UTF-8 (compact), 15 characters
    refused = client.post(_send_url(run), {"name": "approved", "payload": payload}, follow=True)
    said = " ".join(_messages(refused))
    assert "Nothing sent" in said and "21 bytes of JSON, over the limit of 20 bytes" in said
    assert WorkflowWait.objects.get(run=run, name="approved").status == WaitStatus.WAITING
    assert not LogEntry.objects.filter(object_id=str(run.pk)).exists()
    sent = client.post(_send_url(run), {"name": "approved", "payload": '{"by":"ééééé"}'})
    assert sent.status_code == 302
    assert WorkflowWait.objects.get(run=run, name="approved").payload == {"by": "ééééé"}


def test_without_the_operate_permission_there_is_no_form_and_a_post_is_403(
    client: Client,
) -> None:
    client.force_login(staff_user("view_workflowrun"))
    run = _run()
    page = client.get(reverse(CHANGE, args=[run.pk])).content.decode()
    assert 'id="send-event"' not in page
    assert client.post(_send_url(run), {"name": "approved"}).status_code == 403
    assert WorkflowWait.objects.get(run=run, name="approved").status == WaitStatus.WAITING


def test_a_finished_run_offers_no_send_event_form(client: Client) -> None:
    client.force_login(staff_user("view_workflowrun", "operate_workflowrun"))
    run = _run()
    WorkflowRun.objects.complete(run.id, None)
    page = client.get(reverse(CHANGE, args=[run.pk])).content.decode()
    assert 'id="send-event"' not in page


# -- what a run waits for: workflow_runs show and the run page -----------------------------------


def test_show_prints_status_steps_and_waits_as_text_and_json() -> None:
    import json as jsonlib

    from django_leases.models import WorkflowStep

    run = _run()
    WorkflowStep.objects.schedule_many(
        run.id, [("a", "tests.sub.echo", {}), ("b", "tests.sub.echo", {})]
    )
    WorkflowWait.objects.reach(run.id, "nap", WaitKind.SLEEP, seconds=60)
    text = _command("show", str(run.id))
    assert f"Run {run.id}  tests.waits.approval  running" in text
    assert "now waiting for event 'approved'" in text
    assert "now sleeping until" in text
    assert "now waiting for 2 parallel steps" in text
    assert "approved" in text and "nap" in text and "tests.sub.echo" in text
    shown = jsonlib.loads(_command("show", str(run.id), "--format", "json"))
    assert shown["id"] == str(run.id) and shown["status"] == "running"
    assert [w["name"] for w in shown["waits"]] == ["approved", "nap"]
    assert [s["name"] for s in shown["steps"]] == ["a", "b"]
    assert "waiting for event 'approved'" in shown["waiting_on"]
    with pytest.raises(CommandError, match="No workflow run"):
        _command("show", str(uuid.uuid4()))
    with pytest.raises(CommandError, match="run id"):
        _command("show", "nope")


def test_the_run_page_says_what_the_run_waits_for(admin_client: Client) -> None:
    run = _run()
    page = admin_client.get(reverse(CHANGE, args=[run.pk])).content.decode()
    assert "waiting on" in page.lower() and "waiting for event &#x27;approved&#x27;" in page


def test_the_run_page_shows_each_waits_times_in_the_sites_zone(admin_client: Client) -> None:
    """The waits table's reached / due / done times, like every other time in the admin
    (``local_time``): in the current time zone, localized — not raw UTC ``str()``."""
    from django.test import override_settings
    from django.utils import timezone

    from django_leases.admin.display import local_time

    run = _run()
    nap = WorkflowWait.objects.reach(run.id, "nap", WaitKind.SLEEP, seconds=3600)
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        page = admin_client.get(reverse(CHANGE, args=[run.pk])).content.decode()
        assert nap.due_at is not None and nap.reached_at is not None
        for when in (nap.due_at, nap.reached_at):
            assert local_time(when) in page
            assert timezone.localtime(when).isoformat() in page
    assert str(nap.due_at) not in page


def test_an_event_the_run_has_not_reached_says_it_is_kept(client: Client) -> None:
    """An event for a wait the run has not reached (early — or a typo'd name, which no wait
    will ever consume) is kept; the operator is told so, not that it was delivered."""
    run = _run()
    out = _command("send-event", str(run.id), "aproved", "--payload", "true")
    assert "kept until the run reaches wait 'aproved'" in out
    assert "waiting for event 'approved'" in out, "says what the run does wait for"
    reached = _command("send-event", str(run.id), "approved", "--payload", "true")
    assert "kept" not in reached and "Event 'approved' sent to run" in reached
    client.force_login(staff_user("view_workflowrun", "operate_workflowrun"))
    other = WorkflowRun.objects.start("tests.waits.approval", {})
    response = client.post(_send_url(other), {"name": "later", "payload": "1"}, follow=True)
    assert "kept until the run reaches wait 'later'" in " ".join(_messages(response))


def test_a_waits_time_is_said_in_the_sites_zone_with_its_name() -> None:
    from datetime import UTC, datetime

    from django.utils import timezone

    from django_leases.models import WorkflowWait
    from django_leases.workflows.values import WaitKind, WaitStatus

    wait = WorkflowWait(
        name="nap",
        kind=WaitKind.SLEEP,
        status=WaitStatus.WAITING,
        due_at=datetime(2026, 1, 15, 12, 0, tzinfo=UTC),
    )
    with timezone.override("Europe/Paris"):
        assert describe_wait(wait) == "sleeping until 2026-01-15 13:00:00 CET"
    with timezone.override("UTC"):
        assert describe_wait(wait) == "sleeping until 2026-01-15 12:00:00 UTC"
