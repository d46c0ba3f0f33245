"""Providers against local fake APIs (pytest-httpserver): GitHub hooks, Stripe endpoints.

The fakes keep state like the real APIs (hooks and endpoints can be listed, fetched, edited
and deleted, also "behind our back"), so the tests check what ends up registered, not only
which requests were sent. No test talks to the internet.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import re
import secrets
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest
from django.db import DatabaseError, connection
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from django_leases.models import TriggerSource
from django_leases.triggers import registry
from django_leases.triggers.credentials import set_secret
from django_leases.triggers.providers import (
    GitHubProvider,
    ManualProvider,
    ProviderError,
    SetupOutcome,
    StripeProvider,
    get_provider,
    provider_names,
)
from django_leases.triggers.providers import stripe as stripe_provider
from django_leases.triggers.providers.http import MIN_MASKED_RUN, mask
from django_leases.triggers.registry import StartWorkflow, webhook_source

TOKEN = "ghp_test_token_never_shown_0123456789"
STRIPE_KEY = "sk_test_key_never_shown_0123456789"
SIGNING = "our-signing-secret-never-shown"
URL = "https://app.example.com/hooks/gh-source/"
STRIPE_URL = "https://app.example.com/hooks/stripe-source/"
REPO = "octo-org/octo-repo"


@pytest.fixture(scope="session")
def httpserver_listen_address() -> tuple[str, int]:
    """IPv4 loopback: "localhost" may try ::1 first and wait on each connection."""
    return ("127.0.0.1", 0)


def _json(data: Any, status: int) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


class FakeGitHub:
    """Repository webhooks as GitHub's REST API keeps them (subset the provider uses)."""

    def __init__(self) -> None:
        self.hooks: dict[str, dict[int, dict[str, Any]]] = {}
        self.ids = itertools.count(1001)
        self.requests: list[tuple[str, str, Any]] = []
        self.fail: tuple[int, dict[str, Any]] | None = None
        self.hang = threading.Event()
        self.hanging = False

    def handle(self, request: Request) -> Response:
        body = json.loads(request.get_data() or b"null")
        self.requests.append((request.method, request.path, body))
        if self.hanging:
            self.hang.wait(10)
            return _json({}, 500)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _json({"message": "Bad credentials"}, 401)
        assert request.headers.get("Accept") == "application/vnd.github+json"
        assert request.headers.get("X-GitHub-Api-Version") == "2022-11-28"
        if self.fail is not None:
            return _json(self.fail[1], self.fail[0])
        match = re.fullmatch(r"(?:/api/v3)?/repos/([^/]+/[^/]+)/hooks(?:/(\d+))?", request.path)
        if match is None:
            return _json({"message": "Not Found"}, 404)
        repo, hook_id = match.group(1), match.group(2)
        hooks = self.hooks.setdefault(repo, {})
        if hook_id is None and request.method == "GET":
            return _json([self._shown(h) for h in hooks.values()], 200)
        if hook_id is None and request.method == "POST":
            assert body["name"] == "web"
            hook = {
                "type": "Repository",
                "id": next(self.ids),
                "name": "web",
                "active": body.get("active", True),
                "events": body.get("events", ["push"]),
                "config": dict(body["config"]),
            }
            hooks[hook["id"]] = hook
            return _json(self._shown(hook), 201)
        hook = hooks.get(int(hook_id)) if hook_id else None
        if hook is None:
            return _json({"message": "Not Found"}, 404)
        if request.method == "GET":
            return _json(self._shown(hook), 200)
        if request.method == "PATCH":
            hook["config"].update(body.get("config", {}))
            hook["events"] = body.get("events", hook["events"])
            hook["active"] = body.get("active", hook["active"])
            return _json(self._shown(hook), 200)
        if request.method == "DELETE":
            del hooks[int(hook_id)]
            return Response(status=204)
        return _json({"message": "Not Found"}, 404)

    @staticmethod
    def _shown(hook: dict[str, Any]) -> dict[str, Any]:
        config = dict(hook["config"])
        if "secret" in config:
            config["secret"] = "********"
        return {**hook, "config": config}

    def all_hooks(self) -> list[dict[str, Any]]:
        return [hook for hooks in self.hooks.values() for hook in hooks.values()]


