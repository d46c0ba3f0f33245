"""``manage.py trigger_sources list|enable|disable|teardown|forget|set-secret``.

Operators' commands for trigger sources, with the admin's semantics (both call
:mod:`django_leases.triggers.lifecycle`):

* ``list [--format table|json]`` — every source: name, provider, declared/orphan, on/off,
  status, the URL it receives on (``-`` with the reason when there is none: no address yet,
  or ``django_leases.urls`` not included — ``json``: ``url_missing``), and the last detail
  (``json``: also its provider state). Never a secret;
* ``enable NAME`` — turn on, then set up at the provider (needs an address: run
  ``reconcile_trigger_sources --base-url URL`` first);
* ``disable NAME`` — turn off (deliveries refused at once), then tear down at the provider;
* ``teardown NAME`` — turn off, tear down at the provider and delete the row;
* ``forget NAME`` — delete an orphan's row without asking the provider;
* ``set-secret NAME`` — store the signing secret of a source (for ``manual`` providers,
  whose secret an operator chose at the provider), read from stdin (a prompt on a
  terminal), encrypted in the credential store. It is never echoed.

Options: ``--database ALIAS``, ``--wait S`` (seconds to wait for another operation on the
same source; default 30). Messages go to stderr; the exit codes are
``EXIT_CODES["trigger_sources"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser

from django_leases.exceptions import (
    LeaseError,
    SourceBusy,
    TriggerSourceError,
    UnknownTriggerSourceError,
)
from django_leases.management import base
from django_leases.management.base import (
    EXIT_BUSY,
    EXIT_PROVIDER_FAILED,
    MAX_WAIT,
    add_seconds_argument,
)
from django_leases.models import TriggerRefusal, TriggerSource
from django_leases.triggers import lifecycle, registry
from django_leases.validation import check_source_name

_ACTIONS = {
    "enable": lifecycle.enable,
    "disable": lifecycle.disable,
    "teardown": lifecycle.teardown,
    "forget": lifecycle.forget,
}


_COLUMNS = base.columns(
    ("name", "provider", "declared", "enabled", "status", "url", "refused", "detail"),
    text={
        "declared": base.either("declared", "orphan"),
        "enabled": base.either("on", "off"),
        "refused": lambda counts: (
            ", ".join(f"{reason} {count}" for reason, count in counts.items()) or "-"
        ),
        "detail": lambda detail: " ".join(detail.split()) or "-",
    },
)


def add_wait_argument(parser: CommandParser) -> None:
    """Add ``--wait S``: how long an operation on a source waits for another one to end.

    Args:
        parser: a trigger-source command's parser, or one of its subcommands'.
    """
    add_seconds_argument(
        parser,
        "--wait",
        default=lifecycle.DEFAULT_WAIT,
        maximum=MAX_WAIT,
        help="Seconds to wait for another operation on a source before reporting it busy, "
        f"0 to {MAX_WAIT:g} (default {lifecycle.DEFAULT_WAIT:g}).",
    )


def status_of(source: TriggerSource) -> str:
    """The status shown for ``source``: its recorded one, or ``off`` when none was recorded."""
    return source.status or "off"


def describe(source: TriggerSource, refused: Mapping[str, int] | None = None) -> dict[str, Any]:
    """A source as operators see it (JSON-ready; never a secret). ``refused``: its refused
    deliveries counted by reason (``TriggerRefusal``)."""
    missing = lifecycle.missing_url(source)
    return {
        "name": source.name,
        "provider": source.provider,
        "declared": source.declared,
        "enabled": source.enabled,
        "status": status_of(source),
        "url": None if missing else lifecycle.receive_url(source),
        "url_missing": missing,
        "refused": dict(refused or {}),
        "state": source.state,
        "detail": source.detail or "",
    }


def outcome(result: lifecycle.LifecycleResult) -> str:
    """One line for operators: the source, its switch and status afterwards, and the detail
    (e.g. ``stripe-orders (on, status manual): Register a webhook by hand…``); just the
    source and the detail once the row is gone."""
    if result.status is None:
        return f"{result.name}: {result.detail}"
    switch = "on" if result.enabled else "off"
    state = switch if result.status == switch else f"{switch}, status {result.status}"
    return f"{result.name} ({state}): {result.detail}"


class _OutcomeFilter(logging.Filter):
    """Drops the lifecycle's INFO / WARNING records about one source: the command prints
    that outcome itself, so a console log handler would otherwise show it twice. Errors
    (tracebacks of a failed provider call) still pass."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.source = name

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or record.module != "lifecycle":
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and args[0] == self.source)


@contextmanager
def _reported_here(name: str) -> Iterator[None]:
    """While the block runs, the lifecycle's outcome records about ``name`` are left to the
    command's own output (see :class:`_OutcomeFilter`)."""
    logger = lifecycle.logger
    only_once = _OutcomeFilter(name)
    logger.addFilter(only_once)
    try:
        yield
    finally:
        logger.removeFilter(only_once)


