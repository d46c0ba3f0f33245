"""The lease admin through Django's test client: states, filter, search, force release."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_leases.models import Lease
from tests.helpers import staff_user

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_leases_lease_changelist"


@pytest.fixture
def leases() -> dict[str, Lease]:
    live = Lease.objects.acquire("reports:nightly", "host-a:1:aa", 3600)
    released = Lease.objects.acquire("cache:warm", "host-b:2:bb", 3600)
    assert live is not None and released is not None
    Lease.objects.release(released)
    # Lapsed an hour ago (by any clock): a holder that died without releasing.
    lapsed = Lease.objects.create(
        key="index:rebuild",
        holder="host-c:3:cc",
        token=4,
        expires_at=timezone.now() - timedelta(hours=1),
    )
    return {"live": live, "released": released, "lapsed": lapsed}


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _rows(response: Any) -> dict[str, Any]:
    return {row.key: row for row in response.context["cl"].result_list}


def test_superuser_sees_every_state(admin_client: Client, leases: dict[str, Lease]) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    rows = _rows(response)
    assert {key: row.state for key, row in rows.items()} == {
        "reports:nightly": "live",
        "cache:warm": "released",
        "index:rebuild": "lapsed",
    }
    html = response.content.decode().lower()
    for text in ("host-a:1:aa", "live", "lapsed", "released", "time left", "force release"):
        assert text in html
    # Time left is shown for the live lease only, measured on the database clock.
    admin = response.context["cl"].model_admin
    left = admin.time_left(rows["reports:nightly"])
    assert left.endswith(" s") and 3500 < float(left[:-2]) <= 3600
    assert admin.time_left(rows["index:rebuild"]) == "—"
    assert admin.time_left(rows["cache:warm"]) == "—"


@pytest.mark.parametrize(
    ("state", "keys"),
    [("live", {"reports:nightly"}), ("lapsed", {"index:rebuild"}), ("released", {"cache:warm"})],
)
def test_filter_by_state(
    admin_client: Client, leases: dict[str, Lease], state: str, keys: set[str]
) -> None:
    response = admin_client.get(reverse(CHANGELIST), {"state": state})
    assert set(_rows(response)) == keys


def test_search_by_key(admin_client: Client, leases: dict[str, Lease]) -> None:
    response = admin_client.get(reverse(CHANGELIST), {"q": "nightly"})
    assert set(_rows(response)) == {"reports:nightly"}


def test_the_list_is_read_only(admin_client: Client, leases: dict[str, Lease]) -> None:
    assert admin_client.get(reverse("admin:django_leases_lease_add")).status_code == 403
    lease = leases["live"]
    page = admin_client.get(reverse("admin:django_leases_lease_change", args=[lease.pk]))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    # A POST to the detail page changes nothing.
    admin_client.post(
        reverse("admin:django_leases_lease_change", args=[lease.pk]),
        {"key": "hijacked", "holder": "me", "token": 99},
    )
    assert Lease.objects.get(pk=lease.pk).key == "reports:nightly"
    delete = reverse("admin:django_leases_lease_delete", args=[lease.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Lease.objects.filter(pk=lease.pk).exists()
    actions = admin_client.get(reverse(CHANGELIST)).context["action_form"].fields["action"]
    assert [name for name, _ in actions.choices if name] == ["force_release"]


def test_superuser_force_releases(admin_client: Client, leases: dict[str, Lease]) -> None:
    live, lapsed = leases["live"], leases["lapsed"]
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "force_release", "_selected_action": [live.pk, lapsed.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Lease.objects.current("reports:nightly") is None
    # The token keeps rising for the next holder; the ex-holder can no longer renew.
    assert Lease.objects.refresh(live, 60) is None
    after = Lease.objects.acquire("reports:nightly", "host-d:4:dd", 60)
    assert after is not None and after.token == live.token + 1

    messages = [str(message) for message in response.context["messages"]]
    assert any("Force-released 1 lease: reports:nightly" in text for text in messages)
    assert any("not live" in text and "index:rebuild" in text for text in messages)

    entries = {entry.object_repr.split(" ")[0]: entry for entry in LogEntry.objects.all()}
    assert set(entries) == {"reports:nightly", "index:rebuild"}
    assert entries["reports:nightly"].action_flag == CHANGE
    assert "Force-released" in entries["reports:nightly"].change_message
    assert entries["reports:nightly"].object_id == str(live.pk)
    assert "not live" in entries["index:rebuild"].change_message


def test_staff_without_the_permission_gets_no_action(leases: dict[str, Lease]) -> None:
    client = _client(staff_user("view_lease"))
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert set(_rows(response)) == {"reports:nightly", "cache:warm", "index:rebuild"}
    assert b"Force release" not in response.content

    # Posting the action anyway does nothing.
    live = leases["live"]
    client.post(reverse(CHANGELIST), {"action": "force_release", "_selected_action": [live.pk]})
    assert Lease.objects.current("reports:nightly") is not None
    assert not LogEntry.objects.exists()


def test_staff_with_the_permission_can_force_release(leases: dict[str, Lease]) -> None:
    client = _client(staff_user("view_lease", "force_release_lease"))
    live = leases["live"]
    client.post(reverse(CHANGELIST), {"action": "force_release", "_selected_action": [live.pk]})
    assert Lease.objects.current("reports:nightly") is None
    assert LogEntry.objects.count() == 1


def test_staff_without_view_permission_sees_nothing(leases: dict[str, Lease]) -> None:
    client = _client(staff_user())
    assert client.get(reverse(CHANGELIST)).status_code == 403