class FakeStripe:
    """Stripe's webhook endpoints (form-encoded, HTTP Basic with the secret key)."""

    def __init__(self) -> None:
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        #: The ``Stripe-Version`` header of each request (``None`` when absent), in order.
        self.versions: list[str | None] = []
        self.fail: tuple[int, dict[str, Any]] | None = None

    def handle(self, request: Request) -> Response:
        form = parse_qs(request.get_data(as_text=True))
        self.requests.append((request.method, request.path, form))
        self.versions.append(request.headers.get("Stripe-Version"))
        expected = "Basic " + base64.b64encode(f"{STRIPE_KEY}:".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return _json({"error": {"message": "Invalid API Key provided: sk_test_****"}}, 401)
        if self.fail is not None:
            return _json(self.fail[1], self.fail[0])
        match = re.fullmatch(r"/v1/webhook_endpoints(?:/([^/]+))?", request.path)
        if match is None:
            return _json({"error": {"message": "Unrecognized request URL"}}, 404)
        endpoint_id = match.group(1)
        if endpoint_id is None and request.method == "GET":
            data = [self._shown(e) for e in self.endpoints.values()]
            return _json({"object": "list", "data": data, "has_more": False}, 200)
        if endpoint_id is None and request.method == "POST":
            endpoint = {
                "id": "we_" + secrets.token_hex(12),
                "object": "webhook_endpoint",
                "url": form["url"][0],
                "enabled_events": form["enabled_events[]"],
                "description": form.get("description", [None])[0],
                "metadata": {"trigger_source": form.get("metadata[trigger_source]", [""])[0]},
                "status": "enabled",
                "secret": "whsec_" + secrets.token_hex(16),
            }
            self.endpoints[endpoint["id"]] = endpoint
            return _json(endpoint, 200)
        endpoint = self.endpoints.get(endpoint_id or "")
        if endpoint is None:
            return _json(
                {
                    "error": {
                        "code": "resource_missing",
                        "message": f"No such webhook endpoint: '{endpoint_id}'",
                        "type": "invalid_request_error",
                    }
                },
                404,
            )
        if request.method == "GET":
            return _json(self._shown(endpoint), 200)
        if request.method == "POST":
            if "url" in form:
                endpoint["url"] = form["url"][0]
            if "enabled_events[]" in form:
                endpoint["enabled_events"] = form["enabled_events[]"]
            return _json(self._shown(endpoint), 200)
        if request.method == "DELETE":
            del self.endpoints[endpoint_id or ""]
            return _json({"id": endpoint_id, "object": "webhook_endpoint", "deleted": True}, 200)
        return _json({"error": {"message": "Unrecognized request URL"}}, 404)

    @staticmethod
    def _shown(endpoint: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in endpoint.items() if key != "secret"}


@pytest.fixture
def declared() -> Iterator[None]:
    webhook_source(
        "gh-source",
        provider="github",
        config={"repository": REPO},
        events={"push": StartWorkflow("w"), "pull_request": StartWorkflow("w"), "ping": print},
    )
    webhook_source(
        "stripe-source",
        provider="stripe",
        events={"invoice.paid": StartWorkflow("w"), "charge.succeeded": StartWorkflow("w")},
    )
    webhook_source(
        "manual-source",
        provider="manual",
        config={"signature": "stripe"},
        events={"checkout.session.completed": StartWorkflow("w")},
    )
    yield
    for name in ("gh-source", "stripe-source", "manual-source"):
        registry.unregister(name)


@pytest.fixture
def github(httpserver: HTTPServer, settings: Any, declared: None) -> Iterator[FakeGitHub]:
    fake = FakeGitHub()
    httpserver.expect_request(re.compile(".*")).respond_with_handler(fake.handle)
    settings.DJANGO_LEASES = {
        "GITHUB_API_URL": httpserver.url_for("/"),
        "GITHUB_TOKEN": TOKEN,
        "PROVIDER_TIMEOUT": 5.0,
    }
    yield fake
    fake.hang.set()


@pytest.fixture
def stripe(httpserver: HTTPServer, settings: Any, declared: None, db: None) -> Iterator[FakeStripe]:
    fake = FakeStripe()
    httpserver.expect_request(re.compile(".*")).respond_with_handler(fake.handle)
    settings.DJANGO_LEASES = {
        "STRIPE_API_URL": httpserver.url_for("/"),
        "STRIPE_API_KEY": STRIPE_KEY,
        "PROVIDER_TIMEOUT": 5.0,
    }
    return fake  # type: ignore[return-value]


def _gh_source(state: dict[str, Any] | None = None, **config: Any) -> TriggerSource:
    return TriggerSource(
        name="gh-source",
        provider="github",
        config={"repository": REPO, **config},
        state=state,
        base_url="https://app.example.com",
    )


def _stripe_source(state: dict[str, Any] | None = None) -> TriggerSource:
    return TriggerSource(
        name="stripe-source",
        provider="stripe",
        config={},
        state=state,
        base_url="https://app.example.com",
        label_prefix="shop-",
    )


def _pieces(secret: str, size: int = MIN_MASKED_RUN) -> list[str]:
    """Every run of ``size`` consecutive characters of ``secret``."""
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def _no_secret_in(*texts: object) -> None:
    """None of ``texts`` shows a secret, nor any 8 consecutive characters of one."""
    for text in texts:
        for secret in (TOKEN, STRIPE_KEY, SIGNING):
            for piece in _pieces(secret):
                assert piece.lower() not in str(text).lower(), (piece, str(text))


# -- the registry of providers ----------------------------------------------------------------


def test_the_three_providers_are_installed() -> None:
    assert provider_names() == ["github", "manual", "stripe"]
    assert isinstance(get_provider("github"), GitHubProvider)
    assert isinstance(get_provider("stripe"), StripeProvider)
    manual = get_provider("manual")
    assert isinstance(manual, ManualProvider) and not manual.manages_registration
    assert get_provider("nope") is None
    assert get_provider(None) is None  # type: ignore[arg-type]


def test_an_outcomes_repr_hides_the_secret() -> None:
    outcome = SetupOutcome(status="registered", state={"id": 1}, detail="d", secret="whsec_x")
    assert "whsec_x" not in repr(outcome)
    assert "***" in repr(outcome)


# -- manual -----------------------------------------------------------------------------------


def test_manual_setup_gives_instructions_with_the_url_and_events(declared: None, db: None) -> None:
    source = TriggerSource(
        name="manual-source", provider="manual", config={"signature": "stripe"}, state=None
    )
    url = "https://app.example.com/hooks/manual-source/"
    outcome = ManualProvider().setup(source, url, None)
    assert outcome.status == "manual"
    assert outcome.state is None and outcome.secret is None
    assert url in outcome.detail
    assert "checkout.session.completed" in outcome.detail
    assert "Stripe-Signature" in outcome.detail
    ManualProvider().teardown(source)  # nothing to remove: no error


def test_manual_check_names_the_url_from_the_known_address(declared: None, db: None) -> None:
    source = TriggerSource(
        name="manual-source", provider="manual", base_url="https://app.example.com"
    )
    outcome = ManualProvider().check(source)
    assert outcome.status == "manual"
    assert "https://app.example.com/hooks/manual-source/" in outcome.detail


def test_manual_instructions_ask_for_a_secret_only_where_none_is_set(
    declared: None, db: None, settings: Any
) -> None:
    """The instructions send the operator to store a signing secret only when deliveries
    have none; one already set (in settings, or stored) is named as the one to give the
    sender."""
    source = TriggerSource(name="manual-source", provider="manual")
    url = "https://app.example.com/hooks/manual-source/"

    def detail() -> str:
        return ManualProvider().setup(source, url, None).detail

    assert "Then store its signing secret" in detail()
    set_secret("manual-source", "chosen-by-hand")
    stored = detail()
    assert "signing secret stored for source 'manual-source'" in stored
    assert "Then store" not in stored and "WEBHOOK_SECRETS" not in stored
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"manual-source": "in-settings"}}
    from_settings = detail()
    assert "DJANGO_LEASES['WEBHOOK_SECRETS'] sets for source 'manual-source'" in from_settings
    assert "set-secret" not in from_settings and url in from_settings


