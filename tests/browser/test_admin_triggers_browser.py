"""The trigger-source admin in a real browser: an operator switches sources on and off (one by
one and in bulk) and forgets an orphan; a staff user without the permission can do none of it.

The sources live on a :class:`FakeProvider`, so "registered at the provider" is read from the
fake's own registrations, not from our rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from django_leases.models import TriggerSource
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import lifecycle
from tests.helpers import fake_sources, make_orphan

pytestmark = pytest.mark.timeout(180)

SOURCES = "/admin/django_leases/triggersource/"
ORPHANS = "/admin/django_leases/orphantriggersource/"
MINE = ("br-pushes", "br-releases", "br-gone")


@pytest.fixture
def fake(live_server: Any) -> Iterator[FakeProvider]:
    """Two declared sources (off) and one orphan ("br-gone") that was registered at the
    provider before its declaration left the code, all on a fake provider."""
    with fake_sources(*MINE) as provider:
        lifecycle.reconcile(base_url=live_server.url)
        make_orphan("br-gone")
        provider.calls.clear()
        yield provider


def operator(username: str = "operator", *, toggle: bool = True) -> User:
    """A staff user who may view the trigger sources (and toggle them when ``toggle``)."""
    codenames = ["view_triggersource", "view_orphantriggersource"]
    if toggle:
        codenames.append("toggle_triggersource")
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_leases", codename__in=codenames)
    )
    assert user.user_permissions.count() == len(codenames)
    return user


def status(page: Any, name: str) -> str:
    return str(page.get_attribute(f"#status-{name}", "data-status"))


def registered_urls(fake: FakeProvider) -> dict[str, str]:
    """Source name → the URL the fake provider posts to, for every registration it holds."""
    return {hook["source"]: hook["url"] for hook in fake.hooks.values()}


def messages(page: Any) -> str:
    page.wait_for_selector("ul.messagelist")
    return str(page.inner_text("ul.messagelist"))


def test_an_operator_switches_a_source_on_and_off(
    page: Any,
    live_server: Any,
    fake: FakeProvider,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    operator()
    admin_login("operator", "pw")
    page.goto(SOURCES)
    assert status(page, "br-pushes") == "off"
    assert page.inner_text("#switch-br-pushes") == "Turn on"
    screenshot("sources-off")

    page.click("#switch-br-pushes")
    assert "Enable:" in messages(page)
    assert status(page, "br-pushes") == "registered"
    assert page.inner_text("#switch-br-pushes") == "Turn off"
    assert status(page, "br-releases") == "off", "only the switched source changed"
    assert registered_urls(fake)["br-pushes"] == f"{live_server.url}/hooks/br-pushes/"
    assert "br-releases" not in registered_urls(fake)
    screenshot("source-on")

    page.click("#switch-br-pushes")
    assert "Disable:" in messages(page)
    assert status(page, "br-pushes") == "off"
    assert page.inner_text("#switch-br-pushes") == "Turn on"
    assert "br-pushes" not in registered_urls(fake), "torn down at the provider"
    row = TriggerSource.objects.get(name="br-pushes")
    assert (row.enabled, row.state) == (False, None)
    logged = LogEntry.objects.filter(object_id=str(row.pk)).order_by("pk")
    assert [entry.change_message.split(";")[0] for entry in logged] == [
        "Enabled the trigger source",
        "Disabled the trigger source",
    ]
    screenshot("source-off-again")


def test_an_operator_enables_and_disables_in_bulk(
    page: Any,
    live_server: Any,
    fake: FakeProvider,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    operator()
    admin_login("operator", "pw")
    page.goto(SOURCES)
    both = ("br-pushes", "br-releases")

    for name in both:
        page.locator("#result_list tbody tr", has_text=name).locator("input.action-select").check()
    page.select_option("select[name=action]", "enable_sources")
    page.click("button[name=index]")
    said = messages(page)
    assert said.count("Enable:") == 2
    assert [status(page, name) for name in both] == ["registered", "registered"]
    assert set(both) <= set(registered_urls(fake))
    assert fake.created == 3, "one registration each (the orphan's was the first)"
    screenshot("bulk-enabled")

    for name in both:
        page.locator("#result_list tbody tr", has_text=name).locator("input.action-select").check()
    page.select_option("select[name=action]", "disable_sources")
    page.click("button[name=index]")
    assert messages(page).count("Disable:") == 2
    assert [status(page, name) for name in both] == ["off", "off"]
    assert not set(both) & set(registered_urls(fake))
    assert not TriggerSource.objects.filter(name__in=both, enabled=True).exists()
    screenshot("bulk-disabled")


def test_an_operator_forgets_an_orphan(
    page: Any,
    live_server: Any,
    fake: FakeProvider,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    operator()
    admin_login("operator", "pw")
    page.goto(SOURCES)
    assert page.locator("#status-br-gone").count() == 0, "an orphan is not a declared source"
    page.goto(ORPHANS)
    assert status(page, "br-gone") == "registered"
    assert page.locator("#teardown-br-gone").count() == 1
    screenshot("orphans")

    page.click("#forget-br-gone")
    assert "Forget:" in messages(page)
    assert page.locator("#forget-br-gone").count() == 0
    assert not TriggerSource.objects.filter(name="br-gone").exists()
    # Forgetting leaves the provider alone: its registration is still there.
    assert "br-gone" in registered_urls(fake)
    assert fake.count("teardown") == 0
    screenshot("orphan-forgotten")


def test_without_the_permission_there_is_no_switch_and_operating_is_refused(
    page: Any,
    live_server: Any,
    fake: FakeProvider,
    admin_login: Callable[[str, str], None],
) -> None:
    operator("viewer", toggle=False)
    admin_login("viewer", "pw")
    page.goto(SOURCES)
    assert status(page, "br-pushes") == "off"
    assert page.locator(".dl-switch").count() == 0
    options = page.locator("select[name=action] option").all_inner_texts()
    assert not any("Enable" in text or "Disable" in text for text in options)
    page.goto(ORPHANS)
    assert status(page, "br-gone") == "registered"
    assert page.locator("#forget-br-gone, #teardown-br-gone").count() == 0

    # Posting by hand, with a valid CSRF token (so the refusal is the permission's).
    token = page.get_attribute("input[name=csrfmiddlewaretoken]", "value")
    pushes = TriggerSource.objects.get(name="br-pushes").pk
    gone = TriggerSource.objects.get(name="br-gone").pk
    for url in (
        f"{SOURCES}{pushes}/operate/enable/",
        f"{ORPHANS}{gone}/operate/forget/",
    ):
        response = page.request.post(
            url, form={"csrfmiddlewaretoken": token}, max_redirects=0, fail_on_status_code=False
        )
        assert response.status == 403, url
        assert "CSRF" not in response.text()
    assert TriggerSource.objects.get(name="br-pushes").enabled is False
    assert TriggerSource.objects.filter(name="br-gone").exists()
    assert fake.calls == []

    # The same request from an operator is accepted: the refusal above was the permission.
    operator("operator")
    page.context.clear_cookies()  # signed out
    admin_login("operator", "pw")
    page.goto(SOURCES)
    token = page.get_attribute("input[name=csrfmiddlewaretoken]", "value")
    response = page.request.post(
        f"{SOURCES}{pushes}/operate/enable/",
        form={"csrfmiddlewaretoken": token},
        max_redirects=0,
        fail_on_status_code=False,
    )
    assert response.status == 302
    assert TriggerSource.objects.get(name="br-pushes").enabled is True
    assert "br-pushes" in registered_urls(fake)
