"""``manage.py hold_lease KEY [options] -- CMD [ARG ...]``: run CMD while holding lease KEY.

A distributed cron singleton or leader: run it from every node, only one copy of CMD runs.
The loop lives in :class:`django_leases.holder.LeaseHolder`, whose docstring describes the
signals, the child's environment and ``PR_SET_PDEATHSIG``. The exit codes (the child's, or
the holder's ``EXIT_*``) are ``EXIT_CODES["hold_lease"]`` in
:mod:`django_leases.management.base`, shown by ``--help``.

POSIX only: on Windows (no process groups, no SIGHUP) it exits with a ``CommandError``
saying so before anything is written; ``hold_lease()`` in Python code works everywhere.

From code: ``call_command("hold_lease", "KEY", ttl="60", command=["prog", "arg"])`` returns
when the exit code is 0 and raises ``SystemExit(code)`` otherwise.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_leases.conf import leases_settings
from django_leases.holder import EXIT_TAKEN, NOT_POSIX, POSIX, LeaseHolder
from django_leases.management.base import (
    LeasesCommand,
    add_database_argument,
    database_alias,
    unmigrated_database_error,
    unreachable_database_error,
)
from django_leases.models import Lease


class Command(LeasesCommand):
    """``manage.py hold_lease``: run a program while holding a lease
    (:class:`~django_leases.holder.LeaseHolder`)."""

    help = (
        "Run CMD as a child process while holding the lease KEY (a cron singleton or\n"
        "leader). The lease is renewed every TTL/3 and released when CMD ends."
    )
    epilog_intro = (
        "The child gets DJANGO_LEASES_KEY, DJANGO_LEASES_TOKEN (the fencing token) and\n"
        "DJANGO_LEASES_HOLDER in its environment. SIGTERM, SIGINT and SIGHUP are forwarded to\n"
        "the child's process group; the lease is released once the child has ended. If the\n"
        "holder dies, Linux sends the child SIGTERM (PR_SET_PDEATHSIG). POSIX only (not\n"
        "Windows).\n"
    )
    # From code, pass the program as command=[...]; on the command line it follows "--".
    stealth_options = ("command",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._argv_command: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.usage = parser.format_usage().removeprefix("usage: ").rstrip() + " -- CMD [ARG ...]"
        return parser

    #: The program's command line goes to the operating system as it came from it.
    raw_options = frozenset({"command"})

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", metavar="KEY", help="The lease key (1-255 characters).")
        parser.add_argument(
            "--ttl",
            default=None,
            help=(
                "Lease TTL in seconds (renewed every TTL/3); how long a crashed holder keeps "
                f"the key from others. Default: {leases_settings.DEFAULT_TTL:g}."
            ),
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help=f"When the key is taken, wait for it instead of exiting with {EXIT_TAKEN}.",
        )
        parser.add_argument(
            "--wait-timeout",
            default=None,
            metavar="S",
            help=f"With --wait, give up (exit {EXIT_TAKEN}) after S seconds. Implies --wait.",
        )
        parser.add_argument(
            "--grace",
            default=None,
            metavar="S",
            help=(
                "Seconds between SIGTERM and SIGKILL when the lease is lost. Default: "
                f"{leases_settings.HOLD_LEASE_KILL_GRACE:g} (HOLD_LEASE_KILL_GRACE)."
            ),
        )
        add_database_argument(parser, Lease)

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after the first "--" is the child's command line, untouched (argparse
        # would drop later "--" and refuses options that follow a positional).
        head = argv[:2]
        rest = argv[2:]
        if "--" in rest:
            cut = rest.index("--")
            head += rest[:cut]
            self._argv_command = rest[cut + 1 :]
        else:
            head += rest
        super().run_from_argv(head)

    def handle(self, *args: Any, **options: Any) -> None:
        if not POSIX:
            raise CommandError(NOT_POSIX.format(platform=sys.platform))
        command = list(options.get("command") or self._argv_command)
        if not command:
            raise CommandError(
                "Give the command to run after '--', e.g. "
                "manage.py hold_lease nightly-report -- python manage.py send_reports"
            )
        verbosity = int(options["verbosity"])
        wait_timeout = _number(options["wait_timeout"], "--wait-timeout")
        ttl = _number(options["ttl"], "--ttl")
        try:
            holder = LeaseHolder(
                options["key"],
                command,
                ttl=leases_settings.DEFAULT_TTL if ttl is None else ttl,
                wait=bool(options["wait"]) or wait_timeout is not None,
                wait_timeout=wait_timeout,
                grace=_number(options["grace"], "--grace"),
                using=database_alias(options, Lease),
                report=lambda level, message: self._report(verbosity, level, message),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        try:
            code = holder.run()
        except DatabaseError as exc:
            alias = database_alias(options, Lease)
            unusable = unreachable_database_error(alias) or unmigrated_database_error(alias)
            if unusable is not None:
                raise unusable from exc
            raise CommandError(f"Database error while holding lease {holder.key!r}: {exc}") from exc
        if code:
            sys.exit(code)

    def _report(self, verbosity: int, level: int, message: str) -> None:
        if verbosity >= level:
            self.stderr.write(message)
            self.stderr.flush()


def _number(value: Any, option: str) -> float | None:
    """An option's value as float seconds (``None`` when not given); else CommandError."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CommandError(f"{option} must be a number of seconds, got {value!r}") from None
    if math.isnan(number):
        raise CommandError(f"{option} must be a number of seconds, got {value!r}")
    return number