def test_manual_stripe_style_instructions_never_ask_to_give_the_sender_a_secret(
    declared: None, db: None, settings: Any
) -> None:
    """A ``manual`` source signed Stripe style is an endpoint registered in Stripe's
    dashboard: the sender chooses its signing secret and shows it, nobody gives it one. The
    instructions say to store the one it shows, also when one is set already (registered
    again, it issues a new one)."""
    source = TriggerSource(name="manual-source", provider="manual", config={"signature": "stripe"})

    def detail() -> str:
        return ManualProvider().setup(source, "https://app.example.com/hooks/m/", None).detail

    assert "the one the sender shows." in detail()
    set_secret("manual-source", "whsec_previous_endpoint_secret")
    stored = detail()
    assert "Give it" not in stored and "one is stored: replace it if the sender" in stored
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"manual-source": "whsec_x"}}
    assert "Give it" not in detail() and "change it there if the sender" in detail()


def test_manual_setup_answers_when_the_credential_store_cannot_be_read(
    declared: None, db: None
) -> None:
    """The credential store only picks the wording of a ``manual`` setup's instructions: one
    that cannot be read (the database refused the query) gives the instructions that ask
    for a secret, not a failed setup."""

    def refuse_the_store(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "triggersecret" in sql.lower():
            raise DatabaseError("permission denied for table django_leases_triggersecret")
        return execute(sql, params, many, context)

    source = TriggerSource(name="manual-source", provider="manual")
    url = "https://app.example.com/hooks/manual-source/"
    with connection.execute_wrapper(refuse_the_store):
        outcome = ManualProvider().setup(source, url, None)
    assert outcome.status == "manual"
    assert url in outcome.detail and "Then store its signing secret" in outcome.detail


def test_manual_receives_with_the_configured_scheme() -> None:
    manual = ManualProvider()
    assert isinstance(manual.for_config({"signature": "stripe"}), ManualProvider)
    assert manual.for_config({"signature": "stripe"}).scheme == "stripe"  # type: ignore[attr-defined]
    assert manual.for_config({}) is manual
    with pytest.raises(ValueError, match="scheme"):
        ManualProvider("md5")


# -- GitHub -------------------------------------------------------------------------------------


def test_github_setup_creates_a_hook(github: FakeGitHub) -> None:
    outcome = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    [hook] = github.all_hooks()
    assert outcome.status == "registered"
    assert outcome.state == {"hook_id": hook["id"], "repository": REPO}
    assert outcome.secret is None
    assert hook["config"] == {
        "url": URL,
        "content_type": "json",
        "secret": SIGNING,
        "insecure_ssl": "0",
    }
    assert hook["events"] == ["pull_request", "push"]  # declared, without "ping"
    assert hook["active"] is True
    assert URL in outcome.detail and str(hook["id"]) in outcome.detail
    _no_secret_in(outcome, outcome.detail, outcome.state)
    json.dumps(outcome.state)


def test_github_resetup_updates_the_recorded_hook(github: FakeGitHub) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    new_url = "https://new.example.com/hooks/gh-source/"
    again = GitHubProvider().setup(_gh_source(first.state), new_url, "rotated-secret")
    [hook] = github.all_hooks()
    assert again.state == first.state
    assert hook["config"]["url"] == new_url
    assert hook["config"]["secret"] == "rotated-secret"
    assert [m for m, _, _ in github.requests].count("POST") == 1


def test_github_setup_without_state_reuses_a_hook_already_posting_to_the_url(
    github: FakeGitHub,
) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    # The state of that setup was never recorded (a crash between the API and the row).
    again = GitHubProvider().setup(_gh_source(None), URL, SIGNING)
    assert len(github.all_hooks()) == 1
    assert again.state == first.state
    assert "reused" in again.detail


def test_github_hook_deleted_behind_our_back_is_created_once(github: FakeGitHub) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    github.hooks[REPO].clear()
    again = GitHubProvider().setup(_gh_source(first.state), URL, SIGNING)
    [hook] = github.all_hooks()
    assert again.state == {"hook_id": hook["id"], "repository": REPO}
    assert again.state != first.state


def test_github_moved_repository_removes_the_old_hook(github: FakeGitHub) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    moved = _gh_source(first.state, repository="octo-org/other")
    again = GitHubProvider().setup(moved, URL, SIGNING)
    assert github.hooks[REPO] == {}
    assert list(github.hooks["octo-org/other"]) == [again.state["hook_id"]]  # type: ignore[index]


def test_github_insecure_ssl_from_config(github: FakeGitHub) -> None:
    GitHubProvider().setup(_gh_source(insecure_ssl=True), URL, SIGNING)
    assert github.all_hooks()[0]["config"]["insecure_ssl"] == "1"


def test_github_check_finds_the_hook_and_reports_it_gone(github: FakeGitHub) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    checked = GitHubProvider().check(_gh_source(first.state))
    assert checked.status == "registered" and checked.state == first.state
    github.hooks[REPO].clear()
    with pytest.raises(ProviderError, match="no longer exists"):
        GitHubProvider().check(_gh_source(first.state))
    with pytest.raises(ProviderError, match="no webhook is recorded"):
        GitHubProvider().check(_gh_source(None))


def test_github_teardown_deletes_and_already_gone_is_success(github: FakeGitHub) -> None:
    first = GitHubProvider().setup(_gh_source(), URL, SIGNING)
    GitHubProvider().teardown(_gh_source(first.state))
    assert github.all_hooks() == []
    GitHubProvider().teardown(_gh_source(first.state))  # 404: already gone
    calls = len(github.requests)
    GitHubProvider().teardown(_gh_source(None))  # nothing recorded: no call
    assert len(github.requests) == calls
    deletes = [r for r in github.requests if r[0] == "DELETE"]
    assert len(deletes) == 2


def test_github_enterprise_api_root_per_source(
    github: FakeGitHub, httpserver: HTTPServer, settings: Any
) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "GITHUB_API_URL": "http://127.0.0.1:9"}
    source = _gh_source(api_url=httpserver.url_for("/api/v3"))
    outcome = GitHubProvider().setup(source, URL, SIGNING)
    assert github.requests[-1][1] == f"/api/v3/repos/{REPO}/hooks"
    assert outcome.state is not None


