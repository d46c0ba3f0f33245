"""The demo's workflows and their idempotent, attempt-fenced step functions.

``build-preview`` (GitHub push → checkout → build → comment) writes a ``PreviewBuild`` and a
``PreviewComment`` fenced by the step's attempt; ``fulfil-order`` (Stripe paid order → record
order → reserve stock → send receipt) writes an order, a reservation and a receipt keyed by the
payment. Every execution is journalled (``StepExecution``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from demo_project.journal.models import Outcome, StepExecution
from demo_project.previews.models import PreviewBuild, PreviewComment
from demo_project.shop.models import DEMO_SKU, Order, Product, Receipt, Reservation
from demo_project.shop.workflows import paid_order
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.workflows import Worker, execute_step, run_pass, start_workflow
from tests.helpers import lapse_step_lease, race
from tests.payloads import PayloadSet

pytestmark = pytest.mark.django_db(transaction=True)

DEMO = Path(__file__).resolve().parent.parent / "demo_project"
PUSH_SAMPLES = DEMO / "previews" / "samples"
STRIPE_SAMPLES = DEMO / "shop" / "samples"


@pytest.fixture(autouse=True)
def product() -> None:
    # transactional_db empties the tables between tests, the migration's product included.
    Product.objects.get_or_create(sku=DEMO_SKU, defaults={"name": "Credits", "stock": 1000})


def run_all() -> None:
    assert Worker(concurrency=2, poll_interval=0.05).run(once=True, handle_signals=False) == 0


def stock() -> int:
    return Product.objects.get(sku=DEMO_SKU).stock


def delivery(path: Path) -> dict[str, Any]:
    event = json.loads(path.read_text())
    return {"source": "stripe-orders", "event": event["type"], "payload": event}


# -- build-preview -------------------------------------------------------------------------------


def test_build_preview_records_its_build_and_comment_once_per_run(settings: Any) -> None:
    settings.DEMO_STEP_SECONDS = 0
    push = json.loads((PUSH_SAMPLES / "push-main.json").read_text())
    run_id = start_workflow("build-preview", push)
    run_all()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    build = PreviewBuild.objects.get(run_id=run_id)
    assert (build.build_id, build.sha, build.attempt) == (run.output["build_id"], push["after"], 1)
    comment = PreviewComment.objects.get(run_id=run_id)
    assert comment.url == run.output["preview"] and comment.commit == push["after"]
    journal = StepExecution.objects.filter(run_id=run_id).order_by("started_at", "id")
    assert [(e.step_name, e.attempt, e.outcome) for e in journal] == [
        ("checkout", 1, Outcome.DONE),
        ("build", 1, Outcome.LANDED),
        ("comment", 1, Outcome.LANDED),
    ]


def _claim_build_attempt(run_id: uuid.UUID, ttl: float = 30.0) -> Any:
    claim = WorkflowStep.objects.claim_for_execution(run_id, "build", "previews.build", ttl)
    assert claim is not None
    return claim


def test_a_stale_build_attempt_has_its_write_and_its_result_refused(settings: Any) -> None:
    """Attempt 1 is paused past its step lease; attempt 2 runs the step and lands; attempt 1
    then finishes: its own write and its result are both refused, and nothing of it shows."""
    settings.DEMO_STEP_SECONDS = 0
    push = json.loads((PUSH_SAMPLES / "push-feature.json").read_text())
    run_id = start_workflow("build-preview", push)
    assert run_pass(run_id) == "waiting"
    checkout = WorkflowStep.objects.claim_due(30.0)
    assert checkout is not None and checkout.step_name == "checkout"
    assert execute_step(checkout) == "succeeded"
    assert run_pass(run_id) == "waiting"

    first = _claim_build_attempt(run_id)
    lapse_step_lease(run_id=run_id, step_name="build")
    second = _claim_build_attempt(run_id)
    assert (first.attempt, second.attempt) == (1, 2)
    assert execute_step(second) == "succeeded"
    assert execute_step(first) == "superseded"

    build = PreviewBuild.objects.get(run_id=run_id)
    assert build.attempt == 2
    outcomes = dict(
        StepExecution.objects.filter(run_id=run_id, step_name="build").values_list(
            "attempt", "outcome"
        )
    )
    assert outcomes == {1: Outcome.REFUSED, 2: Outcome.LANDED}
    step = WorkflowStep.objects.get(run_id=run_id, step_name="build")
    assert (step.status, step.attempt, step.result["build_id"]) == (
        "succeeded",
        2,
        build.build_id,
    )
    history = [
        (h.attempt, h.status) for h in WorkflowStep.objects.history(run_id) if h.step == step
    ]
    assert history == [(1, "running"), (2, "succeeded")]
    run_all()
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED


def test_the_fenced_record_refuses_an_older_attempt_and_accepts_the_same_or_newer() -> None:
    run_id = uuid.uuid4()
    fields = {"repository": "o/r", "ref": "refs/heads/x", "sha": "a" * 40, "artifact": "x"}
    record = PreviewBuild.objects.record
    assert record(run_id, 2, written_by="b", build_id="two", **fields) is True
    assert record(run_id, 1, written_by="a", build_id="one", **fields) is False
    assert record(run_id, 2, written_by="b", build_id="two-again", **fields) is True
    assert record(run_id, 3, written_by="c", build_id="three", **fields) is True
    row = PreviewBuild.objects.get(run_id=run_id)
    assert (row.attempt, row.build_id, row.written_by) == (3, "three", "c")
    assert PreviewBuild.objects.filter(run_id=run_id).count() == 1


def _race_fenced_writes(run_id: uuid.UUID, attempts: list[int]) -> dict[int, bool]:
    fields = {"repository": "o/r", "ref": "refs/heads/x", "sha": "a" * 40, "artifact": "x"}

    def write(attempt: int) -> bool:
        return PreviewBuild.objects.record(
            run_id, attempt, written_by=str(attempt), build_id=str(attempt), **fields
        )

    landed = race([lambda attempt=attempt: write(attempt) for attempt in attempts])
    assert all(isinstance(answer, bool) for answer in landed), landed  # no write raised
    return dict(zip(attempts, landed, strict=True))


def test_racing_fenced_records_leave_the_highest_attempt() -> None:
    """Attempts 1..6 write one fresh run's row from six threads at once, 10 times over: the
    row always ends with attempt 6's values, whatever order the writes landed in."""
    for _ in range(10):
        run_id = uuid.uuid4()
        landed = _race_fenced_writes(run_id, [1, 2, 3, 4, 5, 6])
        row = PreviewBuild.objects.get(run_id=run_id)
        assert (row.attempt, row.build_id) == (6, "6")
        assert landed[6] is True and len(landed) == 6
        assert PreviewBuild.objects.filter(run_id=run_id).count() == 1


