"""``manage.py leases_check``: is this django-leases installation healthy?

Reports database reachability, unapplied migrations, workflow workers alive, lapsed steps and
stuck runs (the rules are in :mod:`django_leases.health`).

``--format table`` (the default; ``text``, its older spelling, is still accepted) prints the
report of :func:`~django_leases.health.format_text`: a verdict line, then one aligned row per
check and alias (status, check, message) with the runs, steps or migrations behind a problem
listed under it. ``--format json`` prints the report as one object, not an array of rows:
``{"healthy", "exit_code", "checks": [...]}``, since monitoring reads the verdict first.

``--install-functions`` repairs what the migrations check reports when the workflow or lease
functions were dropped after their migrations ran (:func:`~django_leases.health.install_functions`:
it creates them as those migrations froze them), then checks as usual.

Exit codes: ``EXIT_CODES["leases_check"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import CommandParser
from django.db import connections

from django_leases import health
from django_leases.management.base import (
    LeasesCommand,
    add_database_argument,
    add_format_argument,
    add_seconds_argument,
    database_aliases,
)


class Command(LeasesCommand):
    """``manage.py leases_check``: the health checks (:func:`django_leases.health.run_checks`),
    as text or JSON, with an exit status."""

    help = (
        "Check django-leases: databases reachable, migrations applied, workflow workers alive, "
        "no lapsed steps left unclaimed, no stuck runs."
    )
    requires_system_checks: list[str] = []  # a health probe must answer even when checks fail
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        add_format_argument(parser, aliases={"text": "table"})
        add_database_argument(parser, None, repeatable=True)
        # The two thresholds (seconds above 0) that turn waiting work into a problem.
        for flag, default, meaning in (
            (
                "--overdue-after",
                health.DEFAULT_OVERDUE_AFTER,
                "Due work or a lapsed step waiting longer than this is a problem",
            ),
            (
                "--stuck-after",
                health.DEFAULT_STUCK_AFTER,
                "A running run with nothing due or running for longer than this is stuck",
            ),
        ):
            add_seconds_argument(
                parser,
                flag,
                default=default,
                metavar="SECONDS",
                above_minimum=True,
                maximum=health.MAX_THRESHOLD,
                help=f"{meaning} (default {default:g}; at most a year).",
            )

        parser.add_argument(
            "--install-functions",
            action="store_true",
            help="First create the workflow and lease functions the database lacks, as the "
            "migrations that install them froze them (the repair the check gives when they "
            "were dropped after those ran).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["install_functions"]:
            for alias in database_aliases(options) or list(connections):
                created = health.install_functions(connections[alias])
                if created:
                    self.stdout.write(f"Database {alias!r}: created {', '.join(created)}")
        report = health.run_checks(
            database_aliases(options),
            overdue_after=options["overdue_after"],
            stuck_after=options["stuck_after"],
        )
        if options["format"] == "json":
            self.stdout.write(json.dumps(report.as_dict(), indent=2, default=str))
        else:
            self.stdout.write(health.format_text(report))
        if report.exit_code:
            self.stdout.flush()
            sys.exit(report.exit_code)
