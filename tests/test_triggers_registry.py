"""Declaring trigger sources in code: the API, its checks, and the demo's declaration."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from django_leases.triggers import registry
from django_leases.triggers.registry import (
    Delivery,
    StartWorkflow,
    TriggerDeclaration,
    webhook_source,
)


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def _delivery(**overrides: object) -> Delivery:
    values: dict = {
        "source": "s",
        "provider": "github",
        "event": "issues",
        "delivery_id": "d-1",
        "payload": {"action": "opened", "issue": {"number": 1}},
    }
    values.update(overrides)
    return Delivery(**values)


def test_the_demo_declares_its_github_source() -> None:
    declaration = registry.get_declaration("github-pushes")
    assert declaration is not None
    assert declaration.provider == "github"
    assert declaration.kind == "webhook"
    assert declaration.config["repository"] == "octo-org/octo-repo"
    assert declaration.handler_for("push") == StartWorkflow("build-preview")
    assert declaration.handler_for("ping") is None
    assert declaration.started_workflows() == ["build-preview"]
    assert declaration in registry.declarations()


def test_a_declaration_is_registered_and_frozen(cleanup: list[str]) -> None:
    def on_issue(delivery: Delivery) -> None:
        return None

    cleanup.append("t-reg")
    declaration = webhook_source(
        "t-reg",
        provider="github",
        config={"repository": "o/r"},
        events={"push": StartWorkflow("wf"), "issues": on_issue},
    )
    assert isinstance(declaration, TriggerDeclaration)
    assert registry.get_declaration("t-reg") is declaration
    assert declaration.handler_for("issues") is on_issue
    with pytest.raises(TypeError):
        declaration.config["repository"] = "other"  # type: ignore[index]
    # The same declaration again (a re-imported module) is fine; a different one is not.
    again = webhook_source(
        "t-reg",
        provider="github",
        config={"repository": "o/r"},
        events={"push": StartWorkflow("wf"), "issues": on_issue},
    )
    assert again is declaration
    with pytest.raises(ValueError, match="already declared"):
        webhook_source("t-reg", provider="github", events={})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "not usable"),
        ({"name": "has space"}, "not usable"),
        ({"name": "a/b"}, "not usable"),
        ({"name": "-leading"}, "not usable"),
        ({"name": "x" * 201}, "not usable"),
        ({"name": 5}, "must be a str"),
        ({"provider": "gitlab"}, "unknown provider"),
        ({"events": ["push"]}, "events must be a dict"),
        ({"events": {"": StartWorkflow("wf")}}, "event names"),
        ({"events": {"push": "build"}}, "handler"),
        ({"config": {"secret": "x"}}, "looks like a secret"),
        ({"config": {"api_token": "x"}}, "looks like a secret"),
        ({"config": "o/r"}, "config must be a dict"),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict, message: str) -> None:
    values: dict = {"name": "t-bad", "provider": "github", "events": {}}
    values.update(kwargs)
    name = values.pop("name")
    with pytest.raises(ValueError, match=message):
        webhook_source(name, **values)
    assert registry.get_declaration("t-bad") is None


def test_start_workflow_needs_a_name() -> None:
    with pytest.raises(ValueError):
        StartWorkflow("")


def test_delivery_input_shape() -> None:
    delivery = _delivery()
    assert delivery.action == "opened"
    assert delivery.as_input() == {
        "source": "s",
        "provider": "github",
        "event": "issues",
        "action": "opened",
        "delivery_id": "d-1",
        "payload": {"action": "opened", "issue": {"number": 1}},
    }
    assert _delivery(payload={"action": 3}).action is None


def test_start_workflow_handler_calls_start_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_leases.workflows import engine

    calls: list[tuple] = []
    run_id = uuid.uuid4()

    def fake(
        name: str, input: object = None, *, key: str | None = None, using: str | None = None
    ) -> uuid.UUID:
        calls.append((name, input, key, using))
        return run_id

    monkeypatch.setattr(engine, "start_workflow", fake)
    delivery = _delivery(using="other")
    assert StartWorkflow("wf")(delivery) == run_id
    assert StartWorkflow("wf", input="delivery")(delivery) == run_id
    assert StartWorkflow("wf", key=lambda d: f"k-{d.event}")(delivery) == run_id
    assert calls == [
        ("wf", delivery.payload, None, "other"),
        ("wf", delivery.as_input(), None, "other"),
        ("wf", delivery.payload, f"k-{delivery.event}", "other"),
    ]


def test_start_workflow_input_must_be_payload_or_delivery() -> None:
    with pytest.raises(ValueError, match="payload"):
        StartWorkflow("wf", input="headers")  # type: ignore[arg-type]


def test_any_installed_provider_may_be_declared(cleanup: list[str]) -> None:
    from django_leases.testing.providers import FakeProvider, installed_provider

    for provider in ("manual", "stripe", "github"):
        cleanup.append(f"t-{provider}")
        assert webhook_source(f"t-{provider}", provider=provider, events={}).provider == provider
    with pytest.raises(ValueError, match="unknown provider 'fake-reg'"):
        webhook_source("t-fake", provider="fake-reg", events={})
    with installed_provider(FakeProvider("fake-reg")):
        cleanup.append("t-fake")
        assert webhook_source("t-fake", provider="fake-reg", events={}).provider == "fake-reg"
