"""The ``manual`` provider: no API; an operator registers the webhook by hand.

``setup`` answers status ``"manual"`` with instructions naming the full URL and the declared
events. The operator then stores the signing secret they chose (or the provider showed them)
in the credential store (:func:`django_leases.triggers.credentials.set_secret`, e.g. through
``manage.py trigger_sources``), or sets ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]``.

Receiving: the sender signs the way the source's ``config["signature"]`` says —
``"github"`` (default: ``X-Hub-Signature-256``, ``X-GitHub-Event``, ``X-GitHub-Delivery``) or
``"stripe"`` (``Stripe-Signature``; event ``type`` and ``id`` from the body). So a Stripe
endpoint registered by hand in Stripe's dashboard is declared as::

    webhook_source("stripe-payments", provider="manual", config={"signature": "stripe"}, ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, transaction

from django_leases.models import TriggerSecret, TriggerSource
from django_leases.triggers.providers.base import (
    MANUAL,
    ParsedDelivery,
    Provider,
    ProviderError,
    SetupOutcome,
    declared_events,
    receive_url,
)
from django_leases.triggers.providers.github import GitHubProvider
from django_leases.triggers.providers.stripe import StripeProvider

#: ``config["signature"]`` values and what each means.
SCHEMES = {
    "github": "HMAC-SHA256 of the body in X-Hub-Signature-256 (GitHub style)",
    "stripe": "Stripe-Signature (t=…,v1=…; Stripe style)",
}


def _secret_origin(source: TriggerSource) -> str | None:
    """Where deliveries to ``source`` find their signing secret (``"settings"``, ``"stored"``)
    or ``None``: none, or a credential store that cannot be read now (it only picks the
    instructions' wording)."""
    store = TriggerSecret.objects.db_manager(source._state.db)  # none: the router's
    try:
        with transaction.atomic(using=store.write_alias()):
            return store.secret_origin(source.name)
    except DatabaseError:
        return None


def _scheme_provider(scheme: str) -> Provider:
    return StripeProvider() if scheme == "stripe" else GitHubProvider()


class ManualProvider(Provider):
    """Webhooks an operator registers by hand (see the module docstring)."""

    name = "manual"
    manages_registration = False
    takes_secret = False

    def __init__(self, scheme: str = "github") -> None:
        if scheme not in SCHEMES:
            raise ValueError(
                f"Unknown signature scheme {scheme!r} (known: {', '.join(sorted(SCHEMES))})"
            )
        self.scheme = scheme
        self._receiver = _scheme_provider(scheme)

    def _instructions(self, source: TriggerSource, url: str | None) -> str:
        events = declared_events(source)
        shown_events = ", ".join(events) if events else "(none declared)"
        scheme = self._scheme_of(source.config)
        where = url or "(no address known yet: reconcile with --base-url first)"
        register = (
            f"Register a webhook by hand at the sender: POST {where} "
            f"for the events {shown_events}, signed with {SCHEMES[scheme]}."
        )
        store = (
            f"store its signing secret for source {source.name!r} in the credential store "
            f"(manage.py trigger_sources set-secret {source.name}) or in "
            "DJANGO_LEASES['WEBHOOK_SECRETS']"
        )
        origin = _secret_origin(source)
        if scheme == "stripe":  # the sender chooses the secret and shows it: none is given it
            already = {
                "settings": " (DJANGO_LEASES['WEBHOOK_SECRETS'] sets one, which wins over a "
                "stored one: change it there if the sender shows another)",
                "stored": " (one is stored: replace it if the sender shows another)",
            }.get(origin or "", "")
            return f"{register} Then {store}: the one the sender shows{already}."
        if origin == "settings":
            return (
                f"{register} Give it the signing secret DJANGO_LEASES['WEBHOOK_SECRETS'] "
                f"sets for source {source.name!r}."
            )
        if origin == "stored":
            return (
                f"{register} Give it the signing secret stored for source {source.name!r} "
                f"(to change it: manage.py trigger_sources set-secret {source.name})."
            )
        return f"{register} Then {store}."

    @staticmethod
    def _scheme_of(config: Mapping[str, Any] | None) -> str:
        scheme = (config or {}).get("signature", "github")
        return scheme if scheme in SCHEMES else "github"

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """``signature``, when given, must be ``"github"`` or ``"stripe"``. Raises
        ``ValueError``."""
        scheme = config.get("signature", "github")
        if scheme not in SCHEMES:
            raise ValueError(
                f"manual: config 'signature' must be one of {', '.join(sorted(SCHEMES))}, "
                f"not {scheme!r}"
            )

    def setup(self, source: TriggerSource, url: str, secret: str | None) -> SetupOutcome:
        """No API call: returns status ``"manual"`` with the instructions; state ``None``.

        Raises :class:`ProviderError` for an unknown ``config["signature"]``.
        """
        try:
            self.validate_config(source.config or {})
        except ValueError as exc:
            raise ProviderError(str(exc)) from None
        return SetupOutcome(status=MANUAL, state=None, detail=self._instructions(source, url))

    def check(self, source: TriggerSource) -> SetupOutcome:
        """Nothing to look up: the same ``"manual"`` outcome and instructions."""
        return SetupOutcome(
            status=MANUAL, state=None, detail=self._instructions(source, receive_url(source))
        )

    def teardown(self, source: TriggerSource) -> None:
        """Nothing registered through us: success (the operator removes it by hand)."""

    def for_config(self, config: Mapping[str, Any]) -> Provider:
        """The manual provider receiving with ``config["signature"]``'s scheme."""
        scheme = self._scheme_of(config)
        return self if scheme == self.scheme else ManualProvider(scheme)

    @property
    def sender_headers(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        """The headers of the scheme's provider (GitHub's or Stripe's)."""
        return self._receiver.sender_headers

    def refuse_repeated_headers(self, headers: Mapping[str, str]) -> None:
        """As the scheme's provider does (GitHub's or Stripe's headers)."""
        self._receiver.refuse_repeated_headers(headers)

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """As the configured signature scheme's provider verifies (``bool``); never raises for
        bad input."""
        return self._receiver.verify(secret, body, headers)

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """As the configured signature scheme's provider parses (a :class:`ParsedDelivery`);
        raises :class:`MalformedDelivery`."""
        return self._receiver.parse(body, headers)
