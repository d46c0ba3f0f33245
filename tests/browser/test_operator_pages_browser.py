"""An operator's look at what the workers, the senders and the command line did, in a real
browser at 1280 px: the Workflow workers page, the Deliveries list and its filters, a source's
refused-delivery tallies and signing-secret line, a manual source's headers to send, and a
change made from the command line in a run's history. Every page fits 1280 px; the screenshots
the admin docs show come from here (``make docs-images``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from django_leases.models import Lease, TriggerEvent, WorkflowRun, WorkflowWorker
from django_leases.testing.providers import FakeProvider, installed_provider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.workflows import workflow
from django_leases.workflows.values import WORKER_LEASE_PREFIX
from tests.browser.conftest import overflowing
from tests.helpers import lapse_lease

pytestmark = pytest.mark.timeout(240)

WIDTH = 1280
SOURCE = "pages-pushes"
MANUAL = "pages-by-hand"
WORKFLOW = "browser-pages.deploy"


@workflow(WORKFLOW)
def deploy(run: Any, input: dict[str, Any]) -> dict[str, Any]:
    return {"after": input.get("after")}


@pytest.fixture
def sources(live_server: Any) -> Iterator[FakeProvider]:
    """``SOURCE`` on a fake provider, enabled; ``MANUAL`` registered by hand, no secret yet."""
    with installed_provider(FakeProvider("fake")) as provider:
        webhook_source(SOURCE, provider="fake", events={"push": StartWorkflow(WORKFLOW)})
        webhook_source(MANUAL, provider="manual", events={"push": StartWorkflow(WORKFLOW)})
        try:
            lifecycle.reconcile(base_url=live_server.url)
            lifecycle.enable(SOURCE)
            yield provider
        finally:
            registry.unregister(SOURCE)
            registry.unregister(MANUAL)


def operator() -> User:
    """Staff who can see everything django-leases shows and operate it."""
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_leases",
            codename__in=[
                "view_workflowworker",
                "view_triggerevent",
                "view_triggersource",
                "toggle_triggersource",
                "view_workflowrun",
                "operate_workflowrun",
            ],
        )
    )
    return user


def deliver(url: str, delivery: str, *, secret: str | None) -> httpx.Response:
    body = json.dumps({"after": "4a7c1e9" + "0" * 33}).encode()
    return httpx.post(
        url,
        content=body,
        headers={
            "Content-Type": "application/json",
            "X-Fake-Event": "push",
            "X-Fake-Delivery": delivery,
            "X-Fake-Signature": FakeProvider.sign(secret or "an-old-secret", body),
        },
        timeout=30,
    )


def worker(host: str, pid: int, *, queues: list[str], in_flight: int) -> WorkflowWorker:
    """A worker process as its heartbeat records it (live while its lease is)."""
    key = f"{WORKER_LEASE_PREFIX}{host}:{pid}"
    row = WorkflowWorker.objects.register(
        key, host=host, pid=pid, concurrency=4, queues=queues, wakeup="listen"
    )
    assert Lease.objects.acquire(key, f"{host}:{pid}:x", ttl=600) is not None
    WorkflowWorker.objects.beat(key, in_flight)
    return row


def rows(page: Any) -> list[str]:
    return list(page.locator("#result_list tbody tr").all_inner_texts())


def test_an_operator_sees_workers_deliveries_refusals_and_the_command_lines_changes(
    page: Any,
    live_server: Any,
    sources: FakeProvider,
    admin_login: Callable[[str, str], None],
    screenshot: Callable[[str], Path],
    docs_image: Callable[[Path, str], None],
) -> None:
    page.set_viewport_size({"width": WIDTH, "height": 900})
    hooks = f"{live_server.url}/hooks/{SOURCE}/"
    accepted = deliver(hooks, "good-1", secret=credentials.signing_secret(SOURCE))
    assert accepted.is_success, accepted.text
    for n in range(2):
        assert deliver(hooks, f"stale-{n}", secret=None).status_code == 401
    run_id = TriggerEvent.objects.get(delivery_id="good-1").run_id
    assert run_id is not None
    worker("worker-1.internal", 4121, queues=["default", "builds"], in_flight=2)
    lapsed = worker("worker-2.internal", 977, queues=[], in_flight=1)
    lapse_lease(lapsed.lease_key)
    operator()
    admin_login("operator", "pw")

    # Workers: one live, one whose heartbeat lapsed (killed), with what each was doing.
    page.goto("/admin/django_leases/workflowworker/")
    listed = rows(page)
    live = next(row for row in listed if "worker-1.internal" in row)
    assert "live" in live and "default, builds" in live and "2 of 4" in live
    gone = next(row for row in listed if "worker-2.internal" in row)
    assert "lapsed" in gone and "every queue" in gone
    assert overflowing(page) == []
    docs_image(screenshot("workers"), "admin-workers.png")
    page.click("#changelist-filter a:text-is('lapsed')")
    page.wait_for_url("**state=lapsed**")
    assert [row for row in rows(page) if row.strip()] == [gone]

    # Deliveries: the accepted one, its outcome and run; filtered by source and outcome.
    page.goto("/admin/django_leases/triggerevent/")
    assert page.inner_text("#content h1") == "Deliveries"
    [row] = rows(page)
    assert SOURCE in row and "good-1" in row and "run running" in row
    assert "…" + str(run_id)[-8:] in row
    assert page.locator(f'td.field-run_link a[title="{run_id}"]').count() == 1
    page.click(f"#changelist-filter a:text-is('{SOURCE}')")
    page.wait_for_url(f"**source={SOURCE}**")
    page.click("#changelist-filter a:text-is('run completed')")
    page.wait_for_url("**outcome=completed**")
    assert page.locator("#result_list").count() == 0  # nothing completed yet
    page.goto(f"/admin/django_leases/triggerevent/?source={SOURCE}")
    assert overflowing(page) == []
    docs_image(screenshot("deliveries"), "admin-deliveries.png")

    # The source's page: its secret is stored, two deliveries were refused (old secret).
    page.click(f"#result_list a:text-is('{SOURCE}')")
    page.wait_for_selector("#refusals")
    refused = page.inner_text("#refused-bad_signature")
    assert "bad_signature" in refused and "\t2\t401\t" in refused
    assert "stored (encrypted" in page.inner_text("div.field-signing_secret")
    assert credentials.signing_secret(SOURCE) not in page.content()
    assert overflowing(page) == []
    docs_image(screenshot("source-refusals"), "admin-source-refusals.png")
    page.click("#all-deliveries")
    page.wait_for_url(f"**source={SOURCE}**")

    # The sources list: the switch, the badge, the address, the detail and the refused count.
    page.goto("/admin/django_leases/triggersource/")
    row = page.locator("#result_list tbody tr", has_text=SOURCE)
    assert row.locator("td.field-refused_count").inner_text() == "2"
    assert overflowing(page) == []
    docs_image(screenshot("sources"), "admin-trigger-sources.png")

    # A manual source's page: no secret yet, and the headers the sender must send.
    page.click(f"#result_list a:text-is('{MANUAL}')")
    page.wait_for_selector("#sender-headers")
    assert "none stored" in page.inner_text("div.field-signing_secret")
    headers = page.inner_text("#sender-headers")
    for header in ("X-GitHub-Event", "X-GitHub-Delivery", "X-Hub-Signature-256"):
        assert header in headers
    assert overflowing(page) == []
    docs_image(screenshot("manual-source"), "admin-manual-source.png")

    # A run cancelled from the command line: in the run's history, as the system user.
    call_command("workflow_runs", "cancel", str(run_id), stdout=StringIO(), stderr=StringIO())
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"
    page.goto(f"/admin/django_leases/workflowrun/{run_id}/history/")
    history = page.inner_text("#change-history")
    assert "django-leases" in history and "manage.py workflow_runs cancel" in history
    assert "running → cancelled" in history
    assert overflowing(page) == []
    docs_image(screenshot("history"), "admin-history.png")
    page.goto(f"/admin/django_leases/workflowrun/{run_id}/change/")
    assert "Nothing to do: this run is cancelled." in page.inner_text("#workflow-operations")
    assert overflowing(page) == []
    assert uuid.UUID(str(run_id))
