"""An operator sets a manual source's signing secret in the admin, in a real browser at
1280 px: the page's button opens a password form that fits the window, the secret typed is
stored (encrypted) and never shown back, and the source's page then says one is stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from django_leases.models import TriggerSource
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import webhook_source
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(180)

WIDTH = 1280
SOURCE = "by-hand-deploys"
SECRET = "a-secret-chosen-at-the-sender-8c1f"


@pytest.fixture
def manual_source(live_server: Any) -> Iterator[TriggerSource]:
    webhook_source(SOURCE, provider="manual", events={})
    try:
        lifecycle.reconcile(base_url=live_server.url)
        yield TriggerSource.objects.get(name=SOURCE)
    finally:
        registry.unregister(SOURCE)


def test_an_operator_sets_the_secret_and_never_sees_it_again(
    page: Any,
    manual_source: TriggerSource,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    operator = User.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_leases",
            codename__in=["view_triggersource", "toggle_triggersource"],
        )
    )
    page.set_viewport_size({"width": WIDTH, "height": 900})
    admin_login("operator", "pw")
    page.goto(f"/admin/django_leases/triggersource/{manual_source.pk}/change/")
    assert page.locator(f"#no-secret-{SOURCE}").count() == 1
    page.click(f"#set-secret-{SOURCE}")
    page.wait_for_selector("#signing-secret-form")
    assert overflowing(page) == []
    field = page.locator("#signing-secret-form input[name=secret]")
    assert field.get_attribute("type") == "password" and field.input_value() == ""
    screenshot("secret-form")

    field.fill(SECRET)
    page.click("#store-secret")
    page.wait_for_selector("ul.messagelist")
    assert f"Stored the signing secret of {SOURCE} (encrypted)." in page.inner_text(
        "ul.messagelist"
    )
    assert page.locator(f"#no-secret-{SOURCE}").count() == 0
    assert SECRET not in page.content()
    assert credentials.get_secret(SOURCE) == SECRET

    page.click(f"#set-secret-{SOURCE}")
    page.wait_for_selector("#signing-secret-form")
    assert page.locator("#signing-secret-form input[name=secret]").input_value() == ""
    assert "A secret is stored" in page.inner_text("#secret-origin")
    assert SECRET not in page.content()
    screenshot("secret-form-stored")