def test_github_token_from_the_environment(
    github: FakeGitHub, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "GITHUB_TOKEN": None}
    monkeypatch.delenv("DJANGO_LEASES_GITHUB_TOKEN", raising=False)
    with pytest.raises(ProviderError, match="DJANGO_LEASES_GITHUB_TOKEN"):
        GitHubProvider().setup(_gh_source(), URL, SIGNING)
    assert github.requests == []
    monkeypatch.setenv("DJANGO_LEASES_GITHUB_TOKEN", TOKEN)
    assert GitHubProvider().setup(_gh_source(), URL, SIGNING).status == "registered"


@pytest.mark.parametrize(
    "config",
    [{}, {"repository": "no-slash"}, {"repository": "a/b/c"}, {"repository": "../.."}],
)
def test_github_needs_a_repository(github: FakeGitHub, config: dict[str, Any]) -> None:
    source = TriggerSource(name="gh-source", provider="github", config=config)
    with pytest.raises(ProviderError, match="repository"):
        GitHubProvider().setup(source, URL, SIGNING)
    assert github.requests == []


def test_github_setup_needs_our_secret(github: FakeGitHub) -> None:
    with pytest.raises(ProviderError, match="signing secret"):
        GitHubProvider().setup(_gh_source(), URL, None)


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (422, {"message": f"Validation Failed: config.secret {SIGNING} is bad"}, "422"),
        (500, {"message": "Server Error"}, "500"),
        (403, {"message": "Must have admin rights to Repository."}, "403"),
    ],
)
def test_github_api_errors_are_provider_errors_without_secrets(
    github: FakeGitHub, status: int, body: dict[str, Any], match: str, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    github.fail = (status, body)
    with pytest.raises(ProviderError, match=match) as caught:
        GitHubProvider().setup(_gh_source(), URL, SIGNING)
    _no_secret_in(caught.value, caught.value.args, caplog.text)
    with pytest.raises(ProviderError, match=match) as caught:
        GitHubProvider().teardown(_gh_source({"hook_id": 5, "repository": REPO}))
    assert TOKEN not in str(caught.value) + caplog.text


def test_github_bad_token_is_a_401_provider_error(github: FakeGitHub, settings: Any) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "GITHUB_TOKEN": "wrong-token-xyz"}
    with pytest.raises(ProviderError, match="401") as caught:
        GitHubProvider().check(_gh_source({"hook_id": 1, "repository": REPO}))
    assert "wrong-token-xyz" not in str(caught.value)


