"""Webhook receiving under concurrency — a teardown racing a refused delivery, refusals and
deliveries racing each other and the sync, a chunked body — and retention pruning a
cancelled run whose step a worker still runs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db.models.signals import post_delete
from django.test import Client

from django_leases.models import (
    TriggerEvent,
    TriggerRefusal,
    TriggerSource,
    WorkflowRun,
    WorkflowStep,
)
from django_leases.triggers import lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.triggers.signatures import github_signature
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import execute_step
from tests.helpers import race, raw_request, start_blocked

SOURCE = "test-receiving-edges"
SECRET = "receiving-edges-secret"
WORKFLOW = "test-receiving-edges-build"
URL = f"/hooks/{SOURCE}/"

pytestmark = pytest.mark.django_db(transaction=True)


@workflow(WORKFLOW)
def _build(run: Any, input: Any) -> Any:
    return input


@pytest.fixture
def source(settings: Any) -> Any:
    webhook_source(
        SOURCE,
        provider="github",
        config={"repository": "octo-org/octo-repo"},
        events={"push": StartWorkflow(WORKFLOW)},
    )
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {SOURCE: SECRET}}
    TriggerSource.objects.sync(registry.declarations())
    TriggerSource.objects.set_enabled(SOURCE, True)
    yield SOURCE
    registry.unregister(SOURCE)


BODY = b'{"ref": "refs/heads/main", "repository": {"full_name": "octo-org/octo-repo"}}'


def _headers(body: bytes = BODY, delivery: str | None = None, secret: str = SECRET) -> dict:
    return {
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": github_signature(secret, body),
    }


def _post(body: bytes = BODY, **kw: Any) -> int:
    return (
        Client()
        .post(URL, data=body, content_type="application/json", headers=_headers(body, **kw))
        .status_code
    )


# -- receiving ---------------------------------------------------------------------------------


def test_teardown_while_a_refused_delivery_is_counted_deletes_the_row(source: str) -> None:
    # A delivery refused (404, the source just disabled by the teardown) is counted while the
    # teardown deletes the row: the teardown must still delete the row (the docs: "stops
    # receiving, removes the registration ... and deletes the row"), not fail on the tally
    # row the refusal inserted.
    assert _post(secret="wrong") == 401  # a first refusal row, so one is deleted (and signalled)
    state: dict[str, Any] = {}

    def refused_meanwhile(sender: Any, **kwargs: Any) -> None:
        if "delivery" not in state:
            state["delivery"] = start_blocked(lambda: _post())

    post_delete.connect(refused_meanwhile, sender=TriggerRefusal)
    try:
        result = lifecycle.teardown(SOURCE)
    finally:
        post_delete.disconnect(refused_meanwhile, sender=TriggerRefusal)
    assert state["delivery"].result() == 404
    assert result.ok
    assert not TriggerSource.objects.filter(name=SOURCE).exists()


def test_concurrent_refusals_are_all_counted(source: str) -> None:
    # Each refusal is "counted per source and reason": 6 bad signatures at once count 6.
    copies = 6
    statuses = race([lambda: _post(secret="wrong")] * copies)
    assert statuses == [401] * copies
    tally = TriggerRefusal.objects.get(source__name=SOURCE, reason="bad_signature")
    assert tally.count == copies


def test_deliveries_racing_reconcile_are_never_500(source: str) -> None:
    calls = [lambda: _post() for _ in range(4)] + [
        lambda: TriggerSource.objects.sync(registry.declarations()) and "synced"
    ] * 2
    results = race(calls)
    assert results[:4] == [202] * 4, results
    assert results[4:] == ["synced"] * 2, results
    assert TriggerEvent.objects.filter(source_name=SOURCE).count() == 4
    assert WorkflowRun.objects.filter(workflow=WORKFLOW).count() == 4


def test_duplicates_racing_reconcile_start_one_run(source: str) -> None:
    delivery = str(uuid.uuid4())
    calls = [lambda: _post(delivery=delivery) for _ in range(4)] + [
        lambda: TriggerSource.objects.sync(registry.declarations()) and "synced"
    ]
    results = race(calls)
    assert sorted(results[:4]) == [200, 200, 200, 202], results
    assert TriggerEvent.objects.filter(source_name=SOURCE).count() == 1
    assert WorkflowRun.objects.filter(workflow=WORKFLOW).count() == 1


def _chunked(body: bytes, size: int = 64) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def test_a_chunked_body_without_a_length_is_told_to_send_one(source: str, live_server: Any) -> None:
    """A body sent chunked, without ``Content-Length``, through a WSGI server: Django hands
    the view none of it. The sender gets a 400 saying to send the length — not a 401 saying
    its signature (of a body never seen) is wrong — and nothing is recorded."""
    headers = [*_headers().items(), ("Content-Type", "application/json")]
    answer = raw_request(
        live_server.url,
        "POST",
        URL,
        [*headers, ("Transfer-Encoding", "chunked")],
        _chunked(BODY),
        content_length=None,
    )
    assert answer.status == 400, answer
    assert b"Content-Length" in answer.body, answer
    assert not TriggerEvent.objects.exists()
    tally = TriggerRefusal.objects.get(source__name=SOURCE)
    assert (tally.reason, tally.last_status) == ("bad_request", 400)


# -- retention ----------------------------------------------------------------------------------


PRUNED_STEP = "tests.receiving-edges.cancelled-and-pruned"


@step_function(PRUNED_STEP)
def _cancelled_and_pruned(data: Any, ctx: Any) -> Any:
    """While it runs, its run is cancelled and retention prunes it (a zero age)."""
    WorkflowRun.objects.cancel(ctx.run_id)
    assert WorkflowRun.objects.prune(0) >= 1
    return {"ok": True}


def test_a_step_whose_run_was_pruned_while_it_ran_is_dropped_quietly() -> None:
    """A cancelled run whose step a worker still runs is finished, so retention may delete
    it. The worker's write then finds no step: its outcome is dropped, as a cancelled
    step's is, and ``execute_step`` returns ``"superseded"`` (it never raises)."""
    run = WorkflowRun.objects.start("tests.receiving-edges.pruned", {})
    WorkflowStep.objects.schedule(run.id, "only", PRUNED_STEP)
    claim = WorkflowStep.objects.claim_for_execution(run.id, "only", PRUNED_STEP, 60)
    assert claim is not None
    assert execute_step(claim) == "superseded"
    assert not WorkflowRun.objects.filter(pk=run.id).exists()
