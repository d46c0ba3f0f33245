"""The admin's Deliveries list: every accepted delivery, filtered by source, outcome and event,
linked to its source and run; read-only; the view permission needed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_leases.models import TriggerEvent, TriggerSource, WorkflowRun
from django_leases.models.trigger import NO_RUN
from tests.helpers import staff_client

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_leases_triggerevent_changelist"


@pytest.fixture
def deliveries() -> dict[str, TriggerEvent]:
    pushes = TriggerSource.objects.create(name="dl-pushes", provider="fake", declared=True)
    gone = TriggerSource.objects.create(name="dl-gone", provider="fake", declared=False)
    done = WorkflowRun.objects.start("build-preview", {})
    WorkflowRun.objects.complete(done.id, None)
    failed = WorkflowRun.objects.start("build-preview", {})
    WorkflowRun.objects.fail(failed.id, "boom")

    def event(source: TriggerSource, name: str, delivery: str, run: WorkflowRun | None) -> Any:
        return TriggerEvent.objects.create(
            source=source,
            source_name=source.name,
            delivery_id=delivery,
            event=name,
            payload={"ref": "refs/heads/main", "note": "<b>escaped</b>"},
            run=run,
        )

    return {
        "completed": event(pushes, "push", "d-1", done),
        "failed": event(pushes, "push", "d-2", failed),
        "no-run": event(pushes, "ping", "d-3", None),
        "orphan": event(gone, "push", "d-4", None),
    }


def _listed(client: Client, **query: str) -> list[str]:
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    return sorted(event.delivery_id for event in response.context["cl"].result_list)


def test_with_run_outcome_is_the_runs_status_or_no_run(deliveries: dict[str, TriggerEvent]) -> None:
    outcomes = dict(
        TriggerEvent.objects.with_run_outcome().values_list("delivery_id", "run_outcome")
    )
    assert outcomes == {"d-1": "completed", "d-2": "failed", "d-3": NO_RUN, "d-4": NO_RUN}


def test_deliveries_are_listed_and_filtered_by_source_outcome_and_event(
    admin_client: Client, deliveries: dict[str, TriggerEvent]
) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    html = response.content.decode()
    assert "<h1>Deliveries</h1>" in html
    assert _listed(admin_client) == ["d-1", "d-2", "d-3", "d-4"]
    assert _listed(admin_client, source="dl-gone") == ["d-4"]
    assert _listed(admin_client, outcome="failed") == ["d-2"]
    assert _listed(admin_client, outcome=NO_RUN) == ["d-3", "d-4"]
    assert _listed(admin_client, event="ping") == ["d-3"]
    assert _listed(admin_client, source="dl-pushes", event="push") == ["d-1", "d-2"]
    assert _listed(admin_client, q="d-3") == ["d-3"]
    # Each row links its source (declared or orphan) and its run.
    run = deliveries["failed"].run_id
    assert reverse("admin:django_leases_workflowrun_change", args=[run]) in html
    pushes = TriggerSource.objects.get(name="dl-pushes").pk
    gone = TriggerSource.objects.get(name="dl-gone").pk
    assert reverse("admin:django_leases_triggersource_change", args=[pushes]) in html
    assert reverse("admin:django_leases_orphantriggersource_change", args=[gone]) in html
    assert re.search(r'data-outcome="failed">run failed<', html)
    assert re.search(r'data-outcome="no-run">no run<', html)


def test_a_delivery_page_shows_its_payload_escaped_and_nothing_can_change(
    admin_client: Client, deliveries: dict[str, TriggerEvent]
) -> None:
    event = deliveries["completed"]
    page = admin_client.get(reverse("admin:django_leases_triggerevent_change", args=[event.pk]))
    html = page.content.decode()
    assert 'id="delivery-payload"' in html and "&lt;b&gt;escaped&lt;/b&gt;" in html
    assert "<b>escaped</b>" not in html and 'name="_save"' not in html
    assert admin_client.get(reverse("admin:django_leases_triggerevent_add")).status_code == 403
    delete = reverse("admin:django_leases_triggerevent_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "delete_selected" not in listing
    assert TriggerEvent.objects.count() == 4


def test_a_source_page_links_all_its_deliveries(
    admin_client: Client, deliveries: dict[str, TriggerEvent]
) -> None:
    pushes = TriggerSource.objects.get(name="dl-pushes").pk
    page = admin_client.get(reverse("admin:django_leases_triggersource_change", args=[pushes]))
    assert f'href="{reverse(CHANGELIST)}?source=dl-pushes" id="all-deliveries"' in (
        page.content.decode()
    )


def test_the_deliveries_need_the_view_permission(deliveries: dict[str, TriggerEvent]) -> None:
    assert staff_client().get(reverse(CHANGELIST)).status_code == 403
    assert staff_client("view_triggerevent").get(reverse(CHANGELIST)).status_code == 200
