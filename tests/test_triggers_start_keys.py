"""A ``StartWorkflow`` key read off the payload is the delivery's data, not the server's:
a value no run can be keyed with is recorded with that outcome (as a key callable that
raises is), never answered 500 for the provider to send again and again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from django_leases.models import TriggerEvent, TriggerSource, WorkflowRun
from django_leases.triggers import registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.triggers.signatures import github_signature
from django_leases.workflows import workflow

SOURCE = "keyed-pushes"
SECRET = "keyed-pushes-signing-secret-0123456789"
WORKFLOW = "test-keyed-build"


@workflow(WORKFLOW)
def _keyed_build(run: Any, input: Any) -> Any:
    return input


@pytest.fixture
def source(settings: Any, db: None) -> Iterator[str]:
    webhook_source(
        SOURCE,
        provider="github",
        config={"repository": "octo-org/octo-repo"},
        events={"push": StartWorkflow(WORKFLOW, key=lambda d: d.payload["ref"])},
    )
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}}
    TriggerSource.objects.sync(registry.declarations())
    TriggerSource.objects.set_enabled(SOURCE, True)
    yield SOURCE
    registry.unregister(SOURCE)


@pytest.mark.parametrize(
    "ref", [pytest.param("refs/heads/" + "b" * 300, id="too-long"), pytest.param(17, id="a-number")]
)
def test_a_key_no_run_can_have_is_recorded_not_a_500(source: str, ref: Any) -> None:
    """The key callable returns what the payload holds — here a ref longer than any run key
    (255 characters), or a number: the delivery is recorded (202), its outcome saying no run
    started; a 500 would have GitHub redeliver it for ever."""
    body = json.dumps({"ref": ref}).encode()
    headers = {
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": github_signature(SECRET, body),
    }
    response = Client().post(
        f"/hooks/{SOURCE}/", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 202, (response.status_code, response.content)
    (event,) = TriggerEvent.objects.filter(source_name=SOURCE)
    assert event.run_id is None and "not started" in event.outcome, event.outcome
    assert not WorkflowRun.objects.filter(workflow=WORKFLOW).exists()
