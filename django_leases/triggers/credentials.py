"""The encrypted credential store: trigger sources' webhook signing secrets (DESIGN §6).

The rules are ``TriggerSecret.objects``' (:mod:`django_leases.models.trigger`, where the keys
and the encryption are described); these functions are the same calls on the database the
router picks for ``TriggerSecret`` (or ``using``), for code that has no manager at hand.
"""

from __future__ import annotations

from django.db import router

from django_leases.exceptions import CredentialError
from django_leases.models.trigger import (
    GENERATED_BYTES,
    MAX_SECRET_LENGTH,
    TriggerSecret,
    TriggerSecretQuerySet,
    fernet,
)

__all__ = [
    "GENERATED_BYTES",
    "MAX_SECRET_LENGTH",
    "CredentialError",
    "delete_secret",
    "ensure_secret",
    "fernet",
    "get_secret",
    "rotate_keys",
    "set_secret",
    "signing_secret",
]


def _store(using: str | None) -> TriggerSecretQuerySet:
    return TriggerSecret.objects.db_manager(using or router.db_for_write(TriggerSecret)).all()


def get_secret(name: str, *, using: str | None = None) -> str | None:
    """``TriggerSecret.objects.get_secret(name)`` on ``using`` (default: the router's)."""
    return _store(using).get_secret(name)


def set_secret(name: str, secret: str, *, using: str | None = None) -> None:
    """``TriggerSecret.objects.set_secret(name, secret)`` on ``using``."""
    _store(using).set_secret(name, secret)


def ensure_secret(name: str, *, using: str | None = None) -> str:
    """``TriggerSecret.objects.ensure_secret(name)`` on ``using``."""
    return _store(using).ensure_secret(name)


def delete_secret(name: str, *, using: str | None = None) -> None:
    """``TriggerSecret.objects.delete_secret(name)`` on ``using``."""
    _store(using).delete_secret(name)


def signing_secret(name: str, *, using: str | None = None) -> str | None:
    """``TriggerSecret.objects.signing_secret(name)`` on ``using``."""
    return _store(using).signing_secret(name)


def rotate_keys(*, using: str | None = None) -> int:
    """``TriggerSecret.objects.rotate_keys()`` on ``using``; returns how many were
    re-encrypted."""
    return _store(using).rotate_keys()
