"""Providers' receiving side: verify a delivery's signature and parse it.

Only GitHub receives so far. The provider lifecycle (setup / check / teardown through the
provider's API) and the ``manual`` and ``stripe`` providers extend this module later; each
provider keeps the same two receiving methods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django_leases.triggers.errors import MalformedDelivery
from django_leases.triggers.signatures import verify_github_signature

#: Deepest JSON nesting accepted in a payload (GitHub's payloads nest fewer than 10 levels).
MAX_PAYLOAD_DEPTH = 64

#: Longest event name or delivery id accepted, in characters (the column widths).
MAX_HEADER_VALUE = 200


@dataclass(frozen=True)
class ParsedDelivery:
    """What a provider reads from a delivery: event name, delivery id and JSON payload."""

    event: str
    delivery_id: str
    payload: dict[str, Any]


class WebhookProvider:
    """Receiving side of a provider. ``headers`` keys are lower-case header names."""

    name: str = ""

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether the delivery's signature matches ``secret``. Never raises for bad input."""
        raise NotImplementedError

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """Read the event, delivery id and payload; raises :class:`MalformedDelivery`."""
        raise NotImplementedError


def _header_value(headers: Mapping[str, str], name: str, shown: str) -> str:
    value = (headers.get(name) or "").strip()
    if not value:
        raise MalformedDelivery(f"The {shown} header is missing")
    if len(value) > MAX_HEADER_VALUE:
        raise MalformedDelivery(f"The {shown} header is longer than {MAX_HEADER_VALUE} characters")
    if not value.isprintable():
        raise MalformedDelivery(f"The {shown} header holds control characters")
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


class GitHubProvider(WebhookProvider):
    """GitHub repository (or organisation) webhooks.

    Signature: ``X-Hub-Signature-256``. Event: ``X-GitHub-Event``. Delivery id:
    ``X-GitHub-Delivery``. Body: JSON (content type ``json``) or a form with one ``payload``
    field (GitHub's default content type ``form``).
    """

    name = "github"

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        return verify_github_signature(secret, body, headers.get("x-hub-signature-256"))

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        event = _header_value(headers, "x-github-event", "X-GitHub-Event")
        delivery_id = _header_value(headers, "x-github-delivery", "X-GitHub-Delivery")
        content_type = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if content_type == "application/x-www-form-urlencoded":
            try:
                fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
            except (UnicodeDecodeError, ValueError):
                raise MalformedDelivery("The form body cannot be read") from None
            values = fields.get("payload", [])
            if len(values) != 1:
                raise MalformedDelivery("The form body needs exactly one 'payload' field")
            payload = decode_json_object(values[0])
        else:
            payload = decode_json_object(body)
        return ParsedDelivery(event=event, delivery_id=delivery_id, payload=payload)


_PROVIDERS: dict[str, WebhookProvider] = {"github": GitHubProvider()}


def get_provider(name: str) -> WebhookProvider | None:
    """The receiving side of provider ``name``, or ``None`` when it cannot receive."""
    return _PROVIDERS.get(name)