def test_github_timeout_is_a_provider_error(github: FakeGitHub, settings: Any) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "PROVIDER_TIMEOUT": 0.3}
    github.hanging = True
    try:
        with pytest.raises(ProviderError, match="did not answer") as caught:
            GitHubProvider().setup(_gh_source(), URL, SIGNING)
    finally:
        github.hang.set()
    _no_secret_in(caught.value)


def test_github_unreachable_api_is_a_provider_error(declared: None, settings: Any) -> None:
    settings.DJANGO_LEASES = {"GITHUB_API_URL": "http://127.0.0.1:9", "GITHUB_TOKEN": TOKEN}
    with pytest.raises(ProviderError, match="reaching the API") as caught:
        GitHubProvider().setup(_gh_source(), URL, SIGNING)
    _no_secret_in(caught.value)


# -- Stripe -------------------------------------------------------------------------------------


def test_stripe_setup_creates_an_endpoint_and_hands_back_its_secret(stripe: FakeStripe) -> None:
    outcome = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    [endpoint] = stripe.endpoints.values()
    assert outcome.status == "registered"
    assert outcome.state == {"endpoint_id": endpoint["id"]}
    assert outcome.secret == endpoint["secret"]
    assert endpoint["url"] == STRIPE_URL
    assert endpoint["enabled_events"] == ["charge.succeeded", "invoice.paid"]
    assert endpoint["description"] == "shop-stripe-source"
    assert endpoint["metadata"] == {"trigger_source": "stripe-source"}
    assert endpoint["secret"] not in outcome.detail + repr(outcome) + json.dumps(outcome.state)
    method, path, form = stripe.requests[-1]
    assert (method, path) == ("POST", "/v1/webhook_endpoints")
    assert form["enabled_events[]"] == ["charge.succeeded", "invoice.paid"]


