"""The receive view, ``POST hooks/<name>/``: a thin shell around :func:`receiving.receive`."""

from __future__ import annotations

import logging

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_leases.exceptions import ReceiveError
from django_leases.triggers.receiving import receive

logger = logging.getLogger("django_leases.triggers")


@csrf_exempt
@transaction.non_atomic_requests
def receive_webhook(request: HttpRequest, name: str) -> JsonResponse:
    """Receive one webhook delivery for trigger source ``name``.

    Answers 202 (recorded; JSON with ``event_id`` and ``run_id``), 200 (repeated delivery
    id), 404, 503 (enabled, but not declared in this process), 413, 401 or 400 (JSON
    ``{"error": …}``, nothing recorded), 405 with
    ``Allow: POST`` for other methods (JSON too, nothing read), and 500 only when recording
    itself failed (nothing was kept; the sender may deliver again).

    Never inside ``ATOMIC_REQUESTS``' transaction: a 202 means the delivery is committed,
    and a refusal's tally is kept although the answer is an error.
    """
    if request.method != "POST":
        response = JsonResponse(
            {"error": f"Method {request.method} is not allowed here; deliveries are POSTed"},
            status=405,
        )
        response["Allow"] = "POST"
        return response
    try:
        reception = receive(
            name,
            read=request.read,
            headers=request.headers,
            content_length=request.META.get("CONTENT_LENGTH"),
        )
    except ReceiveError as exc:
        return JsonResponse({"error": exc.message}, status=exc.status)
    except Exception:
        logger.exception("Trigger source %r: a delivery could not be recorded", name)
        return JsonResponse(
            {"error": "The delivery could not be recorded; nothing was kept"}, status=500
        )
    return JsonResponse(reception.as_json(), status=reception.status)
