"""``manage.py reconcile_trigger_sources [--base-url URL] [--label-prefix P]``.

Syncs the trigger-source declarations found in the code into ``TriggerSource`` rows (new
rows start disabled; rows whose declaration left the code become orphans) and prints every
row. Meant for deploy pipelines: run it after ``migrate``. Exit 0 on success; a bad
``--base-url`` or ``--label-prefix`` is an error on stderr (exit 1) with nothing written.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_leases.models import TriggerSource
from django_leases.triggers.registry import declarations


class Command(BaseCommand):
    help = (
        "Sync the trigger sources declared in code (each app's triggers.py) into the "
        "database and list them. Never enables, disables or deletes a source."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base-url",
            help="Where this app is served (http(s)://…); kept from the last run if omitted.",
        )
        parser.add_argument(
            "--label-prefix",
            help="Label for endpoints registered at providers; kept if omitted.",
        )
        parser.add_argument(
            "--database",
            default=None,
            help=f"Database alias (default: the router's choice, usually {DEFAULT_DB_ALIAS!r}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        rows = TriggerSource.objects.all()
        if options["database"]:
            rows = rows.using(options["database"])
        try:
            synced = rows.sync(
                declarations(),
                base_url=options["base_url"],
                label_prefix=options["label_prefix"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not synced:
            self.stdout.write("No trigger sources are declared.")
            return
        width = max(len(row.name) for row in synced)
        for row in synced:
            self.stdout.write(
                f"{row.name:<{width}}  {row.provider:<8}  "
                f"{'declared' if row.declared else 'orphan':<8}  "
                f"{'enabled' if row.enabled else 'disabled':<8}  "
                f"status={row.status or '-'}  base_url={row.base_url or '-'}"
            )