def test_stripe_resetup_updates_the_endpoint_whose_secret_we_keep(stripe: FakeStripe) -> None:
    first = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    set_secret("stripe-source", first.secret or "")
    new_url = "https://new.example.com/hooks/stripe-source/"
    again = StripeProvider().setup(_stripe_source(first.state), new_url, None)
    [endpoint] = stripe.endpoints.values()
    assert again.state == first.state
    assert again.secret is None  # the stored one stays valid
    assert endpoint["url"] == new_url


def test_stripe_endpoint_whose_secret_is_lost_is_replaced(stripe: FakeStripe) -> None:
    first = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    # No secret stored (say the store was wiped): Stripe never shows it again.
    again = StripeProvider().setup(_stripe_source(first.state), STRIPE_URL, None)
    [endpoint] = stripe.endpoints.values()
    assert again.state == {"endpoint_id": endpoint["id"]} != first.state
    assert again.secret == endpoint["secret"] != first.secret


def test_stripe_endpoint_deleted_behind_our_back_is_created_once(stripe: FakeStripe) -> None:
    first = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    set_secret("stripe-source", first.secret or "")
    stripe.endpoints.clear()
    again = StripeProvider().setup(_stripe_source(first.state), STRIPE_URL, None)
    [endpoint] = stripe.endpoints.values()
    assert again.state == {"endpoint_id": endpoint["id"]}
    assert again.secret == endpoint["secret"]


def test_stripe_setup_without_state_never_leaves_two_endpoints(stripe: FakeStripe) -> None:
    StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    again = StripeProvider().setup(_stripe_source(None), STRIPE_URL, None)
    [endpoint] = stripe.endpoints.values()
    assert again.state == {"endpoint_id": endpoint["id"]}


def test_stripe_check(stripe: FakeStripe) -> None:
    first = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    checked = StripeProvider().check(_stripe_source(first.state))
    assert checked.status == "registered" and checked.secret is None
    endpoint_id = first.state["endpoint_id"]  # type: ignore[index]
    stripe.endpoints[endpoint_id]["status"] = "disabled"
    with pytest.raises(ProviderError, match="disabled"):
        StripeProvider().check(_stripe_source(first.state))
    stripe.endpoints.clear()
    with pytest.raises(ProviderError, match="no longer exists"):
        StripeProvider().check(_stripe_source(first.state))
    with pytest.raises(ProviderError, match="no webhook endpoint is recorded"):
        StripeProvider().check(_stripe_source(None))


def test_stripe_teardown_deletes_and_already_gone_is_success(stripe: FakeStripe) -> None:
    first = StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    StripeProvider().teardown(_stripe_source(first.state))
    assert stripe.endpoints == {}
    StripeProvider().teardown(_stripe_source(first.state))
    calls = len(stripe.requests)
    StripeProvider().teardown(_stripe_source(None))
    assert len(stripe.requests) == calls


