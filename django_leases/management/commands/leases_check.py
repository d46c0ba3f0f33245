"""``manage.py leases_check``: is this django-leases installation healthy?

Reports database reachability, unapplied migrations, workflow workers alive, lapsed steps and
stuck runs (the rules are in :mod:`django_leases.health`), as text or ``--format json``.

Exit status: 0 healthy; 3 at least one problem; 4 a database is unreachable (takes
precedence); 1 or 2 bad arguments (Django's usual).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_leases import health


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, not {text!r}")
    return value


class Command(BaseCommand):
    help = (
        "Check django-leases: databases reachable, migrations applied, workflow workers alive, "
        "no lapsed steps left unclaimed, no stuck runs. Exit 0 healthy, 3 problems, "
        "4 database unreachable."
    )
    requires_system_checks: list[str] = []  # a health probe must answer even when checks fail
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--format", choices=["text", "json"], default="text", help="Output format."
        )
        parser.add_argument(
            "--database",
            action="append",
            dest="databases",
            metavar="ALIAS",
            help="Check this alias (repeatable). Default: every alias django-leases writes to.",
        )
        parser.add_argument(
            "--overdue-after",
            type=_positive_seconds,
            default=health.DEFAULT_OVERDUE_AFTER,
            metavar="SECONDS",
            help="Due work or a lapsed step waiting longer than this is a problem "
            f"(default {health.DEFAULT_OVERDUE_AFTER:g}).",
        )
        parser.add_argument(
            "--stuck-after",
            type=_positive_seconds,
            default=health.DEFAULT_STUCK_AFTER,
            metavar="SECONDS",
            help="A running run with nothing due or running for longer than this is stuck "
            f"(default {health.DEFAULT_STUCK_AFTER:g}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = health.run_checks(
            options["databases"],
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
