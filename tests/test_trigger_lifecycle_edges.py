"""The trigger-source lifecycle in a bad week, against the stateful fakes of GitHub and Stripe
of ``test_triggers_providers`` (pytest-httpserver): a create whose answer was lost, a rate
limit, a declaration that moves to another provider, a lease lost mid-setup, an endpoint
Stripe disabled, a secret set by hand for a Stripe source, GitHub's 422 reasons. What the
operator is told is true, and no registration is left at a provider unrecorded."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from django_leases.exceptions import LeaseLostError
from django_leases.models import Lease, TriggerSource
from django_leases.triggers import lifecycle, registry
from django_leases.triggers.providers import GitHubProvider
from django_leases.triggers.registry import StartWorkflow, webhook_source
from tests.test_triggers_providers import (  # noqa: F401  (fixtures)
    REPO,
    STRIPE_KEY,
    TOKEN,
    FakeGitHub,
    FakeStripe,
    declared,
    httpserver_listen_address,
)

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://app.example.com"
NAME = "gh-source"


class MisbehavingGitHub(FakeGitHub):
    """The fake GitHub, plus ways to misbehave on the next matching request."""

    def __init__(self) -> None:
        super().__init__()
        #: (method, answer) pairs: the first request of that method gets this answer
        #: *after* the fake has done the work (or instead of it, with ``before=True``).
        self.after: dict[str, Response] = {}
        self.before: dict[str, Response] = {}

    def handle(self, request: Request) -> Response:
        if request.method in self.before:
            return self.before.pop(request.method)
        response = super().handle(request)
        if request.method in self.after:
            return self.after.pop(request.method)
        return response


def _serving(httpserver: HTTPServer, settings: Any, fake: Any, **api: str) -> None:
    """``fake`` answers every request; ``api``: the settings naming its URL and credential
    (``"URL"`` for the server's own); the declared sources synced."""
    httpserver.expect_request(re.compile(".*")).respond_with_handler(fake.handle)
    url = httpserver.url_for("/")
    settings.DJANGO_LEASES = {
        **{name: url if value == "URL" else value for name, value in api.items()},
        "PROVIDER_TIMEOUT": 5.0,
    }
    TriggerSource.objects.sync(registry.declarations(), base_url=BASE)


@pytest.fixture
def gh(httpserver: HTTPServer, settings: Any, declared: None) -> Iterator[MisbehavingGitHub]:  # noqa: F811
    fake = MisbehavingGitHub()
    _serving(httpserver, settings, fake, GITHUB_API_URL="URL", GITHUB_TOKEN=TOKEN)
    yield fake
    fake.hang.set()


def _row() -> TriggerSource:
    return TriggerSource.objects.get(name=NAME)


def test_disable_after_a_create_whose_answer_was_lost_removes_the_hook_at_github(
    gh: MisbehavingGitHub,
) -> None:
    """GitHub creates the hook but its 201 is not JSON (a proxy's page, a cut body): setup
    fails with no state recorded. Disabling after that failed setup looks for a hook posting
    to the source's address and removes it. (Before, it called nobody and said the
    registration was removed, while the hook stayed at GitHub, unrecorded.)"""
    gh.after["POST"] = Response("<html>upstream reset</html>", status=201)
    first = lifecycle.enable(NAME)
    assert not first.ok and _row().status == "failed"
    assert len(gh.all_hooks()) == 1  # created at GitHub all the same

    result = lifecycle.disable(NAME)
    row = _row()
    # the teardown looks for the hook posting to our URL (as setup does)
    # and removes it; failing that, the operator is not told it was removed.
    assert gh.all_hooks() == [], (result, row.status, row.detail)


def test_a_github_rate_limit_is_not_reported_as_missing_rights(gh: MisbehavingGitHub) -> None:
    """GitHub answers a (secondary) rate limit with 403 and ``Retry-After``: the operator is
    told it is a rate limit and when to try again, not that the token lacks rights."""
    gh.before["GET"] = Response(
        json.dumps(
            {
                "message": "You have exceeded a secondary rate limit. Please wait a few minutes "
                "before you try again.",
                "documentation_url": "https://docs.github.com/rest/overview/rate-limits",
            }
        ),
        status=403,
        headers={"Retry-After": "60", "X-RateLimit-Remaining": "0"},
        content_type="application/json",
    )
    result = lifecycle.enable(NAME)
    assert not result.ok
    detail = _row().detail or ""
    # "rate-limited (403): retry after 60 s", not a false diagnosis.
    assert "lack the rights" not in detail, detail


def test_a_source_moved_to_another_provider_is_torn_down_at_the_former_one(
    gh: MisbehavingGitHub,
) -> None:
    """An enabled, registered GitHub source whose declaration moves to ``manual``: the sync
    keeps the GitHub registration as ``state["previous"]``, and the next reconcile tears it
    down before setting the source up at ``manual``. (Before, the hook stayed at GitHub,
    posting to a source that refused it, and its id was lost.)"""
    assert lifecycle.enable(NAME).ok
    [hook] = gh.all_hooks()
    assert _row().state == {"hook_id": hook["id"], "repository": REPO}

    registry.unregister(NAME)
    webhook_source(NAME, provider="manual", events={"push": StartWorkflow("w")})
    reconciled = lifecycle.reconcile(base_url=BASE)
    row = _row()
    assert (row.provider, row.status) == ("manual", "manual"), reconciled
    # Either the old registration is torn down, or it is still recorded somewhere an
    # operator (and teardown) can find it.
    assert gh.all_hooks() == [] or row.state == {"hook_id": hook["id"], "repository": REPO}, (
        gh.all_hooks(),
        row.state,
        row.detail,
    )


def test_a_lease_lost_mid_setup_fails_that_source_and_reconciles_the_others(
    gh: MisbehavingGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator force-releases a source's lease (the Leases admin) while a slow GitHub
    setup runs under it: the fenced write's ``LeaseLostError`` fails that source only, and
    the sources after it are reconciled (before, the command died with a traceback)."""
    from django.core.management import CommandError, call_command

    assert lifecycle.enable(NAME).ok
    assert lifecycle.enable("manual-source").status == "manual"
    original = GitHubProvider.setup

    def slow_setup(self: GitHubProvider, source: TriggerSource, url: str, secret: str | None):  # type: ignore[no-untyped-def]
        Lease.objects.force_release(lifecycle.lease_key(NAME))
        return original(self, source, url, secret)

    monkeypatch.setattr(GitHubProvider, "setup", slow_setup)
    TriggerSource.objects.filter(name="manual-source").update(detail="stale")
    # a CommandError naming gh-source's failure; manual-source set up.
    with pytest.raises(CommandError):
        call_command("reconcile_trigger_sources", verbosity=0)
    assert TriggerSource.objects.get(name="manual-source").detail != "stale"


class StripeHonouringDisabled(FakeStripe):
    """The fake Stripe, honouring the update's ``disabled`` parameter as Stripe's API does
    (``POST /v1/webhook_endpoints/{id}`` with ``disabled=false`` enables the endpoint)."""

    def handle(self, request: Request) -> Response:
        response = super().handle(request)
        match = re.fullmatch(r"/v1/webhook_endpoints/([^/]+)", request.path)
        if match and request.method == "POST" and match.group(1) in self.endpoints:
            form = parse_qs(request.get_data(as_text=True))
            if "disabled" in form:
                disabled = form["disabled"][0] == "true"
                self.endpoints[match.group(1)]["status"] = "disabled" if disabled else "enabled"
        return response


@pytest.fixture
def st(httpserver: HTTPServer, settings: Any, declared: None) -> StripeHonouringDisabled:  # noqa: F811
    fake = StripeHonouringDisabled()
    _serving(httpserver, settings, fake, STRIPE_API_URL="URL", STRIPE_API_KEY=STRIPE_KEY)
    return fake


def test_enabling_again_enables_an_endpoint_stripe_disabled(
    st: StripeHonouringDisabled,
) -> None:
    """Stripe disables an endpoint whose deliveries kept failing (an outage on our side).
    Enabling the source again enables the endpoint (``disabled=false``, as GitHub's setup
    sends ``active: true``), so ``registered`` is true again."""
    assert lifecycle.enable("stripe-source").ok
    [endpoint] = st.endpoints.values()
    endpoint["status"] = "disabled"  # Stripe's doing, after days of failed deliveries

    result = lifecycle.enable("stripe-source")
    row = TriggerSource.objects.get(name="stripe-source")
    # the endpoint is enabled again (``disabled=false``), or the source
    # is not shown as a working registration.
    assert endpoint["status"] == "enabled" or row.status != "registered", (result, row.detail)


def test_set_secret_refuses_a_stripe_source(
    st: StripeHonouringDisabled,
) -> None:
    """``trigger_sources set-secret`` refuses a Stripe source: Stripe chose the secret it
    signs with, and another one stored here would refuse every delivery with no setup to
    mend it (the endpoint would be "updated", the wrong secret kept)."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    from django_leases.triggers import credentials

    assert lifecycle.enable("stripe-source").ok
    stripes = credentials.get_secret("stripe-source")
    # refused, as in the admin; the secret Stripe signs with is kept.
    with pytest.raises(CommandError):
        call_command("trigger_sources", "set-secret", "stripe-source", stdin=StringIO("oops\n"))
    assert credentials.get_secret("stripe-source") == stripes


def test_a_github_422_names_the_reason_github_gave(gh: MisbehavingGitHub) -> None:
    """GitHub's 422 says ``"Validation Failed"`` and puts the reason in ``errors[].message``
    (a declared event name GitHub does not know, a hook that already exists): the detail
    quotes it, so the operator can tell what to fix."""
    gh.before["POST"] = Response(
        json.dumps(
            {
                "message": "Validation Failed",
                "errors": [
                    {
                        "resource": "Hook",
                        "code": "custom",
                        "field": "events",
                        "message": '"pull_requests" is not a valid event name',
                    }
                ],
                "documentation_url": "https://docs.github.com/rest/webhooks/repos",
            }
        ),
        status=422,
        content_type="application/json",
    )
    result = lifecycle.enable(NAME)
    assert not result.ok
    # the detail names GitHub's reason.
    assert "is not a valid event name" in (_row().detail or ""), _row().detail


def test_disable_after_an_interrupted_setup_removes_the_hook_it_made(
    gh: MisbehavingGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first setup creates the hook at GitHub, then its row write is refused (the
    source's lease was force-released meanwhile): the source is left ``pending`` — "a
    setup … that was interrupted" — with no hook recorded. Disabling it then must remove
    that hook (as it does after a ``failed`` setup), or at least not report the source
    ``off`` with "its registration, if any, was removed" while the hook still posts to us."""
    original = GitHubProvider.setup

    def cut_short(self: GitHubProvider, source: TriggerSource, url: str, secret: str | None):  # type: ignore[no-untyped-def]
        outcome = original(self, source, url, secret)
        Lease.objects.force_release(lifecycle.lease_key(NAME))
        return outcome

    monkeypatch.setattr(GitHubProvider, "setup", cut_short)
    with pytest.raises(LeaseLostError):
        lifecycle.enable(NAME)
    monkeypatch.setattr(GitHubProvider, "setup", original)
    row = TriggerSource.objects.get(name=NAME)
    assert (row.enabled, row.status, row.state) == (True, "pending", None)
    assert len(gh.all_hooks()) == 1

    result = lifecycle.disable(NAME)
    assert result.ok and result.status == "off", result
    assert gh.all_hooks() == []


def test_a_deploy_moving_the_source_during_its_setup_keeps_the_hook_tracked(
    gh: MisbehavingGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy's ``reconcile_trigger_sources`` syncs the declarations without the source's
    lease; here it moves the source from ``github`` to ``manual`` while an operator's enable
    is creating its hook at GitHub. The sync keeps a former registration as
    ``state["previous"]`` so it is torn down before the new setup; the hook made meanwhile
    must end the same way: torn down at GitHub, or still recorded for teardown — never left
    there with no record of it."""
    original = GitHubProvider.setup

    def deploy_meanwhile(self: GitHubProvider, source: TriggerSource, url: str, secret: str | None):  # type: ignore[no-untyped-def]
        outcome = original(self, source, url, secret)
        registry.unregister(NAME)
        webhook_source(NAME, provider="manual", events={"push": StartWorkflow("w")})
        TriggerSource.objects.sync(registry.declarations(), base_url=BASE)
        return outcome

    monkeypatch.setattr(GitHubProvider, "setup", deploy_meanwhile)
    lifecycle.enable(NAME)
    monkeypatch.setattr(GitHubProvider, "setup", original)
    [hook] = gh.all_hooks()

    # the deploy's reconcile goes on to set the (now manual) source up
    lifecycle.reconcile(base_url=BASE)
    row = TriggerSource.objects.get(name=NAME)
    assert (row.provider, row.status) == ("manual", "manual"), (row.status, row.detail)
    assert gh.all_hooks() == [], (hook, row.state)
