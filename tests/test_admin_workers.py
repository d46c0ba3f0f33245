"""The admin's Workflow workers page: every worker process with its heartbeat's state (live /
stopped / lapsed, on the database clock), queues, threads, units in flight and times; read-only;
the view permission needed. The state comes from ``WorkflowWorker.objects.with_state()``."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from django_leases.models import Lease, WorkerState, WorkflowWorker
from django_leases.workflows.values import WORKER_LEASE_PREFIX
from tests.helpers import lapse_lease, staff_client

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_leases_workflowworker_changelist"


def _worker(pid: int, *, queues: list[str], in_flight: int = 0) -> WorkflowWorker:
    key = f"{WORKER_LEASE_PREFIX}node-{pid}:{pid}"
    row = WorkflowWorker.objects.register(
        key, host=f"node-{pid}", pid=pid, concurrency=4, queues=queues, wakeup="listen"
    )
    assert Lease.objects.acquire(key, f"node-{pid}:{pid}:x", ttl=300) is not None
    WorkflowWorker.objects.beat(key, in_flight)
    return row


@pytest.fixture
def workers() -> dict[str, WorkflowWorker]:
    """A live worker (3 units in flight), one that stopped, one whose lease lapsed."""
    live = _worker(101, queues=["emails", "builds"], in_flight=3)
    stopped = _worker(102, queues=[])
    lease = Lease.objects.current(stopped.lease_key)
    assert lease is not None
    Lease.objects.release(lease)
    WorkflowWorker.objects.stopped(stopped.lease_key)
    lapsed = _worker(103, queues=["builds"], in_flight=1)
    lapse_lease(lapsed.lease_key)
    return {"live": live, "stopped": stopped, "lapsed": lapsed}


def test_with_state_says_live_stopped_or_lapsed_on_the_database_clock(
    workers: dict[str, WorkflowWorker],
) -> None:
    rows = list(WorkflowWorker.objects.with_state())
    assert rows[0].pid == 101, "live workers come first"
    state = {row.pid: row.state for row in rows}  # type: ignore[attr-defined]
    assert state == {101: "live", 102: "stopped", 103: "lapsed"}
    live = next(row for row in rows if row.pid == 101)
    left = (live.heartbeat_expires_at - live.db_now).total_seconds()  # type: ignore[attr-defined]
    assert 0 < left <= 300
    assert WorkflowWorker.objects.with_state().filter(state=WorkerState.LAPSED).get().pid == 103
    # A live lease makes a worker live even if an earlier run of that pid said it stopped.
    WorkflowWorker.objects.filter(pid=101).update(stopped_at=live.started_at)
    assert WorkflowWorker.objects.with_state().get(pid=101).state == "live"  # type: ignore[attr-defined]


def test_the_workers_page_lists_each_worker_with_its_heartbeat(
    admin_client: Client, workers: dict[str, WorkflowWorker]
) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    for name, row in workers.items():
        assert re.search(rf'id="worker-state-{row.pk}" data-state="{name}"', html), name
    rows = re.findall(r"<tr>.*?</tr>", html, re.S)
    live = next(row for row in rows if "node-101" in row)
    assert "emails, builds" in live and ">3 of 4<" in live
    assert "every queue" in next(row for row in rows if "node-102" in row)
    assert html.count('class="dl-time"') >= 6  # since and last heartbeat, each worker
    # Filter by state.
    lapsed = admin_client.get(reverse(CHANGELIST), {"state": "lapsed"})
    assert [row.pid for row in lapsed.context["cl"].result_list] == [103]
    assert admin_client.get(reverse(CHANGELIST), {"q": "node-10"}).status_code == 200
    assert admin_client.get(reverse(CHANGELIST), {"q": "101"}).status_code == 200
    # A worker's page: its heartbeat lease too.
    pages = {
        name: admin_client.get(
            reverse("admin:django_leases_workflowworker_change", args=[row.pk])
        ).content.decode()
        for name, row in workers.items()
    }
    assert "expires in" in pages["live"]
    assert "released" in pages["stopped"]
    assert "lapsed " in pages["lapsed"]
    assert workers["live"].lease_key in pages["live"]


def test_the_workers_page_is_read_only(
    admin_client: Client, workers: dict[str, WorkflowWorker]
) -> None:
    row = workers["live"]
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "delete_selected" not in html and 'name="_selected_action"' not in html
    assert admin_client.get(reverse("admin:django_leases_workflowworker_add")).status_code == 403
    change = reverse("admin:django_leases_workflowworker_change", args=[row.pk])
    page = admin_client.get(change)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert admin_client.post(change, {"in_flight": 0}).status_code == 403
    delete = reverse("admin:django_leases_workflowworker_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert WorkflowWorker.objects.get(pk=row.pk).in_flight == 3


def test_the_workers_page_needs_the_view_permission(workers: dict[str, WorkflowWorker]) -> None:
    assert staff_client().get(reverse(CHANGELIST)).status_code == 403
    assert staff_client("view_workflowworker").get(reverse(CHANGELIST)).status_code == 200
