"""The trigger-source admin with ``ATOMIC_REQUESTS`` on.

A lifecycle operation takes the source's lease, which cannot be held inside a transaction:
the per-row switch's operate URL and the list (where the bulk actions *Enable*, *Disable*,
*Forget* and *Tear down* run) are left out of the request's transaction. (The bulk actions
were refused with a message pointing at the test helpers.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_leases.models import TriggerSource
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import lifecycle
from tests.helpers import fake_sources

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://app.example.com"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with fake_sources("atomic-a", "atomic-b") as provider:
        lifecycle.reconcile(base_url=BASE)
        yield provider


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False


def _client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_the_switch_works_under_atomic_requests(fake: FakeProvider, atomic_requests: None) -> None:
    pk = TriggerSource.objects.get(name="atomic-a").pk
    response = _client().post(
        reverse("admin:django_leases_triggersource_operate", args=[pk, "enable"])
    )
    assert response.status_code == 302
    assert TriggerSource.objects.get(name="atomic-a").enabled


def test_the_bulk_enable_action_works_under_atomic_requests(
    fake: FakeProvider, atomic_requests: None
) -> None:
    pk = TriggerSource.objects.get(name="atomic-b").pk
    response = _client().post(
        reverse("admin:django_leases_triggersource_changelist"),
        {"action": "enable_sources", "_selected_action": [str(pk)], "index": 0},
    )
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert TriggerSource.objects.get(name="atomic-b").enabled, said
