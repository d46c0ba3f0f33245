"""``manage.py run_workflow_worker [--concurrency N] [--once] [--database ALIAS]``.

Runs :class:`django_leases.workflows.worker.Worker`: N threads picking due orchestration passes
and due workflow steps. SIGTERM / SIGINT stop claiming and give in-flight steps
``WORKER_SHUTDOWN_GRACE`` seconds to finish (a second signal stops waiting).

Exit status: 0 when stopped cleanly (or, with ``--once``, when nothing was left due);
1 when in-flight work was still running at the end of the grace (its step leases lapse and
another worker takes the steps over); 2 when ``--once`` gave up on an unreachable database;
3 when a worker thread died (logged; the other threads are stopped so a supervisor restarts
the process).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_leases.workflows.worker import (
    EXIT_ABANDONED,
    EXIT_DATABASE_UNREACHABLE,
    EXIT_THREAD_DIED,
    Worker,
)

_EXIT_MESSAGES = {
    EXIT_ABANDONED: "in-flight work was abandoned at the end of the shutdown grace",
    EXIT_DATABASE_UNREACHABLE: "the database stayed unreachable",
    EXIT_THREAD_DIED: "a worker thread died (see the log above)",
}


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class Command(BaseCommand):
    help = "Run workflow passes and steps until SIGTERM (or, with --once, until nothing is due)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=_positive_int,
            default=1,
            metavar="N",
            help="Number of worker threads (default 1).",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Exit 0 as soon as no pass and no step is due (now or within ~2 s).",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="Database alias holding the workflow tables. Default: the router's choice.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias is not None and alias not in connections:
            raise CommandError(f"Unknown database alias {alias!r}")
        code = Worker(options["concurrency"], using=alias).run(once=options["once"])
        if code:
            raise CommandError(_EXIT_MESSAGES.get(code, f"exit status {code}"), returncode=code)
