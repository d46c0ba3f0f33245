"""``manage.py rotate_trigger_secrets [--database ALIAS]``.

Re-encrypts every stored trigger secret with the current primary key (the first of
``DJANGO_LEASES["SECRET_KEYS"]``, or the key derived from ``SECRET_KEY``). Run it after
putting a new key first; afterwards the old keys (or ``SECRET_KEY_FALLBACKS`` entries) can be
dropped. Prints how many secrets were re-encrypted, never a secret. Exit codes:
``EXIT_CODES["rotate_trigger_secrets"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser

from django_leases.management.base import LeasesCommand, add_database_argument, database_alias
from django_leases.models import TriggerSecret
from django_leases.triggers.credentials import CredentialError, rotate_keys


class Command(LeasesCommand):
    """``manage.py rotate_trigger_secrets``: re-encrypt every stored signing secret with
    the current primary key."""

    help = "Re-encrypt the stored trigger secrets with the current primary key."

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser, TriggerSecret)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options, TriggerSecret)
        try:
            count = rotate_keys(using=alias)
        except (CredentialError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        noun = "secret" if count == 1 else "secrets"
        self.confirm(f"Re-encrypted {count} stored trigger {noun} with the primary key.")