class Command(base.LeasesCommand):
    """``manage.py trigger_sources``: list, enable, disable, tear down or forget a trigger
    source, or set its secret."""

    help = (
        "List trigger sources, enable or disable one (set up / torn down at its provider), "
        "tear one down and delete it, forget an orphan, or store a source's signing secret."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action",
            metavar="{list,enable,disable,teardown,forget,set-secret}",
            required=True,
        )
        listing = self.add_subcommand(
            actions, "list", help="Show every trigger source and its status."
        )
        base.add_format_argument(listing)
        # The spelling before --format json, still accepted.
        listing.add_argument(
            "--json", action="store_const", const="json", dest="format", help=argparse.SUPPRESS
        )
        subs = [listing]
        helps = {
            "enable": "Turn NAME on, then set it up at its provider.",
            "disable": "Turn NAME off (deliveries refused at once), then tear it down.",
            "teardown": "Turn NAME off, tear it down at its provider and delete its row.",
            "forget": "Delete orphan NAME's row, without asking its provider.",
            "set-secret": "Store NAME's signing secret, read from stdin (never echoed).",
        }
        for action, text in helps.items():
            sub = self.add_subcommand(actions, action, help=text)
            sub.add_argument("name", help="The trigger source's name.")
            if action != "set-secret":
                add_wait_argument(sub)
            subs.append(sub)
        for sub in subs:
            base.add_database_argument(sub, TriggerSource)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = base.database_alias(options, TriggerSource)
        action = options["action"]
        if action == "list":
            self._list(alias, options["format"])
        elif action == "set-secret":
            self._set_secret(alias, options["name"], options.get("stdin") or sys.stdin)
        else:
            self._run(action, options["name"], alias, options["wait"])

    def _list(self, alias: str, output_format: str) -> None:
        refused = TriggerRefusal.objects.using(alias).by_source()
        sources = [
            describe(row, {reason: r.count for reason, r in refused.get(row.name, {}).items()})
            for row in TriggerSource.objects.using(alias).order_by("name")
        ]
        empty = "No trigger sources (run manage.py reconcile_trigger_sources)."
        if output_format != "json":
            # "-" alone told nobody why; the table says it, the JSON has url_missing.
            sources = [
                {**row, "url": f"- ({row['url_missing'].replace('_', ' ')})"}
                if row["url_missing"]
                else row
                for row in sources
            ]
        base.write_rows(self.stdout, output_format, _COLUMNS, sources, empty=empty)
        if output_format != "json":
            for reason in sorted({row["url_missing"] for row in sources} - {None}):
                shown = reason.replace("_", " ")
                self.stderr.write(f"URL - ({shown}): {lifecycle.MISSING_URL_HINTS[reason]}")

    def _run(self, action: str, name: str, alias: str, wait: float) -> None:
        try:  # before the lookup: a NUL is a database error there on PostgreSQL
            check_source_name(name)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        row = TriggerSource.objects.using(alias).filter(name=name).first()
        try:
            with _reported_here(name):
                result = _ACTIONS[action](name, using=alias, wait=wait)
        except SourceBusy as exc:
            raise CommandError(str(exc), returncode=EXIT_BUSY) from None
        except (TriggerSourceError, UnknownTriggerSourceError, LeaseError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if row is not None:
            self.record_in_admin_history(action, row, result)
        if not result.ok:
            raise CommandError(outcome(result), returncode=EXIT_PROVIDER_FAILED)
        self.confirm(outcome(result))

    def _set_secret(self, alias: str, name: str, stdin: IO[str]) -> None:
        try:
            declared = TriggerSource.objects.using(alias).named(name)
        except UnknownTriggerSourceError as exc:
            raise CommandError(str(exc)) from None
        if not registry.secret_set_by_hand(declared.provider):
            raise CommandError(
                f"{name} is a {declared.provider} source: {declared.provider} chooses the secret "
                "it signs with, which its setup stores (enable the source); nothing stored."
            )
        if getattr(stdin, "isatty", lambda: False)():
            secret = getpass.getpass(f"Signing secret of {name}: ")
        else:
            secret = stdin.read()
        secret = secret.strip("\r\n")
        if not secret.strip():
            raise CommandError("No secret given on stdin; nothing stored.")
        try:
            lifecycle.store_secret(name, secret, using=alias)
        except (ValueError, ImproperlyConfigured) as exc:  # bad input; the extra missing
            raise CommandError(str(exc)) from None
        source = TriggerSource.objects.using(alias).filter(name=name).first()
        if source is not None:
            self.record_in_admin_history("set-secret", source, "Stored a new signing secret")
        self.confirm(f"Stored the signing secret of {name} (encrypted).")
