"""``manage.py rotate_trigger_secrets [--database ALIAS]``.

Re-encrypts every stored trigger secret with the current primary key (the first of
``DJANGO_LEASES["SECRET_KEYS"]``, or the key derived from ``SECRET_KEY``). Run it after
putting a new key first; afterwards the old keys (or ``SECRET_KEY_FALLBACKS`` entries) can be
dropped. Prints how many secrets were re-encrypted, never a secret. Exit 1 with nothing
changed when a stored secret cannot be decrypted with the configured keys.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_leases.triggers.credentials import CredentialError, rotate_keys


class Command(BaseCommand):
    help = "Re-encrypt the stored trigger secrets with the current primary key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="Database alias (default: the router's write database for TriggerSecret).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = rotate_keys(using=options["database"])
        except (CredentialError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        noun = "secret" if count == 1 else "secrets"
        self.stdout.write(f"Re-encrypted {count} stored trigger {noun} with the primary key.")
