"""Webhook providers: ``manual``, ``github`` and ``stripe`` (DESIGN §6).

Each is a :class:`Provider` (management: setup / check / teardown; receiving: verify /
parse). Importing this package installs the three in the provider table of
:mod:`django_leases.triggers.registry` (the app does so when Django starts). Look one up with
:func:`get_provider`; tests and projects may add their own with :func:`register_provider`.
"""

from __future__ import annotations

from django_leases.exceptions import ProviderError
from django_leases.triggers.providers.base import (
    MANUAL,
    MAX_HEADER_VALUE,
    MAX_PAYLOAD_DEPTH,
    REGISTERED,
    Provider,
    SetupOutcome,
    WebhookProvider,
    decode_json_object,
)
from django_leases.triggers.providers.github import GitHubProvider
from django_leases.triggers.providers.manual import ManualProvider
from django_leases.triggers.providers.stripe import StripeProvider
from django_leases.triggers.registry import (
    get_provider,
    provider_names,
    register_provider,
    unregister_provider,
)
from django_leases.triggers.values import ParsedDelivery

__all__ = [
    "MANUAL",
    "MAX_HEADER_VALUE",
    "MAX_PAYLOAD_DEPTH",
    "REGISTERED",
    "GitHubProvider",
    "ManualProvider",
    "ParsedDelivery",
    "Provider",
    "ProviderError",
    "SetupOutcome",
    "StripeProvider",
    "WebhookProvider",
    "decode_json_object",
    "get_provider",
    "provider_names",
    "register_provider",
    "unregister_provider",
]

for _built_in in (ManualProvider(), GitHubProvider(), StripeProvider()):
    register_provider(_built_in, built_in=True)
