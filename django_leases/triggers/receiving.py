"""Receiving a webhook delivery: every rule of ``POST hooks/<name>/`` (DESIGN §6).

In order, so that nothing is read or recorded for a delivery that will be refused:

1. unknown, orphaned (no longer declared) or disabled source → 404, checked before the body
   is read and again, under the source row's lock, in the transaction that records the
   delivery (so a source disabled while a body is still arriving records nothing); a source
   whose row is declared and enabled but that *this process* has no declaration of (a web
   process still on the previous deploy, or whose ``triggers.py`` failed to import) → 503
   ``not_declared_here``, so the sender delivers again and the tally tells it apart from a
   disabled source;
2. a ``Content-Length`` that is not a plain decimal integer (ASCII digits only: no sign, no
   space) → 400; body over ``DJANGO_LEASES["WEBHOOK_MAX_BODY"]`` bytes, by ``Content-Length``
   or by the bytes actually sent → 413 (read by us, so Django's
   ``DATA_UPLOAD_MAX_MEMORY_SIZE`` plays no part); a header the provider reads that takes
   one value (``X-GitHub-Delivery``, ``X-GitHub-Event``, ``X-Hub-Signature-256``,
   ``Stripe-Signature``, …) sent more than once → 400. WSGI servers and Django's ASGI handler
   join repeated headers with ``,``, so a comma where the value never has one (or a second
   ``t=`` in ``Stripe-Signature``) is how a repeat is told
   (:meth:`~django_leases.triggers.providers.base.Provider.refuse_repeated_headers`);
3. missing or wrong signature (or no signing secret for the source) → 401, verified the
   provider's way (GitHub ``X-Hub-Signature-256``; Stripe ``Stripe-Signature`` within its
   timestamp tolerance; a ``manual`` source with its ``config["signature"]`` scheme) against
   the source's signing secret: ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]`` when set, else the
   encrypted credential store (:func:`~django_leases.triggers.credentials.signing_secret`);
4. unreadable delivery (not a JSON object, no event name or delivery id) → 400;
5. a delivery id already recorded for the source → 200, not processed again;
6. otherwise the delivery is recorded as a ``TriggerEvent`` and its handler's workflow run
   is created in the same transaction → 202.

Refusals raise a :class:`~django_leases.exceptions.ReceiveError` carrying the status and a
reason (:data:`~django_leases.triggers.values.REFUSAL_REASONS`). Every refusal — and a
delivery that could not be recorded (``not_recorded``, 500) — is counted per source and
reason (``TriggerRefusal``; a name no source row has is not counted) and sent as signal
``delivery_refused``; a recorded delivery (and a repeated one) sends ``delivery_accepted``.
Neither keeps anything of a refused body or its headers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping

from django_leases import signals
from django_leases.conf import leases_settings
from django_leases.exceptions import (
    CredentialError,
    MalformedDelivery,
    PayloadTooLarge,
    ReceiveError,
    SignatureMismatch,
    SourceNotDeclaredHere,
    SourceNotReceiving,
)
from django_leases.frozen import frozen
from django_leases.models.trigger import (
    TriggerEvent,
    TriggerRefusal,
    TriggerSecret,
    TriggerSource,
)
from django_leases.triggers.registry import get_declaration, get_provider
from django_leases.validation import check_source_name

logger = logging.getLogger("django_leases.triggers")


@frozen
class Reception:
    """What a delivery came to: ``status`` (202 accepted, 200 repeated delivery id)."""

    status: int
    source: str
    event: str
    delivery_id: str
    event_id: int
    run_id: uuid.UUID | None
    duplicate: bool

    def as_json(self) -> dict[str, object]:
        """The small JSON body answered to the sender."""
        return {
            "status": "duplicate" if self.duplicate else "accepted",
            "source": self.source,
            "event": self.event,
            "delivery": self.delivery_id,
            "event_id": self.event_id,
            "run_id": None if self.run_id is None else str(self.run_id),
        }


def max_body() -> int:
    """``DJANGO_LEASES["WEBHOOK_MAX_BODY"]`` in bytes (validated by check ``E010``)."""
    return int(leases_settings.WEBHOOK_MAX_BODY)


def _declared_length(content_length: str | None, limit: int) -> None:
    """Refuse a ``Content-Length`` that is not a plain decimal integer (400) or is over ``limit``.

    Plain means ASCII digits and nothing else, as HTTP defines it (``1*DIGIT``): no sign, no
    space, no ``_``, no other script's digits — all of which :func:`int` would take. Two
    ``Content-Length`` headers joined with ``,`` (as Django's ASGI handler does) are not plain
    either. An empty or absent value means no length was declared (WSGI's rule).
    """
    if not content_length:
        return
    if not (content_length.isascii() and content_length.isdigit()):
        raise MalformedDelivery(
            "The Content-Length header is not a plain decimal number", reason="bad_request"
        )
    digits = content_length.lstrip("0") or "0"
    # A number of more digits than the limit is over it, however long (no int() of it).
    if len(digits) > len(str(limit)) or int(digits) > limit:
        raise PayloadTooLarge(f"The body is over the limit of {limit} bytes")


def receive(
    name: str,
    *,
    read: Callable[[int], bytes],
    headers: Mapping[str, str],
    content_length: str | None,
) -> Reception:
    """Verify, parse and record one delivery to source ``name``.

    Args:
        name: the source name from the URL.
        read: reads at most N bytes of the body (``request.read``); called once.
        headers: the request headers (any case; e.g. ``request.headers``).
        content_length: the raw ``Content-Length`` value, or ``None``.

    Returns a :class:`Reception`. Raises a ``ReceiveError`` subclass for a refused
    delivery (nothing recorded), and whatever the handler or the database raised (nothing
    recorded). Either way the refusal is counted and signalled (see the module's doc) before
    the error propagates; a failure to count it is logged, never raised instead.

    The source is looked up twice: cheaply here, so an unknown or disabled source never
    makes us read a body, and again under its row lock by ``TriggerEvent.objects.accept``,
    so one disabled (or orphaned) while the body was arriving is still refused (404).
    """
    try:
        reception = _receive(name, read=read, headers=headers, content_length=content_length)
    except ReceiveError as exc:
        _refused(name, exc.reason, exc.status)
        raise
    except Exception:
        _refused(name, "not_recorded", 500)
        raise
    signals.delivery_accepted.send_robust(
        sender=TriggerEvent,
        source=name,
        event=reception.event,
        delivery_id=reception.delivery_id,
        run_id=reception.run_id,
        duplicate=reception.duplicate,
    )
    return reception


def _refused(name: str, reason: str, status: int) -> None:
    """Count and signal one refused delivery; a failure to count is logged, not raised."""
    try:
        TriggerRefusal.objects.tally(name, reason, status)
    except Exception:
        logger.warning(
            "Trigger source %r: a refused delivery (%s) could not be counted",
            name,
            reason,
            exc_info=True,
        )
    signals.delivery_refused.send_robust(
        sender=TriggerEvent, source=name, reason=reason, status=status
    )


def _storable_name(name: str) -> bool:
    """Whether ``name`` is one a source row can have (no NUL, which PostgreSQL cannot even
    compare, no lone surrogate, at most 200 characters): only those are looked up."""
    try:
        check_source_name(name)
    except ValueError:
        return False
    return True


def _receive(
    name: str,
    *,
    read: Callable[[int], bytes],
    headers: Mapping[str, str],
    content_length: str | None,
) -> Reception:
    """:func:`receive` without the counting and the signals."""
    declaration = get_declaration(name)
    source = TriggerSource.objects.receivable(name) if _storable_name(name) else None
    if declaration is None and source is not None:
        logger.warning(
            "Trigger source %r is enabled, but this process has no declaration of it "
            "(a deploy under way, or its triggers.py failed to import); refusing with 503",
            name,
        )
        raise SourceNotDeclaredHere(
            f"Trigger source {name!r} is not declared in this process; deliver again later"
        )
    provider = get_provider(declaration.provider) if declaration is not None else None
    if declaration is None or source is None or provider is None:
        raise SourceNotReceiving(f"No enabled trigger source named {name!r}")
    provider = provider.for_config(declaration.config)

    limit = max_body()
    _declared_length(content_length, limit)
    lowered = {key.lower(): value for key, value in headers.items()}
    provider.refuse_repeated_headers(lowered)
    body = read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"The body is over the limit of {limit} bytes")
    if not body and not content_length and "chunked" in lowered.get("transfer-encoding", ""):
        # Django under WSGI reads no body without a Content-Length: the sender is told so,
        # not that its signature (of a body we never saw) is wrong.
        raise MalformedDelivery(
            "A body sent without Content-Length (chunked) cannot be read here: send its "
            "Content-Length",
            reason="bad_request",
        )

    try:
        secret = TriggerSecret.objects.db_manager(source._state.db).signing_secret(name)
    except CredentialError:
        logger.error(
            "Trigger source %r: its stored signing secret cannot be decrypted with the "
            "configured keys; refusing its delivery",
            name,
        )
        secret = None
    if not secret:
        logger.warning(
            "Trigger source %r has no signing secret configured; refusing its delivery", name
        )
        raise SignatureMismatch("The delivery's signature cannot be verified", reason="no_secret")
    if not provider.verify(secret, body, lowered):
        raise SignatureMismatch("The delivery's signature is missing or does not match")

    parsed = provider.parse(body, lowered)
    accepted = TriggerEvent.objects.accept(source, parsed, declaration.handler_for(parsed.event))
    if accepted.created:
        logger.info(
            "Trigger source %r accepted %s delivery %s (run %s)",
            name,
            parsed.event,
            parsed.delivery_id,
            accepted.run_id,
        )
    else:
        logger.info("Trigger source %r ignored repeated delivery %s", name, parsed.delivery_id)
    return Reception(
        status=202 if accepted.created else 200,
        source=name,
        event=parsed.event,
        delivery_id=parsed.delivery_id,
        event_id=accepted.event.pk,
        run_id=accepted.run_id,
        duplicate=not accepted.created,
    )
