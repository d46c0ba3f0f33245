"""The trigger-source admin through Django's test client: lists, enable/disable, orphans."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_leases.models import TriggerSource
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration

pytestmark = pytest.mark.django_db

SOURCES = "admin:django_leases_triggersource_changelist"
ORPHANS = "admin:django_leases_orphantriggersource_changelist"


def _declared(name: str) -> TriggerDeclaration:
    return TriggerDeclaration(
        name=name,
        provider="github",
        config={"repository": "o/r"},
        events={"push": StartWorkflow("w")},
    )


@pytest.fixture
def sources() -> None:
    TriggerSource.objects.sync([_declared("pushes"), _declared("releases"), _declared("gone")])
    TriggerSource.objects.record("pushes", status="manual", detail="Register the URL by hand")
    TriggerSource.objects.sync([_declared("pushes"), _declared("releases")])  # "gone" → orphan


def _staff(*codenames: str) -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_leases", codename=codename)
        )
    return User.objects.get(pk=user.pk)


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _names(response: Any) -> list[str]:
    return [row.name for row in response.context["cl"].result_list]


def _pk(name: str) -> int:
    return TriggerSource.objects.get(name=name).pk


def _enabled() -> dict[str, bool]:
    return dict(TriggerSource.objects.values_list("name", "enabled"))


def test_declared_sources_are_listed_and_orphans_apart(admin_client: Client, sources: None) -> None:
    response = admin_client.get(reverse(SOURCES))
    assert response.status_code == 200
    assert _names(response) == ["pushes", "releases"]
    html = response.content.decode()
    assert "Register the URL by hand" in html and "github" in html

    orphans = admin_client.get(reverse(ORPHANS))
    assert orphans.status_code == 200
    assert _names(orphans) == ["gone"]
    # The orphans list is read-only for now: no action at all.
    assert orphans.context["action_form"] is None or not [
        name for name, _ in orphans.context["action_form"].fields["action"].choices if name
    ]
    assert (
        admin_client.get(reverse("admin:django_leases_orphantriggersource_add")).status_code == 403
    )


def test_superuser_enables_and_disables(admin_client: Client, sources: None) -> None:
    response = admin_client.post(
        reverse(SOURCES),
        {"action": "enable_sources", "_selected_action": [_pk("pushes"), _pk("releases")]},
        follow=True,
    )
    assert _enabled() == {"pushes": True, "releases": True, "gone": False}
    messages = [str(message) for message in response.context["messages"]]
    assert any("Enabled 2 trigger source(s): pushes, releases" in text for text in messages)
    entries = list(LogEntry.objects.order_by("object_repr"))
    assert [(entry.object_repr, entry.action_flag) for entry in entries] == [
        ("pushes", CHANGE),
        ("releases", CHANGE),
    ]
    assert entries[0].change_message == "Enabled the trigger source"

    # Enabling again changes nothing and logs nothing.
    response = admin_client.post(
        reverse(SOURCES),
        {"action": "enable_sources", "_selected_action": [_pk("pushes")]},
        follow=True,
    )
    assert any("Already enabled" in str(message) for message in response.context["messages"])
    assert LogEntry.objects.count() == 2

    admin_client.post(
        reverse(SOURCES), {"action": "disable_sources", "_selected_action": [_pk("pushes")]}
    )
    assert _enabled() == {"pushes": False, "releases": True, "gone": False}
    assert LogEntry.objects.filter(change_message="Disabled the trigger source").count() == 1


def test_the_lists_are_read_only(admin_client: Client, sources: None) -> None:
    assert admin_client.get(reverse("admin:django_leases_triggersource_add")).status_code == 403
    pk = _pk("pushes")
    admin_client.post(
        reverse("admin:django_leases_triggersource_change", args=[pk]),
        {"name": "renamed", "enabled": "on"},
    )
    row = TriggerSource.objects.get(pk=pk)
    assert (row.name, row.enabled) == ("pushes", False)
    delete = reverse("admin:django_leases_triggersource_delete", args=[pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert TriggerSource.objects.count() == 3


def test_staff_without_the_permission_cannot_toggle(sources: None) -> None:
    client = _client(_staff("view_triggersource", "view_orphantriggersource"))
    response = client.get(reverse(SOURCES))
    assert response.status_code == 200
    assert _names(response) == ["pushes", "releases"]
    assert b"Enable the selected" not in response.content
    client.post(reverse(SOURCES), {"action": "enable_sources", "_selected_action": [_pk("pushes")]})
    assert _enabled() == {"pushes": False, "releases": False, "gone": False}
    assert not LogEntry.objects.exists()
    assert client.get(reverse(ORPHANS)).status_code == 200


def test_staff_with_the_permission_can_toggle(sources: None) -> None:
    client = _client(_staff("view_triggersource", "toggle_triggersource"))
    client.post(reverse(SOURCES), {"action": "enable_sources", "_selected_action": [_pk("pushes")]})
    assert _enabled()["pushes"] is True
    assert LogEntry.objects.count() == 1


def test_an_orphan_cannot_be_toggled_from_the_sources_list(
    admin_client: Client, sources: None
) -> None:
    admin_client.post(
        reverse(SOURCES), {"action": "enable_sources", "_selected_action": [_pk("gone")]}
    )
    assert _enabled()["gone"] is False
