"""``manage.py leases list|release``: operators' view of the leases, and a force release.

* ``leases list [--state live|lapsed|released] [--format table|json] [--database ALIAS]``
  prints one line per lease: key, state, holder, fencing token and seconds left, all judged on
  the database clock (``json``: also ``expires_at``; ``seconds_left`` is ``null`` unless live).
* ``leases release KEY [--database ALIAS]`` force-releases the live lease on KEY, whoever holds
  it (``Lease.objects.force_release``): the key is free at once, the token keeps rising for the
  next holder, and the ex-holder's next renewal fails, so a ``hold_lease`` process stops its
  command. Exits 1 with a message when there was no live lease on KEY.

Exit codes: ``EXIT_CODES["leases"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases.management import base
from django_leases.models import Lease, LeaseQuerySet, LeaseState
from django_leases.validation import check_lease_name


def _seconds_text(left: float | None) -> str:
    return "-" if left is None else f"{left:.1f}"


_COLUMNS = base.columns(
    ("key", "state", "holder", "token", "seconds_left"), text={"seconds_left": _seconds_text}
)


class Command(base.LeasesCommand):
    """``manage.py leases``: list leases, or force-release one."""

    help = "List the leases, or force-release the live lease on a key."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{list,release}", required=True)
        listing = self.add_subcommand(
            actions, "list", help="Show every lease: key, state, holder, token, seconds left."
        )
        listing.add_argument(
            "--state",
            choices=[state.value for state in LeaseState],
            help="Show only the leases in this state.",
        )
        base.add_format_argument(listing)
        release = self.add_subcommand(
            actions, "release", help="Force-release the live lease on KEY, whoever holds it."
        )
        release.add_argument("key", help="The lease key.")
        for sub in (listing, release):
            base.add_database_argument(sub, Lease)

    def handle(self, *args: Any, **options: Any) -> None:
        leases: LeaseQuerySet = Lease.objects.db_manager(base.database_alias(options, Lease)).all()
        if options["action"] == "list":
            self._list(leases, options["state"], options["format"])
        else:
            self._release(leases, options["key"])

    def _list(self, leases: LeaseQuerySet, state: str | None, output_format: str) -> None:
        rows = leases.with_state().order_by("key")
        if state:
            rows = rows.filter(state=state)  # type: ignore[misc]  # an annotation
        # state and db_now are with_state()'s annotations, unknown to the stubs: the ignores.
        listed = [
            {
                "key": lease.key,
                "state": lease.state,  # type: ignore[attr-defined]
                "holder": lease.holder,
                "token": lease.token,
                "seconds_left": (
                    lease.seconds_left(lease.db_now)  # type: ignore[attr-defined]
                    if lease.state == LeaseState.LIVE  # type: ignore[attr-defined]
                    else None
                ),
                "expires_at": lease.expires_at,
            }
            for lease in rows
        ]
        empty = "No leases." if not state else f"No {state} leases."
        base.write_rows(self.stdout, output_format, _COLUMNS, listed, empty=empty)

    def _release(self, leases: LeaseQuerySet, key: str) -> None:
        try:
            check_lease_name(key, "key")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        released = leases.force_release(key)
        # row.state is with_state()'s annotation, unknown to the stubs: the ignores below.
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
        if row is not None:
            self.record_in_admin_history("release", row, f"Force-released ({detail})")
        self.confirm(f"Released the live lease on {key!r} ({detail}).")
