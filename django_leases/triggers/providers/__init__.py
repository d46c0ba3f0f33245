"""Webhook providers: ``manual``, ``github`` and ``stripe`` (DESIGN §6).

Each is a :class:`Provider` (management: setup / check / teardown; receiving: verify /
parse). Look one up with :func:`get_provider`; tests and projects may add their own with
:func:`register_provider`.
"""

from __future__ import annotations

from django_leases.triggers.providers.base import (
    MANUAL,
    MAX_HEADER_VALUE,
    MAX_PAYLOAD_DEPTH,
    REGISTERED,
    ParsedDelivery,
    Provider,
    ProviderError,
    SetupOutcome,
    WebhookProvider,
    decode_json_object,
)
from django_leases.triggers.providers.github import GitHubProvider
from django_leases.triggers.providers.manual import ManualProvider
from django_leases.triggers.providers.stripe import StripeProvider

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

_BUILT_IN: dict[str, Provider] = {
    "manual": ManualProvider(),
    "github": GitHubProvider(),
    "stripe": StripeProvider(),
}
_providers: dict[str, Provider] = dict(_BUILT_IN)


def get_provider(name: str) -> Provider | None:
    """The provider named ``name`` (``str``), or ``None`` when none is installed under it."""
    return _providers.get(name) if isinstance(name, str) else None


def provider_names() -> list[str]:
    """Names of the installed providers, sorted."""
    return sorted(_providers)


def register_provider(provider: Provider) -> Provider:
    """Install ``provider`` under ``provider.name`` (replacing one of that name); returns it.

    Raises ``ValueError`` when ``provider`` is not a :class:`Provider` or has no name.
    """
    if not isinstance(provider, Provider) or not isinstance(provider.name, str):
        raise ValueError("register_provider() needs a Provider instance with a name")
    if not provider.name:
        raise ValueError("register_provider() needs a Provider instance with a name")
    _providers[provider.name] = provider
    return provider


def unregister_provider(name: str) -> None:
    """Remove provider ``name``; a built-in one comes back as built. Unknown: no-op."""
    _providers.pop(name, None)
    if name in _BUILT_IN:
        _providers[name] = _BUILT_IN[name]
