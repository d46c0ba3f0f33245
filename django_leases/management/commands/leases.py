"""``manage.py leases list|release``: operators' view of the leases, and a force release.

* ``leases list [--state live|lapsed|released] [--database ALIAS]`` prints one line per lease:
  key, state, holder, fencing token and seconds left, all judged on the database clock.
* ``leases release KEY [--database ALIAS]`` force-releases the live lease on KEY, whoever holds
  it (``Lease.objects.force_release``): the key is free at once, the token keeps rising for the
  next holder, and the ex-holder's next renewal fails, so a ``hold_lease`` process stops its
  command. Exits 1 with a message when there was no live lease on KEY.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections, router

from django_leases.models import Lease, LeaseQuerySet, LeaseState
from django_leases.validation import check_lease_name

_COLUMNS = ("KEY", "STATE", "HOLDER", "TOKEN", "SECONDS LEFT")


class Command(BaseCommand):
    help = "List the leases, or force-release the live lease on a key."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{list,release}", required=True)
        listing = actions.add_parser(
            "list", help="Show every lease: key, state, holder, token, seconds left."
        )
        listing.add_argument(
            "--state",
            choices=[state.value for state in LeaseState],
            help="Show only the leases in this state.",
        )
        release = actions.add_parser(
            "release", help="Force-release the live lease on KEY, whoever holds it."
        )
        release.add_argument("key", help="The lease key.")
        for sub in (listing, release):
            sub.add_argument(
                "--database",
                default=None,
                help=f"Database alias holding the leases. Default: the router's "
                f"({DEFAULT_DB_ALIAS}).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or router.db_for_write(Lease)
        if alias not in connections:
            raise CommandError(f"Unknown database alias {alias!r}")
        leases: LeaseQuerySet = Lease.objects.db_manager(alias).all()
        if options["action"] == "list":
            self._list(leases, options["state"])
        else:
            self._release(leases, options["key"])

    def _list(self, leases: LeaseQuerySet, state: str | None) -> None:
        rows = leases.with_state().order_by("key")
        if state:
            rows = rows.filter(state=state)  # type: ignore[misc]  # an annotation
        table = [_COLUMNS]
        for lease in rows:
            left = (
                f"{lease.seconds_left(lease.db_now):.1f}"  # type: ignore[attr-defined]
                if lease.state == LeaseState.LIVE  # type: ignore[attr-defined]
                else "-"
            )
            table.append(
                (lease.key, lease.state, lease.holder, str(lease.token), left)  # type: ignore[attr-defined]
            )
        if len(table) == 1:
            self.stdout.write("No leases." if not state else f"No {state} leases.")
            return
        widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
        for row in table:
            self.stdout.write(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )

    def _release(self, leases: LeaseQuerySet, key: str) -> None:
        try:
            check_lease_name(key, "key")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        released = leases.force_release(key)
        row = leases.with_state().filter(key=key).first()
        if not released:
            if row is None:
                raise CommandError(f"No lease on {key!r}: nothing to release.")
            raise CommandError(
                f"No live lease on {key!r} (it is {row.state}, "  # type: ignore[attr-defined]
                f"token {row.token}): nothing to release."
            )
        if row is not None and row.state == LeaseState.RELEASED:  # type: ignore[attr-defined]
            detail = f"token {row.token}, held by {row.holder}"
        else:
            detail = "another holder has taken it since"
        self.stdout.write(f"Released the live lease on {key!r} ({detail}).")
