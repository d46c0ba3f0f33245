"""The trigger-source lifecycle (reconcile / enable / disable / teardown / forget) with a fake
provider: each rule of DESIGN §6, failing setups and teardowns, and races between threads
and between processes on real commits."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_leases.leases import hold_lease
from django_leases.models import Lease, TriggerEvent, TriggerSource
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.errors import SourceStillDeclared, UnknownTriggerSourceError
from django_leases.triggers.lifecycle import (
    NoAddress,
    ProviderNotInstalled,
    SourceBusy,
    SourceOrphaned,
)
from django_leases.triggers.registry import webhook_source
from tests.helpers import fake_sources, race, run_at_once, start_process, start_thread

SOURCE = "lc-hooks"
BASE = "https://app.example.com"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    """A fake provider ``fake`` and a declared source ``lc-hooks`` using it (not synced)."""
    with fake_sources(SOURCE) as provider:
        yield provider


def _row(name: str = SOURCE) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


def _synced(base_url: str | None = BASE) -> None:
    TriggerSource.objects.sync(registry.declarations(), base_url=base_url)


# -- reconcile ---------------------------------------------------------------------------------


def test_reconcile_syncs_and_sets_up_only_enabled_sources(fake: FakeProvider) -> None:
    result = lifecycle.reconcile(base_url=BASE, label_prefix="prod")
    assert SOURCE in [row.name for row in result.sources]
    assert result.results == [] and result.ok
    assert fake.calls == []  # a disabled source gets no provider call at all
    row = _row()
    assert (row.base_url, row.label_prefix, row.enabled, row.status) == (BASE, "prod", False, None)

    lifecycle.enable(SOURCE)
    fake.calls.clear()
    result = lifecycle.reconcile(base_url="https://moved.example.com")
    assert [(r.name, r.action, r.ok, r.status) for r in result.results] == [
        (SOURCE, "reconcile", True, "registered")
    ]
    assert fake.calls == [("setup", SOURCE)]
    # The registration is reused and follows the new address.
    assert fake.created == 1
    assert list(fake.hooks.values()) == [
        {"url": f"https://moved.example.com/hooks/{SOURCE}/", "source": SOURCE}
    ]


def test_reconcile_reports_a_failed_setup_and_goes_on(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    fake.fail_setup = "API said 503"
    result = lifecycle.reconcile()
    assert not result.ok
    [failed] = result.results
    assert (failed.name, failed.ok, failed.status) == (SOURCE, False, "failed")
    assert "API said 503" in failed.detail
    row = _row()
    assert row.enabled is True and row.state == {"hook_id": 1}


def test_reconcile_leaves_enabled_orphans_alone(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    registry.unregister(SOURCE)
    fake.calls.clear()
    result = lifecycle.reconcile()
    assert result.results == []
    assert fake.calls == []
    assert _row().declared is False


# -- enable ------------------------------------------------------------------------------------


def test_enable_needs_an_address_before_anything_changes(fake: FakeProvider) -> None:
    _synced(base_url=None)
    with pytest.raises(NoAddress, match="reconcile_trigger_sources --base-url"):
        lifecycle.enable(SOURCE)
    row = _row()
    assert (row.enabled, row.status) == (False, None)
    assert fake.calls == []
    assert credentials.get_secret(SOURCE) is None


def test_enable_flips_on_then_sets_up_with_our_secret(fake: FakeProvider) -> None:
    _synced()
    result = lifecycle.enable(SOURCE)
    assert (result.ok, result.changed, result.enabled, result.status) == (
        True,
        True,
        True,
        "registered",
    )
    assert result.detail == f"Hook 1 registered to post to {BASE}/hooks/{SOURCE}/."
    row = _row()
    assert (row.enabled, row.status, row.state) == (True, "registered", {"hook_id": 1})
    secret = credentials.get_secret(SOURCE)
    assert secret and fake.secrets_seen[SOURCE] == secret
    assert secret not in (row.detail or "") and secret not in json.dumps(row.state)

    # Enabling again sets up again, reusing the registration and the secret.
    again = lifecycle.enable(SOURCE)
    assert (again.ok, again.changed) == (True, False)
    assert fake.created == 1 and fake.count("setup") == 2
    assert credentials.get_secret(SOURCE) == secret


def test_enable_refuses_unknown_orphaned_and_uninstalled(fake: FakeProvider) -> None:
    _synced()
    with pytest.raises(UnknownTriggerSourceError):
        lifecycle.enable("nope")
    registry.unregister(SOURCE)
    _synced()
    with pytest.raises(SourceOrphaned):
        lifecycle.enable(SOURCE)
    assert _row().enabled is False

    TriggerSource.objects.filter(name=SOURCE).update(declared=True, provider="gone-provider")
    with pytest.raises(ProviderNotInstalled, match="gone-provider"):
        lifecycle.enable(SOURCE)
    assert _row().enabled is False
    assert fake.calls == []


def test_a_failed_setup_stays_enabled_failed_and_keeps_the_state(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    fake.fail_setup = "GitHub answered 422: hook exists"
    result = lifecycle.enable(SOURCE)
    assert (result.ok, result.enabled, result.status) == (False, True, "failed")
    assert result.detail == "Setup at fake failed: GitHub answered 422: hook exists"
    row = _row()
    assert (row.enabled, row.status, row.state) == (True, "failed", {"hook_id": 1})
    assert row.detail == result.detail

    fake.fail_setup = None
    assert lifecycle.enable(SOURCE).status == "registered"
    assert fake.created == 1


def test_a_first_setup_that_fails_stays_enabled(fake: FakeProvider) -> None:
    _synced()
    fake.fail_setup = "unreachable"
    result = lifecycle.enable(SOURCE)
    assert (result.ok, result.changed) == (False, True)
    row = _row()
    assert (row.enabled, row.status, row.state) == (True, "failed", None)


def test_an_unexpected_setup_error_is_recorded_without_its_text(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    _synced()

    def explode(*args: object) -> None:
        raise RuntimeError("token=ghp_should_not_show")

    monkeypatch.setattr(fake, "setup", explode)
    result = lifecycle.enable(SOURCE)
    assert result.status == "failed"
    assert "RuntimeError" in result.detail and "ghp_" not in result.detail
    assert "ghp_" not in (_row().detail or "")


def test_a_secret_the_provider_returns_is_stored_encrypted() -> None:
    stripe_like = FakeProvider("fake-returns", takes_secret=False, returns_secret="whsec_abc123")
    with installed_provider(stripe_like):
        webhook_source("lc-returns", provider="fake-returns", events={})
        try:
            _synced()
            result = lifecycle.enable("lc-returns")
        finally:
            registry.unregister("lc-returns")
    assert result.status == "registered"
    assert stripe_like.secrets_seen["lc-returns"] is None  # none of ours was sent
    assert credentials.get_secret("lc-returns") == "whsec_abc123"
    row = _row("lc-returns")
    assert "whsec_abc123" not in json.dumps([row.state, row.detail])


def test_a_manual_provider_gets_instructions() -> None:
    manual = FakeProvider("fake-manual", manages_registration=False, takes_secret=False)
    with installed_provider(manual):
        webhook_source("lc-manual", provider="fake-manual", events={})
        try:
            _synced()
            result = lifecycle.enable("lc-manual")
            assert (result.status, result.ok) == ("manual", True)
            assert f"{BASE}/hooks/lc-manual/" in result.detail
            off = lifecycle.disable("lc-manual")
        finally:
            registry.unregister("lc-manual")
    assert (off.status, off.enabled) == ("off", False)
    assert "by hand" in off.detail


# -- disable -----------------------------------------------------------------------------------


class _Watching(FakeProvider):
    """Records, at teardown time, what every other process would see of the source."""

    seen: list[tuple[bool, object]]

    def teardown(self, source: TriggerSource) -> None:
        fresh = TriggerSource.objects.get(name=source.name)
        self.seen.append((fresh.enabled, TriggerSource.objects.receivable(source.name)))
        super().teardown(source)


def test_disable_flips_off_first_then_tears_down_and_clears_state() -> None:
    watching = _Watching("fake-watch")
    watching.seen = []
    with installed_provider(watching):
        webhook_source("lc-watch", provider="fake-watch", events={})
        try:
            _synced()
            lifecycle.enable("lc-watch")
            result = lifecycle.disable("lc-watch")
        finally:
            registry.unregister("lc-watch")
    # Already committed off (not receivable) while the provider was being called.
    assert watching.seen == [(False, None)]
    assert (result.ok, result.changed, result.enabled, result.status) == (True, True, False, "off")
    row = _row("lc-watch")
    assert (row.enabled, row.status, row.state) == (False, "off", None)
    assert watching.hooks == {}


def test_disabling_a_source_never_set_up_calls_no_provider(fake: FakeProvider) -> None:
    _synced()
    result = lifecycle.disable(SOURCE)
    assert (result.ok, result.changed, result.status) == (True, False, "off")
    assert fake.calls == []


def test_a_failed_teardown_keeps_state_and_reenabling_reuses_it(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    fake.fail_teardown = "GitHub answered 502"
    result = lifecycle.disable(SOURCE)
    assert (result.ok, result.enabled, result.status) == (False, False, "failed")
    assert "GitHub answered 502" in result.detail and "refused" in result.detail
    row = _row()
    assert (row.enabled, row.state) == (False, {"hook_id": 1})
    assert TriggerSource.objects.receivable(SOURCE) is None

    fake.fail_teardown = None
    assert lifecycle.enable(SOURCE).status == "registered"
    assert fake.created == 1 and len(fake.hooks) == 1  # never a second registration
    assert lifecycle.disable(SOURCE).ok
    assert fake.hooks == {}


def test_disable_with_the_provider_gone_keeps_state(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    TriggerSource.objects.filter(name=SOURCE).update(provider="gone-provider")
    result = lifecycle.disable(SOURCE)
    assert (result.ok, result.enabled, result.status) == (False, False, "failed")
    assert "not installed" in result.detail
    assert _row().state == {"hook_id": 1}


# -- teardown / forget -------------------------------------------------------------------------


def test_teardown_tears_down_and_deletes_the_row_and_secret(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    TriggerEvent.objects.create(
        source=_row(), source_name=SOURCE, delivery_id="d1", event="push", payload={}
    )
    result = lifecycle.teardown(SOURCE)
    assert (result.ok, result.changed, result.status, result.enabled) == (True, True, None, None)
    assert not TriggerSource.objects.filter(name=SOURCE).exists()
    assert fake.hooks == {}
    assert credentials.get_secret(SOURCE) is None
    assert TriggerEvent.objects.get().source_name == SOURCE  # deliveries stay
    # Still declared: the next reconcile brings it back, off.
    lifecycle.reconcile()
    assert (_row().enabled, _row().state) == (False, None)


def test_a_failed_teardown_keeps_the_row(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    fake.fail_teardown = "timeout"
    result = lifecycle.teardown(SOURCE)
    assert (result.ok, result.changed, result.status) == (False, False, "failed")
    row = _row()
    assert (row.enabled, row.state) == (False, {"hook_id": 1})
    assert credentials.get_secret(SOURCE) is not None


def test_teardown_without_the_provider_is_refused_when_something_is_registered(
    fake: FakeProvider,
) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    TriggerSource.objects.filter(name=SOURCE).update(provider="gone-provider")
    with pytest.raises(ProviderNotInstalled):
        lifecycle.teardown(SOURCE)
    assert _row().enabled is True


def test_forget_deletes_only_an_orphan_and_asks_no_provider(fake: FakeProvider) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    with pytest.raises(SourceStillDeclared):
        lifecycle.forget(SOURCE)
    registry.unregister(SOURCE)
    _synced()
    fake.calls.clear()
    result = lifecycle.forget(SOURCE)
    assert (result.ok, result.changed) == (True, True)
    assert "hook_id=1" in result.detail and "not torn down" in result.detail
    assert fake.calls == []
    assert not TriggerSource.objects.filter(name=SOURCE).exists()
    assert credentials.get_secret(SOURCE) is None
    with pytest.raises(UnknownTriggerSourceError):
        lifecycle.forget(SOURCE)


# -- leases and races --------------------------------------------------------------------------


def test_operations_hold_the_source_lease(fake: FakeProvider) -> None:
    _synced()
    seen: list[bool] = []
    original = fake.setup

    def setup(source: TriggerSource, url: str, secret: str | None) -> object:
        seen.append(Lease.objects.current(lifecycle.lease_key(SOURCE)) is not None)
        return original(source, url, secret)

    fake.setup = setup  # type: ignore[method-assign]
    lifecycle.enable(SOURCE)
    assert seen == [True]
    assert Lease.objects.current(lifecycle.lease_key(SOURCE)) is None  # released


def test_a_busy_source_is_reported_after_the_wait(fake: FakeProvider) -> None:
    _synced()
    gate = threading.Event()
    fake.setup_gate = gate

    first = start_thread(lambda: lifecycle.enable(SOURCE))
    try:
        assert fake.setup_entered.wait(60)
        with pytest.raises(SourceBusy, match="busy"):
            lifecycle.disable(SOURCE, wait=0.3)
    finally:
        gate.set()
        first.join(60)
    assert (_row().enabled, _row().status) == (True, "registered")


def test_concurrent_enables_in_threads_register_once(fake: FakeProvider) -> None:
    _synced()
    count = 4

    # Widen the race: a setup waits (up to 2 s) for every thread to be in setup too. Without
    # the lease they all would be, each seeing no registration yet; with it, none is.
    entered = threading.Condition()
    inside = [0]
    original = fake.setup

    def setup(source: TriggerSource, url: str, secret: str | None) -> object:
        with entered:
            inside[0] += 1
            entered.notify_all()
            entered.wait_for(lambda: inside[0] >= count, timeout=2)
        return original(source, url, secret)

    fake.setup = setup  # type: ignore[method-assign]
    results = race([lambda: lifecycle.enable(SOURCE, wait=120)] * count, timeout=180)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert fake.created == 1 and len(fake.hooks) == 1
    assert inside[0] == count  # each one set up, the later ones reusing the hook
    assert _row().status == "registered"


_ENABLE_CHILD = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django_leases.testing.providers import FakeProvider, installed_provider
    from django_leases.triggers import lifecycle
    from django_leases.triggers.registry import webhook_source
    with installed_provider(FakeProvider("fake", ledger=sys.argv[1])):
        webhook_source("lc-hooks", provider="fake", events={})
        result = lifecycle.enable("lc-hooks", wait=240)
    print(result.status)
    """
)