# -- fulfil-order ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["checkout.session.completed.json", "payment_intent.succeeded.json"]
)
def test_fulfil_order_reserves_stock_and_sends_one_receipt(name: str) -> None:
    event = delivery(STRIPE_SAMPLES / name)
    expected = paid_order(event["event"], event["payload"])
    before = stock()
    run_id = start_workflow("fulfil-order", event)
    run_all()
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    order = Order.objects.get(payment=expected["payment"])
    assert (order.amount, order.currency, order.email, order.status) == (
        expected["amount"],
        expected["currency"],
        expected["email"],
        "receipted",
    )
    assert Reservation.objects.get(order=order).quantity == expected["quantity"]
    assert stock() == before - expected["quantity"]
    receipt = Receipt.objects.get(order=order)
    assert run.output == {
        "payment": order.payment,
        "order": order.pk,
        "reserved": expected["quantity"],
        "receipt": receipt.number,
    }

    # The same event again (a redelivery under a new id, or a replayed payload): a second run
    # that changes nothing.
    again = start_workflow("fulfil-order", event)
    run_all()
    assert WorkflowRun.objects.get(pk=again).status == RunStatus.COMPLETED
    assert Order.objects.filter(payment=expected["payment"]).count() == 1
    assert Reservation.objects.filter(order=order).count() == 1
    assert Receipt.objects.filter(order=order).count() == 1
    assert stock() == before - expected["quantity"]
    outcomes = StepExecution.objects.filter(run_id=again).values_list("outcome", flat=True)
    assert set(outcomes) == {Outcome.DONE}


def test_fulfil_order_runs_the_paid_stripe_events(payload_set: PayloadSet) -> None:
    # Ours and, when ../shared is there, the real events: two payments, one order each.
    paid = [
        {"source": "stripe-orders", "event": sample.event, "payload": sample.payload}
        for type_ in ("checkout.session.completed", "payment_intent.succeeded")
        for sample in payload_set.stripe(type_)
    ]
    assert len(paid) == 2
    before = stock()
    run_ids = [start_workflow("fulfil-order", d) for d in paid]
    run_all()
    for run_id, event in zip(run_ids, paid, strict=True):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == RunStatus.COMPLETED, run.error
        payment = event["payload"]["data"]["object"]
        key = payment.get("payment_intent") or payment["id"]
        assert run.output["payment"] == key
        assert Receipt.objects.filter(order__payment=key).count() == 1
    assert stock() == before - 2


def test_a_step_function_that_runs_again_as_a_new_attempt_changes_nothing() -> None:
    event = delivery(STRIPE_SAMPLES / "payment_intent.succeeded.json")
    run_id = start_workflow("fulfil-order", event)
    run_all()
    before = stock()
    # An operator retries the reservation step of the completed run: a new attempt of a step
    # whose work is already done.
    step = WorkflowStep.objects.get(run_id=run_id, step_name="reserve-stock")
    WorkflowStep.objects.filter(pk=step.pk).update(status="failed", retries=5)
    WorkflowRun.objects.filter(pk=run_id).update(status="running")
    claim = WorkflowStep.objects.claim_for_execution(
        run_id, "reserve-stock", "shop.reserve_stock", 30.0
    )
    assert claim is not None and claim.attempt == 2
    assert execute_step(claim) == "succeeded"
    assert stock() == before
    assert Reservation.objects.filter(order__payment="pi_demo_preview_pack_0002").count() == 1


@pytest.mark.parametrize(
    ("event", "payload", "message"),
    [
        ("customer.created", {"data": {"object": {"id": "cus_1"}}}, "not 'customer.created'"),
        ("payment_intent.succeeded", {"data": {}}, "data.object.id"),
        ("payment_intent.succeeded", [], "data.object.id"),
    ],
)
def test_paid_order_refuses_what_is_not_a_paid_order(
    event: str, payload: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        paid_order(event, payload)


@pytest.mark.parametrize(
    "model",
    [
        "journal/stepexecution",
        "journal/digest",
        "previews/previewbuild",
        "previews/previewcomment",
        "shop/product",
        "shop/order",
        "shop/reservation",
        "shop/receipt",
    ],
)
def test_the_demo_tables_are_listed_in_the_admin(admin_client: Any, model: str) -> None:
    push = json.loads((PUSH_SAMPLES / "push-main.json").read_text())
    start_workflow("build-preview", push)
    start_workflow("fulfil-order", delivery(STRIPE_SAMPLES / "payment_intent.succeeded.json"))
    run_all()
    response = admin_client.get(f"/admin/{model}/")
    assert response.status_code == 200
    assert admin_client.get(f"/admin/{model}/add/").status_code in (200, 403)