def test_stripe_all_events_when_declared_star(stripe: FakeStripe) -> None:
    webhook_source("stripe-all", provider="stripe", events={"*": StartWorkflow("w")})
    try:
        source = TriggerSource(name="stripe-all", provider="stripe", config={})
        StripeProvider().setup(source, STRIPE_URL, None)
        assert next(iter(stripe.endpoints.values()))["enabled_events"] == ["*"]
    finally:
        registry.unregister("stripe-all")


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (401, {"error": {"message": f"Invalid API Key provided: {STRIPE_KEY}"}}, "401"),
        (422, {"error": {"message": "Invalid URL"}}, "422"),
        (500, {"error": {"message": "An unknown error occurred"}}, "500"),
        (400, {"error": {"message": "Invalid array"}}, "400"),
    ],
)
def test_stripe_api_errors_are_provider_errors_without_secrets(
    stripe: FakeStripe, status: int, body: dict[str, Any], match: str, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    stripe.fail = (status, body)
    with pytest.raises(ProviderError, match=match) as caught:
        StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    _no_secret_in(caught.value, caplog.text)
    with pytest.raises(ProviderError, match=match) as caught:
        StripeProvider().teardown(_stripe_source({"endpoint_id": "we_1"}))
    _no_secret_in(caught.value, caplog.text)


def test_stripe_timeout_is_a_provider_error(
    httpserver: HTTPServer, settings: Any, declared: None, db: None
) -> None:
    released = threading.Event()

    def hang(request: Request) -> Response:
        released.wait(10)
        return _json({}, 500)

    httpserver.expect_request(re.compile(".*")).respond_with_handler(hang)
    settings.DJANGO_LEASES = {
        "STRIPE_API_URL": httpserver.url_for("/"),
        "STRIPE_API_KEY": STRIPE_KEY,
        "PROVIDER_TIMEOUT": 0.3,
    }
    try:
        with pytest.raises(ProviderError, match="did not answer") as caught:
            StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    finally:
        released.set()
    _no_secret_in(caught.value)


def _every_stripe_call(stripe: FakeStripe) -> set[tuple[str, str]]:
    """Make the provider send each kind of request it has; returns (method, path) sent."""
    provider = StripeProvider()
    first = provider.setup(_stripe_source(), STRIPE_URL, None)  # list, create
    # No secret stored for it: retrieve, delete, list, create.
    second = provider.setup(_stripe_source(first.state), STRIPE_URL, None)
    set_secret("stripe-source", second.secret or "")
    provider.setup(_stripe_source(second.state), STRIPE_URL, None)  # retrieve, update
    provider.check(_stripe_source(second.state))  # retrieve
    provider.teardown(_stripe_source(second.state))  # delete
    return {(method, re.sub(r"we_\w+", "ID", path)) for method, path, _ in stripe.requests}


def test_every_stripe_call_pins_the_api_version(stripe: FakeStripe) -> None:
    sent = _every_stripe_call(stripe)
    assert sent == {
        ("GET", "/v1/webhook_endpoints"),
        ("POST", "/v1/webhook_endpoints"),
        ("GET", "/v1/webhook_endpoints/ID"),
        ("POST", "/v1/webhook_endpoints/ID"),
        ("DELETE", "/v1/webhook_endpoints/ID"),
    }
    assert stripe.versions == [stripe_provider.API_VERSION] * len(stripe.requests)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}\.[a-z]+", stripe_provider.API_VERSION)
    # The endpoint's own event version is left to the account (no api_version parameter).
    assert not any("api_version" in form for _, _, form in stripe.requests)


def test_the_docs_name_the_pinned_stripe_api_version() -> None:
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "howto" / "trigger-sources.md"
    assert f"`Stripe-Version: {stripe_provider.API_VERSION}`" in page.read_text(encoding="utf-8")


def test_the_stripe_api_version_setting_overrides_the_pin(
    stripe: FakeStripe, settings: Any
) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "STRIPE_API_VERSION": "2025-03-31.basil"}
    _every_stripe_call(stripe)
    assert set(stripe.versions) == {"2025-03-31.basil"}


def test_a_stripe_api_version_that_is_not_one_sends_nothing(
    stripe: FakeStripe, settings: Any
) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "STRIPE_API_VERSION": "latest"}
    with pytest.raises(ProviderError, match="STRIPE_API_VERSION"):
        StripeProvider().setup(_stripe_source(), STRIPE_URL, None)
    assert stripe.requests == []


