"""``manage.py workflow_queues list [--format table|json] [--database ALIAS]``.

Lists every queue — those ``DJANGO_LEASES["QUEUES"]`` configures, ``"default"``, and any a
step of a running run names — with its waiting and running steps, its concurrency limit and
rate, and the age of its oldest waiting step, as ``display.queue_overview()``
computes them on the database clock (the admin's queue view shows the same). A queue with
per-key limits is followed by its busiest keys, each with its running and waiting steps (in
JSON: the row's ``keys``, beside ``key_concurrency`` and ``key_rate``).

Exit codes: ``EXIT_CODES["workflow_queues"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases.exceptions import QueueConfigError
from django_leases.management import base
from django_leases.models import WorkflowQueue
from django_leases.workflows.display import queue_overview


def _age_text(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}s"


_COLUMNS = base.columns(
    ("name", "waiting", "running", "concurrency", "rate", "oldest_waiting_seconds"),
    headers={"concurrency": "LIMIT", "oldest_waiting_seconds": "OLDEST WAITING"},
    text={"oldest_waiting_seconds": _age_text},
)


_KEY_COLUMNS = base.columns(("key", "running", "waiting"))


class Command(base.LeasesCommand):
    """``manage.py workflow_queues``: list the workflow queues and their load."""

    help = "List the workflow queues: waiting, running, limit, rate, oldest waiting age."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{list}", required=True)
        listing = self.add_subcommand(
            actions,
            "list",
            help="Show every queue: waiting and running steps, limit, rate, oldest waiting.",
        )
        base.add_format_argument(listing)
        base.add_database_argument(listing, WorkflowQueue)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rows = queue_overview(base.database_alias(options, WorkflowQueue))
        except QueueConfigError as exc:
            raise CommandError(str(exc)) from None
        base.write_rows(
            self.stdout,
            options["format"],
            _COLUMNS,
            [row.as_json() for row in rows],
            empty="No queues.",
        )
        if options["format"] == "json":
            return
        for row in rows:
            if row.key_concurrency is None and row.key_rate is None:
                continue
            self.stdout.write(
                f"\nBusiest keys of {row.name} (per key: limit "
                f"{'-' if row.key_concurrency is None else row.key_concurrency}, "
                f"rate {row.key_rate or '-'}):"
            )
            base.write_rows(
                self.stdout,
                "table",
                _KEY_COLUMNS,
                [
                    {"key": key.key or "(no key)", "running": key.running, "waiting": key.waiting}
                    for key in row.keys
                ],
                empty="No key has running or waiting steps.",
            )
