"""The admin's *Set the signing secret* form stores what the operator typed, spaces too, as
``trigger_sources set-secret`` does (it strips only the line end): a secret chosen at the
sender with a leading or trailing space stored without it would refuse every delivery with
401 and nothing saying why.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_leases.models import TriggerSource
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import webhook_source

pytestmark = pytest.mark.django_db(transaction=True)

TYPED = " sender chosen secret with spaces "


@pytest.fixture
def by_hand() -> Iterator[str]:
    webhook_source("secret-as-typed", provider="manual", events={})
    try:
        lifecycle.reconcile(base_url="https://app.example.com")
        yield "secret-as-typed"
    finally:
        registry.unregister("secret-as-typed")


def test_the_command_keeps_the_secret_as_typed(by_hand: str) -> None:
    call_command("trigger_sources", "set-secret", by_hand, stdin=io.StringIO(TYPED + "\n"))
    assert credentials.get_secret(by_hand) == TYPED


def test_the_admin_form_keeps_the_secret_as_typed(by_hand: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    pk = TriggerSource.objects.get(name=by_hand).pk
    response = client.post(
        reverse("admin:django_leases_triggersource_secret", args=[pk]), {"secret": TYPED}
    )
    assert response.status_code == 302
    assert credentials.get_secret(by_hand) == TYPED