def test_stripe_needs_a_key(settings: Any, declared: None, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DJANGO_LEASES = {"STRIPE_API_URL": "http://127.0.0.1:9"}
    monkeypatch.delenv("DJANGO_LEASES_STRIPE_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="DJANGO_LEASES_STRIPE_API_KEY"):
        StripeProvider().setup(_stripe_source(), STRIPE_URL, None)


# -- what an error may show of a secret -------------------------------------------------------

_CUTS = {
    "whole": lambda secret: secret,
    "all-but-the-last-3": lambda secret: secret[:-3],
    "all-but-the-first-3": lambda secret: secret[3:],
    "prefix-of-8": lambda secret: secret[:8],
    "suffix-of-8": lambda secret: secret[-8:],
    "inner-12": lambda secret: secret[6:18],
    "upper-case": lambda secret: secret.upper(),
}


@pytest.mark.parametrize("cut", list(_CUTS.values()), ids=list(_CUTS))
@pytest.mark.parametrize("secret", [TOKEN, STRIPE_KEY, SIGNING], ids=["token", "key", "signing"])
def test_mask_hides_any_run_of_8_characters_of_a_secret(secret: str, cut: Any) -> None:
    text = f"Validation failed: '{cut(secret)}' is not valid"
    assert mask(text, secret) == "Validation failed: '***' is not valid"
    assert mask(text, None, "", "unrelated-secret", secret) == mask(text, secret)


def test_mask_shows_a_run_of_7_and_joins_runs_that_touch() -> None:
    assert mask(f"near {TOKEN[:7]} miss", TOKEN) == f"near {TOKEN[:7]} miss"
    # Two pieces of one secret side by side, or of two secrets: one ***, nothing between.
    assert mask(f"x {TOKEN[:10]}{TOKEN[12:]} y", TOKEN) == "x *** y"
    assert mask(f"x {TOKEN[:9]}{SIGNING[-9:]} y", TOKEN, SIGNING) == "x *** y"
    # A character whose lower case is longer does not shift what is hidden.
    assert mask(f"İ{SIGNING[2:12]}İ", SIGNING) == "İ***İ"


def test_mask_hides_a_secret_shorter_than_8_only_whole() -> None:
    short = "s3cr3t!"
    assert mask(f"a {short} b {short.upper()} c", short) == "a *** b *** c"
    assert mask(f"a {short[:6]} b", short) == f"a {short[:6]} b"


@pytest.mark.django_db(transaction=True)
def test_an_error_quoting_most_of_a_secret_stays_out_of_detail_and_output(
    github: FakeGitHub,
) -> None:
    # GitHub's answer quotes all but the last 3 characters of the token and all but the first
    # 3 of the signing secret: neither reaches the stored detail or the command's output.
    from io import StringIO

    from django.core.management import call_command

    from django_leases.triggers import lifecycle

    github.fail = (422, {"message": f"Bad hook: token {TOKEN[:-3]}, secret {SIGNING[3:]}"})
    lifecycle.reconcile(base_url="https://app.example.com")
    set_secret("gh-source", SIGNING)
    result = lifecycle.enable("gh-source")
    assert result.ok is False
    detail = TriggerSource.objects.get(name="gh-source").detail
    assert "422" in detail and "Bad hook: token ***, secret ***" in detail
    output = StringIO()
    for format_ in ("table", "json"):
        call_command("trigger_sources", "list", "--format", format_, stdout=output)
    assert "Bad hook: token ***" in output.getvalue()
    _no_secret_in(result.detail, detail, output.getvalue())


def test_stripe_errors_quoting_part_of_the_key_are_masked(stripe: FakeStripe) -> None:
    stripe.fail = (401, {"error": {"message": f"Invalid API Key provided: {STRIPE_KEY[3:]}"}})
    with pytest.raises(ProviderError, match="401") as caught:
        StripeProvider().check(_stripe_source({"endpoint_id": "we_1"}))
    assert str(caught.value).endswith("Invalid API Key provided: ***")
    _no_secret_in(caught.value)


# -- config validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "config", "match"),
    [
        (GitHubProvider(), {}, "repository"),
        (GitHubProvider(), {"repository": "o/r", "api_url": "ftp://x"}, "http"),
        (GitHubProvider(), {"repository": "o/r", "insecure_ssl": "yes"}, "insecure_ssl"),
        (StripeProvider(), {"api_url": "nope"}, "http"),
        (ManualProvider(), {"signature": "md5"}, "signature"),
    ],
)
def test_validate_config_refuses_what_setup_cannot_use(
    provider: Any, config: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        provider.validate_config(config)


def test_validate_config_accepts_good_configs() -> None:
    GitHubProvider().validate_config({"repository": "octo-org/octo-repo", "insecure_ssl": False})
    StripeProvider().validate_config({})
    ManualProvider().validate_config({"signature": "stripe"})
    ManualProvider().validate_config({})


def test_manual_setup_refuses_an_unknown_scheme(declared: None) -> None:
    source = TriggerSource(name="manual-source", provider="manual", config={"signature": "x"})
    with pytest.raises(ProviderError, match="signature"):
        ManualProvider().setup(source, URL, None)


@pytest.mark.parametrize("state", [{"endpoint_id": "../v1/customers"}, {"endpoint_id": 5}])
def test_stripe_ignores_a_state_that_is_not_an_endpoint_id(
    stripe: FakeStripe, state: dict[str, Any]
) -> None:
    StripeProvider().teardown(_stripe_source(state))
    assert stripe.requests == []
    with pytest.raises(ProviderError, match="no webhook endpoint is recorded"):
        StripeProvider().check(_stripe_source(state))
