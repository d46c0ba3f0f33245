"""The trigger-source admin through Django's test client: the lists, the per-row switch, bulk
actions, the Orphans view, the permission, CSRF, log entries, and that no secret shows."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_leases.models import TriggerEvent, TriggerSource
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import credentials, lifecycle
from tests.helpers import fake_sources, make_orphan, staff_user

pytestmark = pytest.mark.django_db(transaction=True)

SOURCES = "admin:django_leases_triggersource_changelist"
ORPHANS = "admin:django_leases_orphantriggersource_changelist"
BASE = "https://app.example.com"
MINE = ("adm-pushes", "adm-releases", "adm-gone")


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    """Three sources on a fake provider: two declared, one ("adm-gone") an orphan that was
    enabled (registered at the provider) before its declaration left the code."""
    with fake_sources(*MINE) as provider:
        lifecycle.reconcile(base_url=BASE)
        make_orphan("adm-gone")
        provider.calls.clear()
        yield provider


def _client(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    return _client(User.objects.create_superuser("root", password="pw"))


def _names(response: Any) -> list[str]:
    return [row.name for row in response.context["cl"].result_list]


def _pk(name: str) -> int:
    return TriggerSource.objects.get(name=name).pk


def _row(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


def _operate(kind: str, name: str, operation: str) -> str:
    return reverse(f"admin:django_leases_{kind}_operate", args=[_pk(name), operation])


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# -- lists ---------------------------------------------------------------------------------------


def test_declared_sources_are_listed_with_switch_badge_address_and_detail(
    operator: Client, fake: FakeProvider
) -> None:
    lifecycle.enable("adm-pushes")
    response = operator.get(reverse(SOURCES))
    assert response.status_code == 200
    names = _names(response)
    assert "adm-pushes" in names and "adm-releases" in names and "adm-gone" not in names
    html = response.content.decode()
    # The switch: a submit button that posts the changelist form (CSRF token included) to
    # the source's enable / disable view.
    on = re.search(r'<button[^>]*id="switch-adm-pushes"[^>]*>Turn off</button>', html)
    off = re.search(r'<button[^>]*id="switch-adm-releases"[^>]*>Turn on</button>', html)
    assert on and off
    assert f'formaction="{_operate("triggersource", "adm-pushes", "disable")}"' in on.group(0)
    assert f'formaction="{_operate("triggersource", "adm-releases", "enable")}"' in off.group(0)
    assert "csrfmiddlewaretoken" in html
    assert 'id="status-adm-pushes" data-status="registered"' in html
    assert 'id="status-adm-releases" data-status="off"' in html
    assert f"{BASE}/hooks/adm-pushes/" in html
    assert "Hook 2 registered to post to" in html
    assert credentials.get_secret("adm-pushes") not in html


def test_orphans_are_listed_apart_with_their_operations(
    operator: Client, fake: FakeProvider
) -> None:
    response = operator.get(reverse(ORPHANS))
    assert response.status_code == 200
    assert _names(response) == ["adm-gone"]
    html = response.content.decode()
    assert 'id="forget-adm-gone"' in html
    assert 'id="teardown-adm-gone"' in html  # provider installed, registration recorded
    actions = [name for name, _ in response.context["action_form"].fields["action"].choices]
    assert {"forget_sources", "teardown_sources"} <= set(actions)
    assert operator.get(reverse("admin:django_leases_orphantriggersource_add")).status_code == 403

    # Without a recorded registration, only "forget" is offered.
    TriggerSource.objects.filter(name="adm-gone").update(state=None)
    html = operator.get(reverse(ORPHANS)).content.decode()
    assert 'id="forget-adm-gone"' in html and 'id="teardown-adm-gone"' not in html


def test_the_lists_are_read_only(operator: Client, fake: FakeProvider) -> None:
    assert operator.get(reverse("admin:django_leases_triggersource_add")).status_code == 403
    pk = _pk("adm-pushes")
    operator.post(
        reverse("admin:django_leases_triggersource_change", args=[pk]),
        {"name": "renamed", "enabled": "on"},
    )
    assert (_row("adm-pushes").name, _row("adm-pushes").enabled) == ("adm-pushes", False)
    delete = reverse("admin:django_leases_triggersource_delete", args=[pk])
    assert operator.post(delete, {"post": "yes"}).status_code == 403
    assert TriggerSource.objects.filter(name="adm-pushes").exists()


# -- the switch ------------------------------------------------------------------------------


def test_the_switch_enables_then_disables_through_the_lifecycle(
    operator: Client, fake: FakeProvider
) -> None:
    response = operator.post(_operate("triggersource", "adm-releases", "enable"), follow=True)
    assert response.redirect_chain[-1][0] == reverse(SOURCES)
    row = _row("adm-releases")
    assert (row.enabled, row.status, row.state) == (True, "registered", {"hook_id": 2})
    assert fake.calls == [("setup", "adm-releases")]
    assert any(
        text.startswith("Enable: adm-releases: Hook 2 registered") for text in _messages(response)
    )
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.action_flag) == ("adm-releases", CHANGE)
    assert entry.change_message == "Enabled the trigger source; status registered"

    response = operator.post(_operate("triggersource", "adm-releases", "disable"), follow=True)
    row = _row("adm-releases")
    assert (row.enabled, row.status, row.state) == (False, "off", None)
    assert fake.hooks == {"1": fake.hooks["1"]}  # only the orphan's hook is left
    assert any("Disable: adm-releases: Disabled" in text for text in _messages(response))
    assert LogEntry.objects.filter(change_message__startswith="Disabled the trigger").count() == 1


def test_the_switch_needs_post_and_the_csrf_token(fake: FakeProvider) -> None:
    client = _client(User.objects.create_superuser("root", password="pw"), enforce_csrf_checks=True)
    url = _operate("triggersource", "adm-pushes", "enable")
    assert client.get(url).status_code == 405
    assert client.post(url).status_code == 403  # no CSRF token
    assert _row("adm-pushes").enabled is False
    page = client.get(reverse(SOURCES)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token
    # What the browser sends when the row's button is pressed: the changelist form's fields.
    response = client.post(
        url, {"csrfmiddlewaretoken": token.group(1), "switch": "enable", "action": ""}
    )
    assert response.status_code == 302
    assert _row("adm-pushes").enabled is True


def test_a_failed_setup_is_reported_and_logged(operator: Client, fake: FakeProvider) -> None:
    fake.fail_setup = "API answered 500"
    response = operator.post(_operate("triggersource", "adm-pushes", "enable"), follow=True)
    assert any(
        "Enable: adm-pushes: Setup at fake failed: API answered 500" in text
        for text in _messages(response)
    )
    assert (_row("adm-pushes").enabled, _row("adm-pushes").status) == (True, "failed")
    assert "the provider step failed" in LogEntry.objects.get().change_message


def test_a_refused_enable_changes_and_logs_nothing(operator: Client, fake: FakeProvider) -> None:
    TriggerSource.objects.filter(name="adm-pushes").update(base_url=None)
    response = operator.post(_operate("triggersource", "adm-pushes", "enable"), follow=True)
    assert any("nothing changed" in text and "no address" in text for text in _messages(response))
    assert _row("adm-pushes").enabled is False
    assert not LogEntry.objects.exists()
    assert fake.calls == []


def test_an_orphan_cannot_be_switched_from_the_sources_list(
    operator: Client, fake: FakeProvider
) -> None:
    url = _operate("triggersource", "adm-gone", "disable")
    response = operator.post(url, follow=True)
    assert any("No such trigger source" in text for text in _messages(response))
    assert _row("adm-gone").enabled is True
    operator.post(
        reverse(SOURCES), {"action": "disable_sources", "_selected_action": [_pk("adm-gone")]}
    )
    assert _row("adm-gone").enabled is True
    assert fake.calls == []


# -- bulk actions ----------------------------------------------------------------------------


def test_bulk_enable_and_disable(operator: Client, fake: FakeProvider) -> None:
    chosen = [_pk("adm-pushes"), _pk("adm-releases")]
    response = operator.post(
        reverse(SOURCES), {"action": "enable_sources", "_selected_action": chosen}, follow=True
    )
    assert all(_row(name).status == "registered" for name in ("adm-pushes", "adm-releases"))
    texts = _messages(response)
    assert any(text.startswith("Enable: adm-pushes:") for text in texts)
    assert any(text.startswith("Enable: adm-releases:") for text in texts)
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 2

    # Enabling again sets up again (reusing the hooks) and says it was on already.
    operator.post(reverse(SOURCES), {"action": "enable_sources", "_selected_action": chosen})
    assert fake.created == 3  # the orphan's, then one each: none added by the second round
    assert LogEntry.objects.filter(change_message__contains="on already").count() == 2

    operator.post(reverse(SOURCES), {"action": "disable_sources", "_selected_action": chosen})
    assert not TriggerSource.objects.filter(name__in=MINE[:2], enabled=True).exists()
    assert LogEntry.objects.filter(change_message__startswith="Disabled").count() == 2


# -- orphans ---------------------------------------------------------------------------------


def test_forget_an_orphan(operator: Client, fake: FakeProvider) -> None:
    response = operator.post(_operate("orphantriggersource", "adm-gone", "forget"), follow=True)
    assert response.redirect_chain[-1][0] == reverse(ORPHANS)
    assert not TriggerSource.objects.filter(name="adm-gone").exists()
    assert any("Forget: adm-gone: Forgotten." in text for text in _messages(response))
    assert fake.calls == []  # the provider is not asked
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.action_flag) == ("adm-gone", DELETION)


def test_tear_down_an_orphan_at_its_provider(operator: Client, fake: FakeProvider) -> None:
    response = operator.post(
        reverse(ORPHANS),
        {"action": "teardown_sources", "_selected_action": [_pk("adm-gone")]},
        follow=True,
    )
    assert not TriggerSource.objects.filter(name="adm-gone").exists()
    assert fake.calls == [("teardown", "adm-gone")] and fake.hooks == {}
    assert any("Torn down at fake and deleted." in text for text in _messages(response))
    assert LogEntry.objects.get().action_flag == DELETION


def test_tear_down_is_refused_without_the_provider(operator: Client, fake: FakeProvider) -> None:
    TriggerSource.objects.filter(name="adm-gone").update(provider="uninstalled")
    response = operator.post(
        reverse(ORPHANS),
        {"action": "teardown_sources", "_selected_action": [_pk("adm-gone")]},
        follow=True,
    )
    assert any("forget it instead" in text for text in _messages(response))
    assert TriggerSource.objects.filter(name="adm-gone").exists()
    assert operator.post(_operate("orphantriggersource", "adm-gone", "teardown")).status_code == 302
    assert TriggerSource.objects.filter(name="adm-gone").exists()
    assert not LogEntry.objects.exists()


# -- pages -----------------------------------------------------------------------------------


def test_a_source_page_shows_recent_deliveries_and_its_operations(
    operator: Client, fake: FakeProvider
) -> None:
    lifecycle.enable("adm-pushes")
    source = _row("adm-pushes")
    for index in range(3):
        TriggerEvent.objects.create(
            source=source,
            source_name=source.name,
            delivery_id=f"d-{index}",
            event="push",
            payload={},
        )
    url = reverse("admin:django_leases_triggersource_change", args=[source.pk])
    html = operator.get(url).content.decode()
    assert 'id="recent-events"' in html
    assert all(f"d-{index}" in html for index in range(3))
    assert 'id="trigger-source-operations"' in html
    assert re.search(r'id="disable-adm-pushes"[^>]*>Turn off</button>', html)
    assert credentials.get_secret("adm-pushes") not in html

    # The page's button comes back to the page.
    response = operator.post(_operate("triggersource", "adm-pushes", "disable"), {"next": url})
    assert response["Location"] == url
    assert _row("adm-pushes").enabled is False

    orphan_page = operator.get(
        reverse("admin:django_leases_orphantriggersource_change", args=[_pk("adm-gone")])
    ).content.decode()
    assert 'id="forget-adm-gone"' in orphan_page and 'id="teardown-adm-gone"' in orphan_page


# -- permission ------------------------------------------------------------------------------


def test_staff_without_the_permission_cannot_switch_anything(fake: FakeProvider) -> None:
    client = _client(staff_user("view_triggersource", "view_orphantriggersource"))
    response = client.get(reverse(SOURCES))
    assert response.status_code == 200
    html = response.content.decode()
    assert "adm-pushes" in _names(response)
    assert 'id="switch-' not in html and "Enable the selected" not in html
    # Not by URL…
    for kind, name, operation in [
        ("triggersource", "adm-pushes", "enable"),
        ("triggersource", "adm-pushes", "disable"),
        ("orphantriggersource", "adm-gone", "forget"),
        ("orphantriggersource", "adm-gone", "teardown"),
    ]:
        assert client.post(_operate(kind, name, operation)).status_code == 403
    # …nor by action.
    client.post(
        reverse(SOURCES), {"action": "enable_sources", "_selected_action": [_pk("adm-pushes")]}
    )
    client.post(
        reverse(ORPHANS), {"action": "forget_sources", "_selected_action": [_pk("adm-gone")]}
    )
    orphans = client.get(reverse(ORPHANS))
    assert orphans.status_code == 200
    assert 'id="forget-' not in orphans.content.decode()
    page = client.get(
        reverse("admin:django_leases_triggersource_change", args=[_pk("adm-pushes")])
    ).content.decode()
    assert "trigger-source-operations" not in page
    assert _row("adm-pushes").enabled is False
    assert TriggerSource.objects.filter(name="adm-gone").exists()
    assert not LogEntry.objects.exists()
    assert fake.calls == []


def test_staff_with_the_permission_can_switch(fake: FakeProvider) -> None:
    client = _client(staff_user("view_triggersource", "toggle_triggersource"))
    client.post(
        reverse(SOURCES), {"action": "enable_sources", "_selected_action": [_pk("adm-pushes")]}
    )
    assert _row("adm-pushes").enabled is True
    assert client.post(_operate("triggersource", "adm-pushes", "disable")).status_code == 302
    assert _row("adm-pushes").enabled is False
    assert LogEntry.objects.count() == 2


# -- a source registered by hand ---------------------------------------------------------------


@pytest.fixture
def manual_sources() -> Iterator[None]:
    """Two manual sources: one signed GitHub's way (the default), one Stripe's."""
    from django_leases.triggers import registry
    from django_leases.triggers.registry import webhook_source

    webhook_source("adm-by-hand", provider="manual", events={})
    webhook_source(
        "adm-by-hand-stripe", provider="manual", events={}, config={"signature": "stripe"}
    )
    try:
        lifecycle.reconcile(base_url=BASE)
        yield
    finally:
        registry.unregister("adm-by-hand")
        registry.unregister("adm-by-hand-stripe")


def _page(client: Client, name: str) -> str:
    url = reverse("admin:django_leases_triggersource_change", args=[_pk(name)])
    response = client.get(url)
    assert response.status_code == 200
    return str(response.content.decode())


def test_a_manual_source_page_says_whether_a_secret_is_stored_and_what_to_send(
    operator: Client, manual_sources: None, settings: Any
) -> None:
    html = _page(operator, "adm-by-hand")
    assert 'id="no-secret-adm-by-hand"' in html and "set-secret adm-by-hand" in html
    headers = html[html.index('id="sender-headers"') :]
    headers = headers[: headers.index("</table>")]
    for header in ("Content-Type", "X-GitHub-Event", "X-GitHub-Delivery", "X-Hub-Signature-256"):
        assert f"<code>{header}</code>" in headers, header
    assert "Stripe-Signature" not in headers
    assert f"{BASE}/hooks/adm-by-hand/" in html

    credentials.set_secret("adm-by-hand", "a-secret-the-operator-chose-123")
    html = _page(operator, "adm-by-hand")
    assert "stored (encrypted, in the credential store)" in html
    assert 'id="no-secret-' not in html
    assert "a-secret-the-operator-chose-123" not in html

    settings.DJANGO_LEASES = {
        **settings.DJANGO_LEASES,
        "WEBHOOK_SECRETS": {"adm-by-hand": "s" * 20},
    }
    html = _page(operator, "adm-by-hand")
    assert "set in DJANGO_LEASES[&#x27;WEBHOOK_SECRETS&#x27;]" in html and "s" * 20 not in html

    stripe = _page(operator, "adm-by-hand-stripe")
    headers = stripe[stripe.index('id="sender-headers"') :]
    assert "<code>Stripe-Signature</code>" in headers[: headers.index("</table>")]
    assert "X-Hub-Signature-256" not in headers[: headers.index("</table>")]


def test_only_manual_sources_list_the_headers_to_send(operator: Client, fake: FakeProvider) -> None:
    lifecycle.enable("adm-pushes")  # the fake provider generates and stores a secret
    html = _page(operator, "adm-pushes")
    assert 'id="sender-headers"' not in html
    assert "stored (encrypted, in the credential store)" in html
    assert credentials.get_secret("adm-pushes") not in html


# -- refused deliveries ------------------------------------------------------------------------


def test_a_source_page_and_the_list_show_the_refused_delivery_tallies(
    operator: Client, fake: FakeProvider
) -> None:
    lifecycle.enable("adm-pushes")
    hooks = Client()
    headers = {
        "content_type": "application/json",
        "HTTP_X_FAKE_EVENT": "push",
        "HTTP_X_FAKE_DELIVERY": "d-1",
    }
    for _ in range(3):
        wrong = FakeProvider.sign("not-the-secret", b"{}")
        answer = hooks.post("/hooks/adm-pushes/", b"{}", HTTP_X_FAKE_SIGNATURE=wrong, **headers)
        assert answer.status_code == 401
    assert hooks.post("/hooks/adm-releases/", b"{}", **headers).status_code == 404  # off
    html = _page(operator, "adm-pushes")
    table = html[html.index('id="refusals"') :]
    table = table[: table.index("</table>")]
    row = re.search(r'<tr id="refused-bad_signature">(.*?)</tr>', table, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == "<code>bad_signature</code>" and cells[2:4] == ["3", "401"]
    assert "signature missing or not matching" in cells[1]
    assert 'class="dl-time"' in cells[4] and 'class="dl-time"' in cells[5]
    assert "not_receiving" not in table, "another source's refusal"
    assert re.search(r'<tr id="refused-not_receiving">', _page(operator, "adm-releases"))
    # The list: the total per source.
    listing = operator.get(reverse(SOURCES)).content.decode()
    assert 'data-refused="3">3<' in listing and 'data-refused="1">1<' in listing
    orphan = reverse("admin:django_leases_orphantriggersource_change", args=[_pk("adm-gone")])
    orphan_page = operator.get(orphan).content.decode()
    assert 'id="refusals"' not in orphan_page and "Refused deliveries" in orphan_page


def test_an_operator_sets_a_manual_source_s_secret_in_a_form_that_never_shows_it(
    operator: Client, manual_sources: None, fake: FakeProvider
) -> None:
    chosen = "a-secret-typed-in-the-admin-4567"
    html = _page(operator, "adm-by-hand")
    url = reverse("admin:django_leases_triggersource_secret", args=[_pk("adm-by-hand")])
    assert f'id="set-secret-adm-by-hand" href="{url}"' in html
    form = operator.get(url)
    assert form.status_code == 200
    assert (
        'type="password"' in form.content.decode()
        and "No secret is stored" in form.content.decode()
    )

    # A blank or control-character secret: the form again, nothing stored, nothing echoed.
    assert operator.post(url, {"secret": ""}).status_code == 200
    bad = operator.post(url, {"secret": "line\x01break"})
    assert bad.status_code == 200 and "line\x01break" not in bad.content.decode()
    assert credentials.get_secret("adm-by-hand") is None

    done = operator.post(url, {"secret": chosen}, follow=True)
    assert credentials.get_secret("adm-by-hand") == chosen
    assert "Stored the signing secret of adm-by-hand (encrypted)." in _messages(done)
    assert chosen not in done.content.decode()
    again = operator.get(url).content.decode()
    assert chosen not in again and "A secret is stored" in again
    entry = LogEntry.objects.filter(object_id=str(_pk("adm-by-hand"))).latest("action_time")
    assert entry.action_flag == CHANGE and chosen not in entry.get_change_message()
    assert "signing secret" in entry.get_change_message()


def test_the_secret_form_needs_the_toggle_permission_and_a_secret_set_by_hand(
    manual_sources: None, fake: FakeProvider
) -> None:
    """The form is for operators with the toggle permission, on a source whose secret may be
    set by hand (``manual``, or a provider that is sent ours, as GitHub is) — not on one whose
    provider chooses its own (Stripe), which ``trigger_sources set-secret`` refuses too."""
    url = reverse("admin:django_leases_triggersource_secret", args=[_pk("adm-by-hand")])
    viewer = _client(staff_user("view_triggersource"))
    assert 'id="set-secret-' not in _page(viewer, "adm-by-hand")
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"secret": "x" * 20}).status_code == 403
    assert credentials.get_secret("adm-by-hand") is None

    toggler = _client(staff_user("view_triggersource", "toggle_triggersource"))
    assert toggler.get(url).status_code == 200

    # A provider that is sent our secret at setup (GitHub's way): the form is offered.
    other = reverse("admin:django_leases_triggersource_secret", args=[_pk("adm-releases")])
    assert fake.takes_secret and f'id="set-secret-adm-releases" href="{other}"' in _page(
        toggler, "adm-releases"
    )
    assert toggler.post(other, {"secret": "y" * 20}).status_code == 302
    assert credentials.get_secret("adm-releases") == "y" * 20

    # A provider that chooses its own secret (Stripe's way): no form, and a POST is refused.
    fake.takes_secret = False
    kept = credentials.get_secret("adm-pushes")
    other = reverse("admin:django_leases_triggersource_secret", args=[_pk("adm-pushes")])
    page = _page(toggler, "adm-pushes")
    assert 'id="set-secret-' not in page
    assert kept is None and "turn the source on: its setup stores the secret" in page
    assert toggler.post(other, {"secret": "x" * 20}).status_code == 403, "the provider's choice"
    assert credentials.get_secret("adm-pushes") == kept
    with pytest.raises(CommandError, match="chooses the secret"):
        call_command("trigger_sources", "set-secret", "adm-pushes", stdin=io.StringIO("x\n"))
    assert credentials.get_secret("adm-pushes") == kept


def test_a_secret_set_in_the_form_updates_an_enabled_manual_source_s_instructions(
    operator: Client, manual_sources: None
) -> None:
    lifecycle.enable("adm-by-hand")
    assert "Then store its signing secret" in _row("adm-by-hand").detail
    url = reverse("admin:django_leases_triggersource_secret", args=[_pk("adm-by-hand")])
    assert operator.post(url, {"secret": "typed-in-the-admin-890"}).status_code == 302
    detail = _row("adm-by-hand").detail
    assert "signing secret stored for source 'adm-by-hand'" in detail
    assert "typed-in-the-admin-890" not in detail
