"""An operator's journey through the admin in a real browser, on one live server.

Leases with their state; a trigger source enabled (and registered at its provider); a signed
delivery followed from the source's recent deliveries to the workflow run it started, its steps
and their attempts; the run, suspended on a step function that was not deployed yet, resumed
once it is; the source disabled (deliveries then answered 404); an orphan forgotten. A
screenshot of each page goes to ``test-artifacts/screenshots/`` (a few of them are in the docs,
``docs/img/``).

Workflow steps run on this test's thread with the worker's own loop
(``Worker.run(once=True)``), so nothing runs in the background between two looks.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from django_leases.models import (
    Lease,
    RunStatus,
    StepStatus,
    TriggerEvent,
    TriggerSource,
    WorkflowRun,
)
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.workflows import registry as workflow_registry
from django_leases.workflows import step_function, workflow
from django_leases.workflows.values import STEP_FUNCTION_NOT_FOUND
from django_leases.workflows.worker import Worker
from tests.browser.conftest import overflowing

pytestmark = pytest.mark.timeout(240)

SOURCE = "journey-pushes"
ORPHAN = "journey-retired"
WORKFLOW = "browser-journey.deploy"
ANNOUNCE = "browser-journey.announce"  # not deployed when the first delivery arrives


@step_function("browser-journey.checkout")
def checkout(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"sha": data["after"][:7]}


@workflow(WORKFLOW)
def deploy(run: Any, input: dict[str, Any]) -> dict[str, Any]:
    checked_out = run.step("checkout", "browser-journey.checkout", {"after": input["after"]})
    announced = run.step("announce", ANNOUNCE, {"sha": checked_out["sha"]})
    return {"sha": checked_out["sha"], "announced": announced}


def announce(data: dict[str, Any], ctx: Any) -> str:
    return f"deployed {data['sha']}"


@pytest.fixture
def sources(live_server: Any) -> Iterator[FakeProvider]:
    """``SOURCE`` declared (off) on a fake provider, and ``ORPHAN``: registered at the
    provider, then its declaration left the code."""
    with installed_provider(FakeProvider("fake")) as provider:
        webhook_source(SOURCE, provider="fake", events={"push": StartWorkflow(WORKFLOW)})
        webhook_source(ORPHAN, provider="fake", events={})
        try:
            lifecycle.reconcile(base_url=live_server.url)
            lifecycle.enable(ORPHAN)
            registry.unregister(ORPHAN)
            lifecycle.reconcile()
            yield provider
        finally:
            registry.unregister(SOURCE)
            registry.unregister(ORPHAN)


def operator() -> User:
    """A staff user with the operator's permissions (view everything, toggle, operate)."""
    codenames = [
        "view_lease",
        "view_triggersource",
        "view_orphantriggersource",
        "toggle_triggersource",
        "view_workflowrun",
        "view_workflowstep",  # the run page's steps inline
        "operate_workflowrun",
    ]
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_leases", codename__in=codenames)
    )
    assert user.user_permissions.count() == len(codenames)
    return user


def deliver(url: str, payload: dict[str, Any], delivery: str) -> httpx.Response:
    """POST a push delivery to ``url`` signed the fake provider's way with the source's secret
    (a made-up one while the source has none)."""
    body = json.dumps(payload).encode()
    secret = credentials.signing_secret(SOURCE) or "no-secret-yet"
    return httpx.post(
        url,
        content=body,
        headers={
            "Content-Type": "application/json",
            "X-Fake-Event": "push",
            "X-Fake-Delivery": delivery,
            "X-Fake-Signature": FakeProvider.sign(secret, body),
        },
        timeout=30,
    )


def work() -> None:
    """Run every due workflow pass and step on this thread, then return."""
    assert Worker(step_lease_ttl=60).run(once=True, handle_signals=False) == 0


def field(page: Any, name: str) -> str:
    """The text of a read-only field on an admin change page."""
    return str(page.inner_text(f"div.field-{name} div.readonly")).strip()


def messages(page: Any) -> str:
    page.wait_for_selector("ul.messagelist")
    return str(page.inner_text("ul.messagelist"))


