"""Changes made from the command line appear in the admin's history: one ``LogEntry`` per
change, as the system user ``django-leases`` (inactive, no usable password), saying which
command made it; refused changes write nothing; the admin's own entries are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_leases.admin.history import SYSTEM_USERNAME, system_user
from django_leases.models import Lease, TriggerSource, WorkflowRun
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import credentials, lifecycle
from tests.helpers import failed_run, fake_sources, make_orphan

pytestmark = pytest.mark.django_db(transaction=True)


def _call(*args: str, stdin: Any = None) -> str:
    out = StringIO()
    options: dict[str, Any] = {"stdout": out, "stderr": StringIO()}
    if stdin is not None:
        options["stdin"] = stdin
    call_command(*args, **options)
    return out.getvalue()


def _entries(obj: Any) -> list[LogEntry]:
    return list(LogEntry.objects.filter(object_id=str(obj.pk)).order_by("id"))


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with fake_sources("cli-pushes", "cli-gone") as provider:
        lifecycle.reconcile(base_url="https://app.example.com")
        make_orphan("cli-gone")
        yield provider


def test_run_operations_from_the_command_line_are_in_the_history() -> None:
    run = failed_run("build-preview", "build", "previews.build", "compiler crashed")
    _call("workflow_runs", "retry", str(run.pk), "build")
    _call("workflow_runs", "cancel", str(run.pk))
    first, second = _entries(run)
    user = User.objects.get(username=SYSTEM_USERNAME)
    assert first.user_id == second.user_id == user.pk
    assert not user.is_active and not user.has_usable_password()
    assert first.action_flag == CHANGE and "failed → running" in first.change_message
    assert "from the command line (manage.py workflow_runs retry, OS user" in (first.change_message)
    assert "running → cancelled" in second.change_message
    assert "manage.py workflow_runs cancel" in second.change_message
    assert first.content_type.model_class() is WorkflowRun
    # A refused operation changes nothing and logs nothing.
    with pytest.raises(CommandError):
        _call("workflow_runs", "resume", str(run.pk))
    assert len(_entries(run)) == 2


def test_trigger_source_operations_from_the_command_line_are_in_the_history(
    fake: FakeProvider,
) -> None:
    source = TriggerSource.objects.get(name="cli-pushes")
    _call("trigger_sources", "enable", "cli-pushes")
    _call("trigger_sources", "disable", "cli-pushes")
    _call("trigger_sources", "set-secret", "cli-pushes", stdin=StringIO("a-hand-made-secret-1\n"))
    enabled, disabled, secret = _entries(source)
    assert enabled.change_message.startswith("Enabled the trigger source; status registered; ")
    assert "manage.py trigger_sources enable" in enabled.change_message
    assert disabled.change_message.startswith("Disabled the trigger source; status ")
    assert secret.change_message.startswith("Stored a new signing secret; ")
    assert "a-hand-made-secret-1" not in secret.change_message
    assert credentials.get_secret("cli-pushes") == "a-hand-made-secret-1"
    orphan = TriggerSource.objects.get(name="cli-gone")
    _call("trigger_sources", "forget", "cli-gone")
    [forgotten] = _entries(orphan)
    assert forgotten.action_flag == DELETION and forgotten.object_repr
    assert "Forgot the trigger source" in forgotten.change_message
    users = set(LogEntry.objects.values_list("user__username", flat=True))
    assert users == {SYSTEM_USERNAME}


def test_a_lease_released_from_the_command_line_is_in_the_history() -> None:
    lease = Lease.objects.acquire("cli:nightly", "host-a:1:aa", 300)
    assert lease is not None
    _call("leases", "release", "cli:nightly")
    [entry] = _entries(lease)
    assert entry.change_message.startswith("Force-released (token 1, held by host-a:1:aa); ")
    assert "manage.py leases release" in entry.change_message
    with pytest.raises(CommandError):
        _call("leases", "release", "cli:nightly")  # not live any more: nothing to log
    assert len(_entries(lease)) == 1


def test_the_history_shows_command_line_changes_beside_the_operators(
    admin_client: Client,
) -> None:
    run = WorkflowRun.objects.start("build-preview", {})
    _call("workflow_runs", "cancel", str(run.pk))
    page = admin_client.get(reverse("admin:django_leases_workflowrun_history", args=[run.pk]))
    html = page.content.decode()
    assert SYSTEM_USERNAME in html and "manage.py workflow_runs cancel" in html


def test_the_system_user_is_created_once_and_cannot_sign_in(client: Client) -> None:
    first = system_user()
    assert system_user().pk == first.pk
    assert User.objects.filter(username=SYSTEM_USERNAME).count() == 1
    assert not client.login(username=SYSTEM_USERNAME, password="")


def test_without_the_system_user_the_change_stands_and_stderr_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_leases.admin import history

    def refuse(using: str | None = None) -> Any:
        raise ValueError("this user model needs a date of birth")

    monkeypatch.setattr(history, "system_user", refuse)
    run = WorkflowRun.objects.start("build-preview", {})
    err = StringIO()
    call_command("workflow_runs", "cancel", str(run.pk), stdout=StringIO(), stderr=err)
    assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
    assert "could not be recorded in the admin's history" in err.getvalue()
    assert not LogEntry.objects.exists()
