"""The demo's sender (``manage.py send_deliveries``): it signs as GitHub and Stripe sign, so
the receiving view accepts what it sends — and refuses it when the secret is wrong."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from demo_project.previews.management.commands import send_deliveries
from django_leases.models import TriggerEvent, TriggerSource, WorkflowRun
from django_leases.triggers import registry
from django_leases.triggers.credentials import set_secret
from django_leases.triggers.signatures import verify_github_signature, verify_stripe_signature

pytestmark = pytest.mark.django_db(transaction=True)

DEMO = Path(__file__).resolve().parent.parent / "demo_project"


def send(*args: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("send_deliveries", *args, "--json", stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture
def sources(live_server: Any) -> str:
    TriggerSource.objects.sync(registry.declarations(), base_url=live_server.url)
    for name in ("github-pushes", "stripe-orders"):
        TriggerSource.objects.set_enabled(name, True)
    set_secret("stripe-orders", "whsec_demo_sender_test")
    return str(live_server.url)


def test_github_pushes_are_accepted_and_start_their_runs(sources: str) -> None:
    lines = send("github-pushes", "--expect", "202")
    assert lines and {line["event"] for line in lines} == {"push"}
    for line in lines:
        run = WorkflowRun.objects.get(pk=line["answer"]["run_id"])
        assert run.workflow == "build-preview"
        assert run.input == json.loads(Path(line["path"]).read_bytes())
        assert TriggerEvent.objects.filter(delivery_id=line["delivery_id"]).exists()


def test_stripe_events_are_accepted_once(sources: str) -> None:
    first = send("stripe-orders", "--expect", "202")
    assert sorted(line["event"] for line in first) == [
        "checkout.session.completed",
        "payment_intent.succeeded",
    ]
    runs = WorkflowRun.objects.filter(pk__in=[line["answer"]["run_id"] for line in first])
    assert {run.workflow for run in runs} == {"fulfil-order"} and runs.count() == 2
    again = send("stripe-orders", "--expect", "200")
    assert [line["delivery_id"] for line in again] == [line["delivery_id"] for line in first]
    assert WorkflowRun.objects.filter(workflow="fulfil-order").count() == 2


def test_a_wrong_secret_is_refused_and_the_sender_says_so(sources: str) -> None:
    before = TriggerEvent.objects.count()
    assert {line["status"] for line in send("github-pushes", "--wrong-secret")} == {401}
    assert {line["status"] for line in send("stripe-orders", "--wrong-secret")} == {401}
    assert TriggerEvent.objects.count() == before
    with pytest.raises(CommandError, match="unexpected status"):
        call_command(
            "send_deliveries",
            "stripe-orders",
            "--wrong-secret",
            "--expect",
            "202",
            stdout=StringIO(),
        )


def test_a_disabled_source_gets_404(sources: str) -> None:
    TriggerSource.objects.set_enabled("github-pushes", False)
    sample = DEMO / "previews" / "samples" / "push-main.json"
    [line] = send("github-pushes", str(sample), "--expect", "404")
    assert line["event"] == "push"  # the source's only event, as the file's folder is not one


def test_without_the_shared_fixtures_the_demo_samples_are_sent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(send_deliveries, "SHARED_FIXTURES", tmp_path / "missing")
    pushes, where = send_deliveries.default_payloads("github", ["push"])
    assert "demo's own samples" in where
    assert sorted(p.name for p, _ in pushes) == ["push-feature.json", "push-main.json"]
    pulls, _ = send_deliveries.default_payloads("github", ["pull_request", "pull_request_review"])
    assert [(p.parent.name, p.name, e) for p, e in pulls] == [
        ("pull_request", "opened.json", "pull_request"),
        ("pull_request_review", "submitted-approved.json", "pull_request_review"),
        ("pull_request_review", "submitted-changes-requested.json", "pull_request_review"),
        ("pull_request_review", "submitted-commented.json", "pull_request_review"),
    ]
    events, _ = send_deliveries.default_payloads(
        "stripe", ["checkout.session.completed", "payment_intent.succeeded"]
    )
    assert sorted(e for _, e in events) == [
        "checkout.session.completed",
        "payment_intent.succeeded",
    ]


def test_the_signatures_are_the_providers() -> None:
    body = b'{"id": "evt_1", "type": "payment_intent.succeeded"}'
    headers, delivery_id = send_deliveries.signed_request("stripe", "whsec_x", body, "ignored")
    assert delivery_id == "evt_1"
    assert verify_stripe_signature("whsec_x", body, headers["Stripe-Signature"])
    assert not verify_stripe_signature("whsec_y", body, headers["Stripe-Signature"])
    headers, delivery_id = send_deliveries.signed_request("github", "s3cret", body, "push")
    assert headers["X-GitHub-Event"] == "push" and headers["X-GitHub-Delivery"] == delivery_id
    assert verify_github_signature("s3cret", body, headers["X-Hub-Signature-256"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-source"], "Unknown trigger source"),
        (
            ["github-pushes", "/no/such/file.json", "--base-url", "http://127.0.0.1:9"],
            "Cannot read",
        ),
    ],
)
def test_bad_input_is_refused_clearly(args: list[str], message: str) -> None:
    TriggerSource.objects.sync(registry.declarations())
    with pytest.raises(CommandError, match=message):
        call_command("send_deliveries", *args, stdout=StringIO())
