"""The lease admin in a real browser: an operator sees each lease's state and force-releases."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from django_leases.models import Lease

pytestmark = pytest.mark.timeout(180)


def row(page: Any, key: str) -> Any:
    return page.locator("#result_list tbody tr", has_text=key)


def test_an_operator_sees_states_and_force_releases_a_live_lease(
    page: Any,
    live_server: Any,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
) -> None:
    live = Lease.objects.acquire("reports:nightly", "host-a:1:aa", ttl=3600)
    assert live is not None
    # Lapsed an hour ago on any clock: a holder that died without releasing.
    Lease.objects.create(
        key="index:rebuild",
        holder="host-c:3:cc",
        token=4,
        expires_at=timezone.now() - timedelta(hours=1),
    )
    operator = User.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_leases",
            codename__in=["view_lease", "force_release_lease"],
        )
    )

    admin_login("operator", "pw")
    page.goto("/admin/django_leases/lease/")
    assert row(page, "reports:nightly").locator("td.field-state_display").inner_text() == "live"
    assert row(page, "index:rebuild").locator("td.field-state_display").inner_text() == "lapsed"
    assert row(page, "reports:nightly").locator("td.field-token").inner_text() == "1"
    assert row(page, "index:rebuild").locator("td.field-time_left").inner_text() == "—"
    screenshot("lease-list")

    row(page, "reports:nightly").locator("input.action-select").check()
    page.select_option("select[name=action]", "force_release")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "Force-released 1 lease: reports:nightly." in page.inner_text("ul.messagelist")
    assert row(page, "reports:nightly").locator("td.field-state_display").inner_text() == (
        "released"
    )
    screenshot("after-force-release")

    assert Lease.objects.current("reports:nightly") is None
    # The key passes on with a higher token: the ex-holder is fenced off.
    taken = Lease.objects.acquire("reports:nightly", "host-b:2:bb", ttl=60)
    assert taken is not None and taken.token == 2
    assert Lease.objects.refresh(live, ttl=60) is None


def test_without_the_permission_there_is_no_force_release(
    page: Any, live_server: Any, admin_login: Callable[[str, str], None]
) -> None:
    assert Lease.objects.acquire("reports:nightly", "host-a:1:aa", ttl=3600) is not None
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_leases", codename="view_lease")
    )

    admin_login("viewer", "pw")
    page.goto("/admin/django_leases/lease/")
    assert row(page, "reports:nightly").locator("td.field-state_display").inner_text() == "live"
    options = page.locator("select[name=action] option").all_inner_texts()
    assert not any("Force release" in text for text in options)
    assert Lease.objects.current("reports:nightly") is not None
