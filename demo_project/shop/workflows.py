"""The demo shop's workflow: a Stripe "order paid" event → reserve stock → send the receipt.

``fulfil-order`` is started with the delivery envelope (``StartWorkflow("fulfil-order",
input="delivery")``: ``{"event": ..., "payload": <the Stripe Event>, ...}``) for the events
``checkout.session.completed`` and ``payment_intent.succeeded``. Its steps:

1. ``record-order`` (``shop.record_order``): the order of the payment (the PaymentIntent id,
   or the Checkout Session id when the session has none), created once;
2. ``reserve-stock`` (``shop.reserve_stock``): takes the order's quantity from the product's
   stock once — the reservation and the stock change commit together;
3. ``send-receipt`` (``shop.send_receipt``): records the receipt as sent, once.

Every step is **idempotent**: its writes are keyed by the payment, so a step that runs again
(its worker died after the write but before the result was recorded) or a second event about
the same payment changes nothing. Each execution is journalled (:mod:`demo_project.journal`).
"""

from __future__ import annotations

from typing import Any

from demo_project.journal.steps import journalled
from demo_project.shop.models import DEMO_SKU, Order, Receipt, Reservation
from django_leases.workflows import step_function, workflow

WORKFLOW = "fulfil-order"
#: The Stripe events that mean "this order is paid".
PAID_EVENTS = ("checkout.session.completed", "payment_intent.succeeded")


def paid_order(event: str, stripe_event: dict[str, Any]) -> dict[str, Any]:
    """The order a paid-event describes (JSON): payment id, amount, currency, email, SKU and
    quantity (``metadata.sku`` / ``metadata.quantity`` when the object has them).

    Raises ``ValueError`` for an event that is not one of :data:`PAID_EVENTS` or lacks an
    object id."""
    if event not in PAID_EVENTS:
        raise ValueError(f"fulfil-order handles {', '.join(PAID_EVENTS)}, not {event!r}")
    data = stripe_event.get("data") if isinstance(stripe_event, dict) else None
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise ValueError("the Stripe event has no data.object.id")
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if event == "checkout.session.completed":
        details = obj.get("customer_details") or {}
        payment = obj.get("payment_intent") or obj["id"]
        amount = obj.get("amount_total")
        email = details.get("email") or obj.get("customer_email")
    else:
        payment = obj["id"]
        amount = obj.get("amount_received") or obj.get("amount")
        email = obj.get("receipt_email")
    try:
        quantity = max(1, int(metadata.get("quantity", 1)))
    except (TypeError, ValueError):
        quantity = 1
    return {
        "payment": str(payment),
        "event": event,
        "amount": int(amount or 0),
        "currency": str(obj.get("currency") or "usd"),
        "email": str(email or ""),
        "sku": str(metadata.get("sku") or DEMO_SKU),
        "quantity": quantity,
    }


@workflow(WORKFLOW)
def fulfil_order(run: Any, delivery: dict[str, Any]) -> dict[str, Any]:
    """record-order → reserve-stock → send-receipt for one paid-order delivery."""
    if not isinstance(delivery, dict):
        raise ValueError("fulfil-order expects a delivery envelope (a JSON object)")
    order = run.step(
        "record-order",
        "shop.record_order",
        paid_order(str(delivery.get("event")), delivery.get("payload") or {}),
    )
    reservation = run.step("reserve-stock", "shop.reserve_stock", order, retries=3, retry_delay=1)
    receipt = run.step("send-receipt", "shop.send_receipt", order, retries=3, retry_delay=1)
    return {
        "payment": order["payment"],
        "order": order["order_id"],
        "reserved": reservation["quantity"],
        "receipt": receipt["number"],
    }


@step_function("shop.record_order")
def record_order(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Create the order of the payment once; returns the order's fields and its id."""
    with journalled(ctx, WORKFLOW) as entry:
        fields = {k: data[k] for k in ("event", "amount", "currency", "email", "sku", "quantity")}
        order, created = Order.objects.record_paid(data["payment"], **fields)
        if created:
            entry.landed(f"order {order.pk} created")
        return {**data, "order_id": order.pk}


@step_function("shop.reserve_stock")
def reserve_stock(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Reserve the order's stock once."""
    with journalled(ctx, WORKFLOW) as entry:
        order = Order.objects.get(pk=data["order_id"])
        reservation, created = Reservation.objects.reserve(order)
        if created:
            entry.landed(f"{reservation.quantity} × {order.sku} reserved")
        return {"reservation": reservation.pk, "sku": order.sku, "quantity": reservation.quantity}


@step_function("shop.send_receipt")
def send_receipt(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Record the order's receipt as sent, once."""
    with journalled(ctx, WORKFLOW) as entry:
        order = Order.objects.get(pk=data["order_id"])
        amount = f"{order.amount / 100:.2f} {order.currency.upper()}"
        body = f"Thank you! We received {amount} for {order.quantity} × {order.sku}."
        receipt, created = Receipt.objects.send_once(order, body)
        if created:
            entry.landed(f"receipt {receipt.number} sent to {receipt.email or 'nobody'}")
        return {"number": receipt.number, "email": receipt.email}
