"""``manage.py run_workflow_worker [--concurrency N] [--once] [--database ALIAS]
[--poll-interval S] [--shutdown-grace S] [--queue NAME ...]``.

Runs :class:`django_leases.workflows.worker.Worker`: N threads picking due orchestration passes
and due workflow steps. On PostgreSQL idle threads are woken by LISTEN/NOTIFY as soon as work
is due; they also look every ``--poll-interval`` seconds (default ``WORKER_POLL_INTERVAL``, or
1 s on PostgreSQL and 0.25 s elsewhere). SIGTERM / SIGINT stop claiming and give in-flight
steps ``--shutdown-grace`` seconds (default ``WORKER_SHUTDOWN_GRACE``) to finish (a second
signal stops waiting). ``--queue NAME`` (repeatable) takes only the steps of those queues
(``DJANGO_LEASES["QUEUES"]``, or ``"default"``; an unknown name is a usage error, exit 2);
without it the worker takes every queue. Every worker takes the runs' orchestration passes.

Exit codes (the worker's :data:`~django_leases.workflows.worker.EXIT_ABANDONED` and
others): ``EXIT_CODES["run_workflow_worker"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases import metrics
from django_leases.conf import MAX_POLL_INTERVAL, queue_limits
from django_leases.exceptions import MisuseError, QueueConfigError, WorkflowFunctionsMissing
from django_leases.management.base import (
    MAX_CONCURRENCY,
    PORTS,
    USAGE_ERROR,
    LeasesCommand,
    add_database_argument,
    add_seconds_argument,
    database_alias,
    integer_type,
    read_only_database_error,
    unmigrated_database_error,
)
from django_leases.models import WorkflowStep
from django_leases.validation import refused_ttl_settings
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


class Command(LeasesCommand):
    """``manage.py run_workflow_worker``: run a workflow worker until SIGTERM (or ``--once``)."""

    help = "Run workflow passes and steps until SIGTERM (or, with --once, until nothing is due)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=integer_type(1, MAX_CONCURRENCY),
            default=1,
            metavar="N",
            help=f"Number of worker threads, 1 to {MAX_CONCURRENCY}, each with a database "
            "connection of its own (default 1).",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Exit 0 as soon as no pass and no step is due (now or within ~2 s).",
        )
        add_database_argument(parser, WorkflowStep)
        add_seconds_argument(
            parser,
            "--poll-interval",
            default=None,
            maximum=MAX_POLL_INTERVAL,
            help="Seconds an idle thread waits before looking again when not woken earlier "
            "(default WORKER_POLL_INTERVAL; unset: 1 on PostgreSQL, 0.25 elsewhere; at most "
            "a day).",
        )
        parser.add_argument(
            "--metrics-port",
            type=integer_type(*PORTS),
            default=None,
            metavar="PORT",
            help=f"Serve this worker's Prometheus metrics on PORT ({PORTS[0]} to {PORTS[1]}; "
            "needs prometheus-client).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="The address --metrics-port listens on (default 127.0.0.1).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="NAME",
            dest="queues",
            help='Take only the steps of queue NAME (repeatable; "default" or a queue of '
            'DJANGO_LEASES["QUEUES"]). Default: every queue.',
        )
        add_seconds_argument(
            parser,
            "--shutdown-grace",
            default=None,
            help="Seconds in-flight work may take to finish after SIGTERM "
            "(default WORKER_SHUTDOWN_GRACE).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["metrics_port"] is not None:
            try:
                metrics.serve(options["metrics_port"], options["metrics_addr"])
            except (ValueError, OSError) as exc:
                raise CommandError(f"--metrics-port: {exc}") from None
        try:
            queue_limits()
        except QueueConfigError as exc:
            raise CommandError(str(exc)) from None
        refused = refused_ttl_settings()  # else every unit fails taking its leases
        if refused:
            raise CommandError(
                "; ".join(f"DJANGO_LEASES[{key!r}]: {why}" for key, why in refused.items())
            )
        alias = database_alias(options, WorkflowStep)
        # Else each unit of work fails, logged as a database fault, until --once gives up.
        unusable = unmigrated_database_error(alias) or read_only_database_error(alias)
        if unusable is not None:
            raise unusable
        try:
            worker = Worker(
                options["concurrency"],
                using=alias,
                poll_interval=options["poll_interval"],
                shutdown_grace=options["shutdown_grace"],
                queues=options["queues"],
            )
        except QueueConfigError as exc:
            raise CommandError(f"--queue: {exc}", returncode=USAGE_ERROR) from None
        if options["verbosity"] >= 1:
            self.stdout.write(worker.describe(options["once"]))
            self.stdout.flush()
        try:
            code = worker.run(once=options["once"])
        except (WorkflowFunctionsMissing, MisuseError) as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise CommandError(_EXIT_MESSAGES.get(code, f"exit status {code}"), returncode=code)
