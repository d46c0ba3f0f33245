"""``manage.py reconcile_trigger_sources [--base-url URL] [--label-prefix P]``.

For deploy pipelines (run it after ``migrate``): syncs the trigger sources declared in code
into ``TriggerSource`` rows — new rows start **off**, rows whose declaration left the code
become orphans, and ``--base-url`` / ``--label-prefix`` are stored (kept from the last run
when omitted) — then sets up again every enabled, declared source at its provider, so its
registration exists and posts to the current address. Disabled sources and orphans get no
provider call. It never enables, disables or deletes a source
(:func:`django_leases.triggers.lifecycle.reconcile`).

Prints every row, then one line per setup. Exit status: 0 done; 1 bad input
(``--base-url`` not an http(s) URL, a bad ``--label-prefix``), nothing written; 2 some
setup failed (the rows say ``failed``; the sources stay on; the lines on stderr).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections, router

from django_leases.models import TriggerSource
from django_leases.triggers import lifecycle

#: Exit status when at least one enabled source's setup failed.
EXIT_SETUP_FAILED = 2


class Command(BaseCommand):
    help = (
        "Sync the trigger sources declared in code (each app's triggers.py) into the "
        "database and set up the enabled ones at their providers. Never enables, disables "
        "or deletes a source."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base-url",
            help="Where this project is served (http(s)://…, the URLconf's root); kept from "
            "the last run if omitted.",
        )
        parser.add_argument(
            "--label-prefix",
            help="Label for endpoints registered at providers; kept if omitted.",
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=lifecycle.DEFAULT_WAIT,
            metavar="S",
            help="Seconds to wait for another operation on a source before reporting it "
            f"busy (default {lifecycle.DEFAULT_WAIT:g}).",
        )
        parser.add_argument(
            "--database",
            default=None,
            help=f"Database alias (default: the router's choice, usually {DEFAULT_DB_ALIAS!r}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or router.db_for_write(TriggerSource)
        if alias not in connections:
            raise CommandError(f"Unknown database alias {alias!r}")
        try:
            reconciled = lifecycle.reconcile(
                base_url=options["base_url"],
                label_prefix=options["label_prefix"],
                using=alias,
                wait=options["wait"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not reconciled.sources:
            self.stdout.write("No trigger sources are declared.")
            return
        width = max(len(row.name) for row in reconciled.sources)
        for row in reconciled.sources:
            self.stdout.write(
                f"{row.name:<{width}}  {row.provider:<8}  "
                f"{'declared' if row.declared else 'orphan':<8}  "
                f"{'enabled' if row.enabled else 'disabled':<8}  "
                f"status={row.status or 'off'}  base_url={row.base_url or '-'}"
            )
        failed = [result for result in reconciled.results if not result.ok]
        for result in reconciled.results:
            if result.ok:
                self.stdout.write(f"set up {result}")
        if failed:
            raise CommandError(
                "\n".join(f"setup failed: {result}" for result in failed),
                returncode=EXIT_SETUP_FAILED,
            )
