"""The provider interface: what every webhook provider does (DESIGN §6).

A provider has two sides:

* **management** — :meth:`Provider.setup`, :meth:`Provider.check` and
  :meth:`Provider.teardown` register, look up and remove the source's webhook at the provider
  (over its API, or by telling an operator what to do, for ``manual``). They return or raise
  only text that is safe to show operators: never a secret or an API token;
* **receiving** — :meth:`Provider.verify` checks a delivery's signature the provider's way and
  :meth:`Provider.parse` reads its event name, delivery id and JSON payload.

The lifecycle (``triggers/lifecycle.py``) calls the management side under the source's lease
and stores what :class:`SetupOutcome` carries: ``state`` on the row, ``secret`` in the
encrypted credential store (:mod:`django_leases.triggers.credentials`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.urls import NoReverseMatch, reverse

from django_leases.exceptions import MalformedDelivery, ProviderError
from django_leases.frozen import frozen
from django_leases.triggers.registry import get_declaration
from django_leases.triggers.values import ParsedDelivery

if TYPE_CHECKING:
    from django_leases.models import TriggerSource

#: Deepest JSON nesting accepted in a payload (GitHub's payloads nest fewer than 10 levels):
#: what every supported database stores with a level to spare — MariaDB's JSON columns refuse
#: 32 levels (``validation.MARIADB_JSON_DEPTH``), and ``StartWorkflow(..., input="delivery")`` and
#: ``SendEvent(..., payload="delivery")`` store the payload one level down.
MAX_PAYLOAD_DEPTH = 30

#: Longest event name or delivery id accepted, in characters (the column widths).
MAX_HEADER_VALUE = 200

#: ``SetupOutcome.status`` when the provider's API confirmed the registration.
REGISTERED = "registered"
#: ``SetupOutcome.status`` when an operator must register the webhook by hand.
MANUAL = "manual"


@frozen
class SetupOutcome:
    """What :meth:`Provider.setup` or :meth:`Provider.check` found.

    Attributes:
        status: ``"registered"`` (the provider's API confirmed the webhook) or ``"manual"``
            (an operator must act; ``detail`` says what to do).
        state: provider identifiers only (e.g. ``{"hook_id": 123}``), JSON-serialisable, or
            ``None``; stored on the source row. Never a secret.
        detail: text for operators: instructions or what was registered. Never a secret.
        secret: a signing secret the provider chose and returns once (Stripe), or ``None``.
            The lifecycle stores it in the encrypted credential store; it is excluded from
            ``repr`` so it cannot reach a log through the outcome.
    """

    status: str
    state: dict[str, Any] | None
    detail: str
    secret: str | None = None

    def __repr__(self) -> str:
        shown = "None" if self.secret is None else "'***'"
        return (
            f"SetupOutcome(status={self.status!r}, state={self.state!r}, "
            f"detail={self.detail!r}, secret={shown})"
        )


class Provider:
    """One kind of webhook provider. Instances are shared and stateless.

    Attributes:
        name: the provider name a declaration uses (``"github"``).
        manages_registration: ``True`` when :meth:`setup` registers the webhook through the
            provider's API; ``False`` (``manual``) when an operator registers it.
        takes_secret: ``True`` when :meth:`setup` needs our signing secret (GitHub); ``False``
            when the provider chooses one and returns it (Stripe) or none is sent (manual).
    """

    name: str = ""
    manages_registration: bool = True
    takes_secret: bool = False
    #: The headers :meth:`verify` and :meth:`parse` read that take one value, none of which
    #: holds a comma (see :meth:`refuse_repeated_headers`).
    single_valued_headers: tuple[str, ...] = ()
    #: What a sender must send with each delivery: ``(header, what it holds)`` pairs, in the
    #: order an operator reads them (shown on a source's admin page, for manual sources).
    sender_headers: tuple[tuple[str, str], ...] = ()

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """Refuse a declaration's ``config`` this provider cannot work with.

        Called when a source is declared (so a typo fails at import, not at enable time) and
        again by :meth:`setup`. Raises ``ValueError`` with a message naming the key. The
        default accepts anything.
        """

    # -- management ------------------------------------------------------------------------

    def setup(self, source: TriggerSource, url: str, secret: str | None) -> SetupOutcome:
        """Register (or update) the webhook of ``source`` so that it posts to ``url``.

        Args:
            source: the ``TriggerSource`` row; ``source.state`` is what an earlier setup
                recorded (or ``None``), ``source.config`` the declaration's non-secret config.
            url: the full receiving URL (``https://app.example.com/hooks/<name>/``).
            secret: our signing secret for providers that take one (GitHub), else ``None``.

        If ``source.state`` names a registration that still exists at the provider, it is
        updated and reused: setup never creates a second registration for a source.

        Returns a :class:`SetupOutcome`. Raises :class:`ProviderError`.
        """
        raise NotImplementedError

    def check(self, source: TriggerSource) -> SetupOutcome:
        """Look the registration recorded in ``source.state`` up at the provider.

        Returns a :class:`SetupOutcome` (never with a secret). Raises
        :class:`ProviderError` when it is gone or the provider cannot be reached.
        """
        raise NotImplementedError

    def unrecorded(self, source: TriggerSource, url: str) -> dict[str, Any] | None:
        """The state of a registration at the provider that posts to ``url`` though none is
        recorded for ``source`` (a setup whose answer was lost after the provider made it),
        for :meth:`teardown` to remove; ``None`` when there is none, or the provider cannot
        tell (the default). Raises :class:`ProviderError` as :meth:`teardown` does."""
        return None

    def teardown(self, source: TriggerSource) -> None:
        """Remove the registration recorded in ``source.state`` at the provider.

        A registration that is already gone (or none recorded) is success. Raises
        :class:`ProviderError` when the provider refuses or cannot be reached.
        """
        raise NotImplementedError

    # -- receiving -------------------------------------------------------------------------

    def for_config(self, config: Mapping[str, Any]) -> Provider:
        """The provider as a source with ``config`` receives through it (default: itself).

        ``manual`` uses it to pick the signature scheme a source's sender uses.
        """
        return self

    def refuse_repeated_headers(self, headers: Mapping[str, str]) -> None:
        """Refuse a delivery in which a header that takes one value was sent more than once.

        A WSGI server (``wsgiref``, gunicorn, …) and Django's ASGI handler both hand a header
        sent twice to the application as one value, the two joined with ``,``; nothing else
        tells the two apart. None of :attr:`single_valued_headers` ever holds a comma (a
        delivery id is a GUID, an event name a word, a signature ``sha256=<hex>``, a media
        type has no comma), so a comma in one of them is read as that header sent twice.

        Args:
            headers: the request headers, keys in lower case.

        Raises :class:`MalformedDelivery` naming the header. Called before the body is read.
        """
        for name in self.single_valued_headers:
            if "," in headers.get(name.lower(), ""):
                raise repeated_header(name)

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether the delivery's signature matches ``secret``. Never raises for bad input.

        Args:
            secret: the source's signing secret (``str``).
            body: the exact request body (``bytes``).
            headers: the request headers, keys in lower case.
        """
        raise NotImplementedError

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """Read the event, delivery id and payload; raises :class:`MalformedDelivery`.

        ``headers`` keys are lower case.
        """
        raise NotImplementedError


#: The receiving side's former name (the walking skeleton's), kept for imports.
WebhookProvider = Provider


def repeated_header(shown: str) -> MalformedDelivery:
    """The error for header ``shown`` sent more than once (the one message for every provider)."""
    return MalformedDelivery(
        f"The {shown} header was sent more than once (its values arrived joined with ',')",
        reason="bad_request",
    )


def header_value(headers: Mapping[str, str], name: str, shown: str) -> str:
    """The value of header ``name`` (lower case key); ``shown`` names it in errors.

    Only spaces and tabs around it are taken off (HTTP's optional whitespace): any other
    character before or after it — a vertical tab, a form feed, a no-break space — stays, so
    the value is refused as holding control characters instead of read as another.

    Raises :class:`MalformedDelivery` when it is missing, too long or holds control
    characters.
    """
    value = (headers.get(name) or "").strip(" \t")
    if not value:
        raise MalformedDelivery(f"The {shown} header is missing")
    return checked_identifier(value, f"The {shown} header")


def checked_identifier(value: str, shown: str) -> str:
    """``value`` if it can be stored as an event name or delivery id; ``shown`` names it.

    Raises :class:`MalformedDelivery` when it is empty, longer than
    :data:`MAX_HEADER_VALUE` characters or holds control characters.
    """
    if not value:
        raise MalformedDelivery(f"{shown} is empty")
    if len(value) > MAX_HEADER_VALUE:
        raise MalformedDelivery(f"{shown} is longer than {MAX_HEADER_VALUE} characters")
    if not value.isprintable():
        raise MalformedDelivery(f"{shown} holds control characters")
    return value


def _reject_constant(name: str) -> Any:
    raise MalformedDelivery(f"The body holds {name}, which is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise MalformedDelivery("The body holds a number too large for JSON storage")
    return value


def _check_storable(payload: Any) -> None:
    """Refuse what a JSON column cannot store: NUL, lone surrogates, absurd nesting.

    Iterative, so a deeply nested payload cannot exhaust the stack.
    """
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise MalformedDelivery(f"The payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
        if isinstance(value, str):
            texts: list[str] = [value]
        elif isinstance(value, dict):
            texts = list(value)
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            texts = []
            stack.extend((item, depth + 1) for item in value)
        else:
            continue
        for text in texts:
            if "\x00" in text:
                raise MalformedDelivery("The payload holds a NUL character")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedDelivery("The payload holds an unpaired surrogate") from None


def decode_json_object(raw: bytes | str) -> dict[str, Any]:
    """Decode a JSON object from UTF-8 ``raw``; raises :class:`MalformedDelivery` otherwise."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        payload = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except MalformedDelivery:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedDelivery("The body is not valid UTF-8 JSON") from None
    if not isinstance(payload, dict):
        raise MalformedDelivery("The body is JSON but not an object")
    _check_storable(payload)
    return payload


def declared_events(source: TriggerSource) -> list[str]:
    """The event names the declaration of ``source`` handles, sorted (``[]`` for an orphan)."""
    declaration = get_declaration(source.name)
    return sorted(declaration.events) if declaration is not None else []


def label_for(source: TriggerSource) -> str:
    """How a registration is labelled at the provider: ``label_prefix`` + the source name."""
    return f"{source.label_prefix or ''}{source.name}"


def receive_url(source: TriggerSource) -> str | None:
    """The full URL deliveries for ``source`` are posted to, from its ``base_url`` and the
    ``django_leases:receive-webhook`` route (``None`` while no address is known)."""
    if not source.base_url:
        return None
    try:
        path = reverse("django_leases:receive-webhook", args=[source.name])
    except NoReverseMatch:
        path = f"/hooks/{source.name}/"
    return source.base_url.rstrip("/") + path


__all__ = [
    "MANUAL",
    "MAX_HEADER_VALUE",
    "MAX_PAYLOAD_DEPTH",
    "REGISTERED",
    "ParsedDelivery",
    "Provider",
    "ProviderError",
    "SetupOutcome",
    "WebhookProvider",
    "checked_identifier",
    "declared_events",
    "decode_json_object",
    "header_value",
    "label_for",
    "receive_url",
    "repeated_header",
]
