"""No registration left at a provider after a setup whose answer was lost.

A setup can fail *after* the provider created a registration (its answer lost: a proxy's
page, a timeout after GitHub or Stripe did the work). When the row still records an earlier
registration that is gone (deleted behind our back, or the old repository's hook the setup
itself deleted), that stale state is all the row knows. A disable or teardown then removes
the recorded one (a 404 counts as done) and also looks for one the provider holds for the
source's address, so nothing is left posting to it while the operator is told it was
removed. The Orphans view offers the teardown for an orphan whose first setup lost its
answer (no state recorded), as ``lifecycle.teardown`` would find that hook too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from django_leases.models import TriggerSource
from django_leases.triggers import lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from tests.test_trigger_lifecycle_edges import MisbehavingGitHub, _serving
from tests.test_triggers_providers import (  # noqa: F401  (fixtures)
    REPO,
    STRIPE_KEY,
    TOKEN,
    FakeStripe,
    declared,
    httpserver_listen_address,
)

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://app.example.com"
NAME = "gh-source"


@pytest.fixture
def gh(httpserver: HTTPServer, settings: Any, declared: None) -> Iterator[MisbehavingGitHub]:  # noqa: F811
    fake = MisbehavingGitHub()
    _serving(httpserver, settings, fake, GITHUB_API_URL="URL", GITHUB_TOKEN=TOKEN)
    yield fake
    fake.hang.set()


def _row() -> TriggerSource:
    return TriggerSource.objects.get(name=NAME)


def _lost_create_after_the_recorded_hook_vanished(gh: MisbehavingGitHub) -> int:
    assert lifecycle.enable(NAME).ok
    [old] = gh.all_hooks()
    gh.hooks[REPO].clear()  # someone deletes the hook in GitHub's settings
    gh.after["POST"] = Response("<html>502 upstream reset</html>", status=201)
    again = lifecycle.enable(NAME)  # PATCH 404, nothing at the URL, POST made, answer lost
    assert not again.ok
    [new] = gh.all_hooks()
    assert new["id"] != old["id"]
    assert _row().state == {"hook_id": old["id"], "repository": REPO}  # stale state kept
    return int(new["id"])


def test_disable_after_a_lost_create_with_a_stale_state_leaves_no_hook(
    gh: MisbehavingGitHub,
) -> None:
    _lost_create_after_the_recorded_hook_vanished(gh)
    result = lifecycle.disable(NAME)
    assert result.ok and gh.all_hooks() == [], (result, gh.all_hooks())


def test_teardown_after_a_lost_create_with_a_stale_state_leaves_no_hook(
    gh: MisbehavingGitHub,
) -> None:
    _lost_create_after_the_recorded_hook_vanished(gh)
    result = lifecycle.teardown(NAME)
    # the row (and the only record of the source) is gone: the hook must be too
    assert result.ok and gh.all_hooks() == [], (result, gh.all_hooks())


def test_disable_after_a_repository_move_whose_create_was_lost_leaves_no_hook(
    gh: MisbehavingGitHub,
) -> None:
    """The declaration moves to another repository: setup deletes the old repository's hook,
    then creates one on the new repository whose answer is lost. The row still records the
    deleted hook; disabling must not leave the new one behind."""
    assert lifecycle.enable(NAME).ok
    registry.unregister(NAME)
    webhook_source(
        NAME,
        provider="github",
        config={"repository": "octo-org/other-repo"},
        events={"push": StartWorkflow("w"), "pull_request": StartWorkflow("w"), "ping": print},
    )
    TriggerSource.objects.sync(registry.declarations(), base_url=BASE)
    gh.after["POST"] = Response("<html>502 upstream reset</html>", status=201)
    assert not lifecycle.enable(NAME).ok
    assert [h["config"]["url"] for h in gh.hooks.get("octo-org/other-repo", {}).values()]
    result = lifecycle.disable(NAME)
    assert result.ok and gh.all_hooks() == [], (result, gh.all_hooks(), _row().state)


class StripeLosingOneCreateAnswer(FakeStripe):
    """The fake Stripe; once ``lose_next_create`` is set, the next endpoint creation is made
    but answered with a proxy's error page (its answer, and the secret in it, lost)."""

    lose_next_create = False

    def handle(self, request: Any) -> Response:
        response = super().handle(request)
        if (
            self.lose_next_create
            and request.method == "POST"
            and request.path == "/v1/webhook_endpoints"
        ):
            self.lose_next_create = False
            return Response("<html>502 Bad Gateway</html>", status=502)
        return response


@pytest.fixture
def st(httpserver: HTTPServer, settings: Any, declared: None) -> StripeLosingOneCreateAnswer:  # noqa: F811
    fake = StripeLosingOneCreateAnswer()
    _serving(httpserver, settings, fake, STRIPE_API_URL="URL", STRIPE_API_KEY=STRIPE_KEY)
    return fake


def test_stripe_disable_after_a_lost_create_with_a_stale_state_leaves_no_endpoint(
    st: StripeLosingOneCreateAnswer,
) -> None:
    """Stripe: the recorded endpoint was deleted in the Dashboard; enabling again creates a
    new one whose answer is lost (state keeps the deleted id). Disabling then deletes only the
    deleted id and reports the source off, leaving the new endpoint at Stripe — one whose
    secret nobody has, posting to our address."""
    assert lifecycle.enable("stripe-source").ok
    st.endpoints.clear()  # deleted in Stripe's Dashboard
    st.lose_next_create = True
    assert not lifecycle.enable("stripe-source").ok
    assert len(st.endpoints) == 1
    result = lifecycle.disable("stripe-source")
    assert result.ok and st.endpoints == {}, (result, list(st.endpoints))


def test_the_orphans_view_tears_down_an_orphan_whose_setup_answer_was_lost(
    gh: MisbehavingGitHub,
) -> None:
    """A source whose first setup created its hook at GitHub but lost the answer (status
    ``failed``, no state) then leaves the code: an orphan. The Orphans view's bulk *Tear
    down* finds and removes that hook (it offered only *Forget*, which leaves it)."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    gh.after["POST"] = Response("<html>502 upstream reset</html>", status=201)
    assert not lifecycle.enable(NAME).ok
    assert _row().state is None and len(gh.all_hooks()) == 1
    registry.unregister(NAME)
    TriggerSource.objects.sync(registry.declarations(), base_url=BASE)
    assert not _row().declared

    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.post(
        reverse("admin:django_leases_orphantriggersource_changelist"),
        {"action": "teardown_sources", "_selected_action": [str(_row().pk)], "index": 0},
    )
    assert response.status_code == 302
    assert gh.all_hooks() == [], [str(m) for m in response.wsgi_request._messages]
