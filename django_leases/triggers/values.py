"""The values the trigger-source layers pass each other: deliveries, statuses, outcomes.

A leaf module (it imports no model), so the models, the providers, the registry and the
receiving side all speak the same words; ``django_leases.triggers`` re-exports
:class:`Delivery`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.utils.translation import gettext_lazy as _

from django_leases.frozen import frozen

if TYPE_CHECKING:  # for annotations only: this module imports no model
    from django.utils.functional import _StrPromise

    from django_leases.models import TriggerEvent

#: What ``TriggerSource.status`` may hold (besides ``None``, a row never set up): ``off``
#: (nothing registered), ``pending`` (a setup or teardown is under way, or was interrupted),
#: ``registered`` (the provider's API holds our endpoint), ``manual`` (registration is the
#: operator's job; ``detail`` says how), ``failed`` (the last setup or teardown failed;
#: ``detail`` says why).
STATUSES = ("off", "pending", "registered", "manual", "failed")

#: What an operator reads for each status (the admin's badges and status filter), lazily in
#: the active language.
STATUS_LABELS: dict[str, _StrPromise] = {
    "off": _("off"),
    "pending": _("pending"),
    "registered": _("registered"),
    "manual": _("manual"),
    "failed": _("failed"),
}

#: Why a delivery was refused, with the HTTP status answered: the ``reason`` of signal
#: ``delivery_refused``, of the refused-delivery tallies (``TriggerRefusal``) and of the
#: ``django_leases_deliveries_total`` metric.
REFUSAL_REASONS: dict[str, tuple[int, _StrPromise]] = {
    "not_receiving": (404, _("unknown, orphaned or disabled source")),
    "not_declared_here": (
        503,
        _("enabled, but not declared in the process that received it (a deploy under way?)"),
    ),
    "bad_request": (400, _("bad Content-Length, or a one-value header sent twice")),
    "too_large": (413, _("body over WEBHOOK_MAX_BODY")),
    "no_secret": (401, _("the source has no usable signing secret")),
    "bad_signature": (401, _("signature missing or not matching")),
    "malformed": (400, _("signed, but not a delivery that can be read")),
    "not_recorded": (500, _("the handler or the database failed; nothing was kept")),
}


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: ``TriggerSource.objects.record(..., state=UNSET)`` (the default) keeps the stored state.
UNSET: Any = _Unset()


@frozen
class ParsedDelivery:
    """What a provider reads from a delivery: event name, delivery id and JSON payload."""

    event: str
    delivery_id: str
    payload: dict[str, Any]


@frozen
class Delivery:
    """One verified, parsed delivery, as a handler sees it.

    Attributes:
        source: the trigger source's name (``str``).
        provider: the provider that sent it (``"github"``).
        event: the event name (GitHub's ``X-GitHub-Event``, e.g. ``"push"``).
        delivery_id: the provider's delivery id (GitHub's ``X-GitHub-Delivery``).
        payload: the decoded JSON body (a ``dict``).
        using: the database alias the delivery is being recorded on; handlers that write
            must write there, inside the current transaction.
    """

    source: str
    provider: str
    event: str
    delivery_id: str
    payload: dict[str, Any]
    using: str = "default"

    @property
    def action(self) -> str | None:
        """The payload's ``action`` (GitHub: ``"opened"``, ``"closed"``…), if it has one."""
        action = self.payload.get("action")
        return action if isinstance(action, str) else None

    def as_input(self) -> dict[str, Any]:
        """The workflow input ``StartWorkflow(..., input="delivery")`` passes (JSON)::

        {"source": str, "provider": str, "event": str, "action": str | None,
         "delivery_id": str, "payload": dict}
        """
        return {
            "source": self.source,
            "provider": self.provider,
            "event": self.event,
            "action": self.action,
            "delivery_id": self.delivery_id,
            "payload": self.payload,
        }


@frozen
class Handled:
    """What a handler may return to say what it did with a delivery, recorded on the
    ``TriggerEvent`` row: ``run_id`` (the run it started or sent an event to, linked to the
    delivery; ``None``: no run) and ``outcome`` (a short sentence for operators)."""

    run_id: uuid.UUID | None
    outcome: str


#: What a handler is: called with the :class:`Delivery`; may return a workflow run id, or
#: a :class:`Handled` that also says what came of the delivery.
Handler = Callable[[Delivery], "uuid.UUID | Handled | None"]


@frozen
class Accepted:
    """Outcome of ``TriggerEvent.objects.accept``.

    ``event`` is the ``TriggerEvent`` row; ``created`` is ``False`` for a repeated delivery
    id (nothing was processed again); ``run_id`` is the workflow run the delivery started
    (``None`` when it started none).
    """

    event: TriggerEvent
    created: bool
    run_id: uuid.UUID | None


__all__ = [
    "STATUSES",
    "UNSET",
    "Accepted",
    "Delivery",
    "Handled",
    "Handler",
    "ParsedDelivery",
]