@pytest.mark.slow
@pytest.mark.postgres_only
def test_concurrent_enables_in_processes_register_once(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    ledger = tmp_path / "fake-provider.json"
    enable = [sys.executable, "-c", _ENABLE_CHILD, str(ledger)]
    with fake_sources(SOURCE, ledger=ledger) as shared:
        _synced()
        for child in run_at_once([enable] * 4, env=subprocess_env):
            assert child.returncode == 0, child.stderr
            assert child.stdout.strip() == "registered"
        assert shared.created == 1 and len(shared.hooks) == 1
    row = _row()
    assert (row.enabled, row.status, row.state) == (True, "registered", {"hook_id": 1})


# A receiving process: reads "post <delivery id>" lines, posts a signed delivery to the
# receive view with Django's test client, prints the status code.
_RECEIVER_CHILD = textwrap.dedent(
    """
    import json
    import sys
    import django
    django.setup()
    from django.test import Client
    from django_leases.testing.providers import FakeProvider, installed_provider
    from django_leases.triggers.registry import webhook_source
    client = Client()
    fake = FakeProvider("fake")
    with installed_provider(fake):
        webhook_source("lc-hooks", provider="fake", events={})
        print("ready", flush=True)
        for line in sys.stdin:
            delivery = line.split()[1]
            body = json.dumps({"n": delivery}).encode()
            response = client.post(
                "/hooks/lc-hooks/",
                data=body,
                content_type="application/json",
                HTTP_X_FAKE_EVENT="push",
                HTTP_X_FAKE_DELIVERY=delivery,
                HTTP_X_FAKE_SIGNATURE=fake.sign(sys.argv[1], body),
            )
            print(response.status_code, flush=True)
    """
)


@pytest.mark.slow
def test_disabling_stops_receiving_in_another_process_at_once(
    fake: FakeProvider, subprocess_env: dict[str, str]
) -> None:
    _synced()
    lifecycle.enable(SOURCE)
    secret = credentials.get_secret(SOURCE)
    assert secret
    child = start_process(
        [sys.executable, "-c", _RECEIVER_CHILD, secret], env=subprocess_env, stdin=True
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"

        def post(delivery: str) -> str:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(f"post {delivery}\n")
            child.stdin.flush()
            return child.stdout.readline().strip()

        assert post("d-1") == "202"
        lifecycle.disable(SOURCE)
        assert post("d-2") == "404"  # the same, still-running process refuses at once
        lifecycle.enable(SOURCE)
        assert post("d-3") == "202"
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=60)
    assert sorted(TriggerEvent.objects.values_list("delivery_id", flat=True)) == ["d-1", "d-3"]


# -- a signing secret stored by hand ------------------------------------------------------------


@pytest.fixture
def by_hand() -> Iterator[str]:
    """A declared ``manual`` source, synced with an address, off."""
    name = "lc-by-hand"
    webhook_source(name, provider="manual", events={})
    try:
        lifecycle.reconcile(base_url=BASE)
        yield name
    finally:
        registry.unregister(name)


def test_storing_a_secret_records_a_manual_source_s_instructions_again(by_hand: str) -> None:
    lifecycle.enable(by_hand)
    assert "Then store its signing secret" in _row(by_hand).detail
    assert lifecycle.store_secret(by_hand, "typed-by-the-operator") is True
    assert credentials.get_secret(by_hand) == "typed-by-the-operator"
    detail = _row(by_hand).detail
    assert f"signing secret stored for source {by_hand!r}" in detail
    assert "Then store" not in detail and "typed-by-the-operator" not in detail
    assert _row(by_hand).status == "manual"


def test_storing_a_secret_leaves_sources_that_are_off_or_not_manual(
    by_hand: str, fake: FakeProvider
) -> None:
    assert lifecycle.store_secret(by_hand, "for-an-off-source") is False
    assert _row(by_hand).detail in ("", None) and _row(by_hand).status is None
    _synced()
    lifecycle.enable(SOURCE)
    setups, before = len(fake.calls), _row(SOURCE).detail
    assert lifecycle.store_secret(SOURCE, "for-a-registered-one") is False
    assert len(fake.calls) == setups and _row(SOURCE).detail == before
    assert credentials.get_secret(SOURCE) == "for-a-registered-one"


def test_a_busy_source_gets_the_secret_and_its_instructions_at_the_next_reconcile(
    by_hand: str,
) -> None:
    lifecycle.enable(by_hand)
    with hold_lease(lifecycle.lease_key(by_hand), using="default"):
        # Another operation holds the source: the secret is stored, not the instructions.
        assert lifecycle.store_secret(by_hand, "stored-while-busy", wait=0) is False
    assert credentials.get_secret(by_hand) == "stored-while-busy"
    assert "Then store its signing secret" in _row(by_hand).detail
    lifecycle.reconcile(base_url=BASE)
    assert f"signing secret stored for source {by_hand!r}" in _row(by_hand).detail


def test_store_secret_never_sets_up_a_source_that_moved_off_manual() -> None:
    """A manual source, enabled (status ``manual``), whose declaration a deploy moved to a
    provider that manages registrations: the sync keeps ``status`` (it never touches it),
    so the row is provider=fake (GitHub-like), status=manual until the next setup. Storing
    a secret by hand must not set it up at that provider (docstring: "Other sources are
    left as they are (GitHub's is sent the stored secret at its next enable)")."""
    name = "lc-moved"
    with installed_provider(FakeProvider("fake")) as fake:
        webhook_source(name, provider="manual", events={})
        try:
            lifecycle.reconcile(base_url=BASE)
            lifecycle.enable(name)
            assert TriggerSource.objects.get(name=name).status == "manual"
            registry.unregister(name)
            webhook_source(name, provider="fake", events={})
            # The deploy's sync (reconcile's first step; its setup may be skipped: busy).
            TriggerSource.objects.sync(registry.declarations(), base_url=BASE)
            row = TriggerSource.objects.get(name=name)
            assert (row.provider, row.status, row.enabled) == ("fake", "manual", True)
            lifecycle.store_secret(name, "typed-by-hand-123")
            assert credentials.get_secret(name) == "typed-by-hand-123"
            # No provider call: this is not a manual source any more.
            assert fake.calls == []
        finally:
            registry.unregister(name)