def test_an_operator_follows_a_delivery_to_its_run_and_operates_the_admin(
    page: Any,
    live_server: Any,
    sources: FakeProvider,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
    docs_image: Callable[[Path, str], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page.set_viewport_size({"width": 1280, "height": 900})  # every page fits a laptop
    assert Lease.objects.acquire("reports:nightly", "host-a:1:aa", ttl=3600) is not None
    Lease.objects.create(
        key="index:rebuild",
        holder="host-c:3:cc",
        token=4,
        expires_at=timezone.now() - timedelta(hours=1),
    )
    operator()
    admin_login("operator", "pw")
    assert overflowing(page) == [], "admin-index"
    screenshot("admin-index")

    # Leases, each with its state.
    page.goto("/admin/django_leases/lease/")
    lease_rows = page.locator("#result_list tbody tr")
    assert lease_rows.filter(has_text="reports:nightly").locator(
        "td.field-state_display"
    ).inner_text() == ("live")
    assert lease_rows.filter(has_text="index:rebuild").locator(
        "td.field-state_display"
    ).inner_text() == ("lapsed")
    assert overflowing(page) == [], "leases"
    screenshot("leases")

    # Enable the source: registered at the provider, at this server's address.
    page.goto("/admin/django_leases/triggersource/")
    assert page.get_attribute(f"#status-{SOURCE}", "data-status") == "off"
    hooks_url = f"{live_server.url}/hooks/{SOURCE}/"
    assert deliver(hooks_url, {"after": "0" * 40}, "before-enabling").status_code == 404
    page.click(f"#switch-{SOURCE}")
    assert "Enable:" in messages(page)
    assert page.get_attribute(f"#status-{SOURCE}", "data-status") == "registered"
    assert credentials.signing_secret(SOURCE), "enabling stored a signing secret"
    assert {hook["source"]: hook["url"] for hook in sources.hooks.values()}[SOURCE] == hooks_url
    assert overflowing(page) == [], "source-enabled"
    screenshot("source-enabled")

    # A signed delivery, accepted and recorded with the run it started.
    delivery = str(uuid.uuid4())
    answer = deliver(hooks_url, {"ref": "refs/heads/main", "after": "4a7c1e9" + "0" * 33}, delivery)
    assert answer.is_success, answer.text
    event = TriggerEvent.objects.get(source_name=SOURCE, delivery_id=delivery)
    assert event.run_id is not None
    work()  # "checkout" succeeds; "announce" has no function here yet: the run is suspended
    assert WorkflowRun.objects.get(pk=event.run_id).status == RunStatus.SUSPENDED

    # Follow it: the source's page lists the delivery, linked to its run.
    page.click(f"#result_list a:text-is('{SOURCE}')")
    page.wait_for_selector("#recent-events")
    recent = page.locator("#recent-events tbody tr", has_text=delivery)
    assert recent.count() == 1
    assert "push" in recent.inner_text()
    assert overflowing(page) == [], "source-recent-deliveries"
    docs_image(screenshot("source-recent-deliveries"), "admin-source-deliveries.png")
    recent.locator("a").click()
    page.wait_for_url(f"**/admin/django_leases/workflowrun/{event.run_id}/change/")
    assert field(page, "workflow") == WORKFLOW
    assert field(page, "status") == RunStatus.SUSPENDED.label
    assert STEP_FUNCTION_NOT_FOUND in field(page, "error_json")
    assert ANNOUNCE in field(page, "error_json")
    steps = page.locator(".tabular tbody tr.has_original")
    assert steps.count() == 2
    assert str(StepStatus.SUCCEEDED.label) in steps.filter(has_text="checkout").inner_text()
    assert str(StepStatus.FAILED.label) in steps.filter(has_text="announce").inner_text()
    history = page.locator("div.field-history table tbody tr")
    assert [row.split("\t")[:3] for row in history.all_inner_texts()] == [
        ["checkout", "1", "Succeeded"],
        ["announce", "1", "Failed"],
    ]
    assert overflowing(page) == [], "run-suspended"
    docs_image(screenshot("run-suspended"), "admin-run-suspended.png")

    # The missing function is deployed; the operator resumes the run, a worker finishes it.
    monkeypatch.setitem(workflow_registry._step_functions, ANNOUNCE, announce)
    page.click("#workflow-operations input[name=resume]")
    assert "Suspended → Running" in messages(page)
    assert field(page, "status") == RunStatus.RUNNING.label
    work()
    page.reload()
    assert field(page, "status") == RunStatus.COMPLETED.label
    assert "deployed 4a7c1e9" in field(page, "output_json")
    assert [row.split("\t")[:3] for row in history.all_inner_texts()] == [
        ["checkout", "1", "Succeeded"],
        ["announce", "1", "Failed"],
        ["announce", "2", "Succeeded"],
    ], "the resumed step ran again as attempt 2; the first attempt stays in the history"
    operations = page.inner_text("#workflow-operations")
    # A completed run can only be forked (fork_run): no resume, cancel or retry.
    assert "Fork from step" in operations, operations
    assert page.locator("#workflow-operations input[type=submit]").count() == 1, operations
    assert overflowing(page) == [], "run-completed"
    screenshot("run-completed")

    # Disable the source: off at once, torn down, and deliveries are answered 404.
    page.goto("/admin/django_leases/triggersource/")
    page.click(f"#switch-{SOURCE}")
    assert "Disable:" in messages(page)
    assert page.get_attribute(f"#status-{SOURCE}", "data-status") == "off"
    assert SOURCE not in {hook["source"] for hook in sources.hooks.values()}
    assert deliver(hooks_url, {"after": "1" * 40}, str(uuid.uuid4())).status_code == 404
    assert overflowing(page) == [], "source-disabled"
    screenshot("source-disabled")

    # Forget the orphan.
    page.goto("/admin/django_leases/orphantriggersource/")
    assert page.get_attribute(f"#status-{ORPHAN}", "data-status") == "registered"
    assert overflowing(page) == [], "orphans"
    docs_image(screenshot("orphans"), "admin-orphans.png")
    page.click(f"#forget-{ORPHAN}")
    assert "Forget:" in messages(page)
    assert page.locator(f"#forget-{ORPHAN}").count() == 0
    assert not TriggerSource.objects.filter(name=ORPHAN).exists()
    assert overflowing(page) == [], "orphan-forgotten"
    screenshot("orphan-forgotten")
