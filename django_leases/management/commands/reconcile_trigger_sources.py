"""``manage.py reconcile_trigger_sources [--base-url URL] [--label-prefix P] [--format F]``.

For deploy pipelines (run it after ``migrate``): syncs the trigger sources declared in code
into ``TriggerSource`` rows — new rows start **off**, rows whose declaration left the code
become orphans, and ``--base-url`` / ``--label-prefix`` are stored (when omitted: the address
is ``DJANGO_LEASES["BASE_URL"]`` if set, else each is kept from the last run, project-wide, so
a source declared since gets them too) — then sets up again every enabled, declared source at
its provider, so its registration exists and posts to the current address. Disabled sources
and orphans get no provider call. It never enables, disables or deletes a source
(:func:`django_leases.triggers.lifecycle.reconcile`).

Prints every row, then one line per setup (``--format json``: one JSON array of the rows,
each with its ``setup``: ``null`` when none was due, else ``{"ok", "detail"}``). A failed
setup is also reported on stderr. Exit codes: ``EXIT_CODES["reconcile_trigger_sources"]`` in
:mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases.management import base
from django_leases.management.base import EXIT_SETUP_FAILED
from django_leases.management.commands.trigger_sources import add_wait_argument
from django_leases.models import TriggerSource
from django_leases.triggers import lifecycle

_COLUMNS = base.columns(
    ("name", "provider", "declared", "enabled", "status", "base_url"),
    text={
        "declared": base.either("declared", "orphan"),
        "enabled": base.either("enabled", "disabled"),
    },
)


class Command(base.LeasesCommand):
    """``manage.py reconcile_trigger_sources``: sync declared sources to their rows and set up
    the enabled ones."""

    help = (
        "Sync the trigger sources declared in code (each app's triggers.py) into the "
        "database and set up the enabled ones at their providers. Never enables, disables "
        "or deletes a source."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--base-url",
            help="Where this project is served (http(s)://…, the URLconf's root). If "
            'omitted: DJANGO_LEASES["BASE_URL"] when set, else the last run\'s, which a '
            "source declared since gets too.",
        )
        parser.add_argument(
            "--label-prefix",
            help="Label for endpoints registered at providers; kept if omitted.",
        )
        add_wait_argument(parser)
        base.add_format_argument(parser)
        base.add_database_argument(parser, TriggerSource)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = base.database_alias(options, TriggerSource)
        try:
            reconciled = lifecycle.reconcile(
                base_url=options["base_url"],
                label_prefix=options["label_prefix"],
                using=alias,
                wait=options["wait"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        setups = {result.name: result for result in reconciled.results}
        rows = [
            {
                "name": row.name,
                "provider": row.provider,
                "declared": row.declared,
                "enabled": row.enabled,
                "status": row.status or "off",
                "base_url": row.base_url or None,
                "setup": (
                    {"ok": setups[row.name].ok, "detail": setups[row.name].detail}
                    if row.name in setups
                    else None
                ),
            }
            for row in reconciled.sources
        ]
        empty = "No trigger sources are declared."
        if options["format"] == "json" or self.verbosity >= 1:
            base.write_rows(self.stdout, options["format"], _COLUMNS, rows, empty=empty)
        if options["format"] != "json":
            for result in reconciled.results:
                if result.ok:
                    self.confirm(f"set up {result}")
        failed = [result for result in reconciled.results if not result.ok]
        if failed:
            raise CommandError(
                "\n".join(f"setup failed: {result}" for result in failed),
                returncode=EXIT_SETUP_FAILED,
            )
