"""The demo's fake GitHub API, driven by the real ``github`` provider: what enabling and
disabling the demo's GitHub source does over HTTP, without the internet."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from demo_project.fake_github import FakeGitHub
from django_leases.models import TriggerSource
from django_leases.triggers.providers import ProviderError, get_provider
from tests.helpers import wait_until

TOKEN = "t0ken-for-tests"
REPO = "octo-org/octo-repo"


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    server = FakeGitHub(token=TOKEN, send_pings=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def github(fake: FakeGitHub, settings: Any) -> Any:
    settings.DJANGO_LEASES = {
        **getattr(settings, "DJANGO_LEASES", {}),
        "GITHUB_API_URL": fake.url,
        "GITHUB_TOKEN": TOKEN,
    }
    provider = get_provider("github")
    assert provider is not None
    return provider


def source(state: dict[str, Any] | None = None) -> TriggerSource:
    # The demo's declaration gives the events; the row need not be saved for the provider.
    return TriggerSource(
        name="github-pushes", provider="github", config={"repository": REPO}, state=state
    )


def test_setup_check_and_teardown_register_exactly_one_hook(fake: FakeGitHub, github: Any) -> None:
    url = "http://127.0.0.1:8000/hooks/github-pushes/"
    outcome = github.setup(source(), url, "s3cret")
    assert outcome.status == "registered"
    hook_id = outcome.state["hook_id"]
    [hook] = fake.hooks(REPO)
    assert (hook["id"], hook["config"]["url"], hook["events"]) == (hook_id, url, ["push"])
    assert hook["config"]["secret"] == "********" and hook["config"]["content_type"] == "json"
    assert github.check(source(outcome.state)).state["hook_id"] == hook_id

    # Setting up again (a re-enable) updates the recorded hook; so does a lost state (the
    # provider finds the hook posting to the URL).
    assert github.setup(source(outcome.state), url, "s3cret").state["hook_id"] == hook_id
    assert github.setup(source(None), url, "s3cret").state["hook_id"] == hook_id
    assert len(fake.hooks(REPO)) == 1

    github.teardown(source(outcome.state))
    assert fake.hooks() == []
    github.teardown(source(outcome.state))  # already gone: still success
    with pytest.raises(ProviderError, match="no longer exists"):
        github.check(source(outcome.state))
    assert ("DELETE", f"/repos/{REPO}/hooks/{hook_id}", 404) in fake.calls


def test_a_wrong_token_is_refused(fake: FakeGitHub, github: Any, settings: Any) -> None:
    settings.DJANGO_LEASES = {**settings.DJANGO_LEASES, "GITHUB_TOKEN": "wrong"}
    with pytest.raises(ProviderError) as caught:
        github.setup(source(), "http://127.0.0.1:8000/hooks/github-pushes/", "s3cret")
    assert "401" in str(caught.value) and "wrong" not in str(caught.value)
    assert fake.hooks() == []


def test_bad_bodies_get_githubs_answers(fake: FakeGitHub) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=fake.url, headers=headers) as client:
        hooks = f"/repos/{REPO}/hooks"
        assert (
            client.post(hooks, json={"name": "email", "config": {"url": "http://x/"}}).status_code
            == 422
        )
        assert client.post(hooks, json={"config": {"url": "ftp://x/"}}).status_code == 422
        assert client.post(hooks, content=b"{nope").status_code == 400
        assert client.get(f"{hooks}/1").status_code == 404
        assert client.delete(f"{hooks}/1").status_code == 404
        assert client.get("/user").status_code == 404
        created = client.post(hooks, json={"config": {"url": "http://x/"}})
        assert created.status_code == 201
        hook = created.json()
        assert created.headers["Location"] == hook["url"]
        assert (hook["events"], hook["config"]["content_type"]) == (["push"], "form")
        patched = client.patch(f"{hooks}/{hook['id']}", json={"add_events": ["issues"]})
        assert patched.json()["events"] == ["push", "issues"]
        assert client.delete(f"{hooks}/{hook['id']}").status_code == 204


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_created_hook_is_pinged_signed_with_its_secret() -> None:
    _Receiver.received = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    fake = FakeGitHub(token=TOKEN).start()
    try:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hooks/x/"
        created = httpx.post(
            f"{fake.url}/repos/{REPO}/hooks",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"config": {"url": url, "content_type": "json", "secret": "pssst"}},
        )
        assert created.status_code == 201
        wait_until(lambda: fake.pings, 30, what="the hook's ping")
        assert [(p.hook_id, p.status) for p in fake.pings] == [(created.json()["id"], 202)]
        [(headers, body)] = _Receiver.received
        assert headers["x-github-event"] == "ping"
        expected = "sha256=" + hmac.new(b"pssst", body, hashlib.sha256).hexdigest()
        assert headers["x-hub-signature-256"] == expected
        assert json.loads(body)["hook_id"] == created.json()["id"]
    finally:
        fake.stop()
        receiver.shutdown()
        receiver.server_close()
