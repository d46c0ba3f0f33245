"""``manage.py workflow_schedules list|pause|resume``: operators' view of workflow schedules.

* ``workflow_schedules list [--format table|json]`` prints one line per schedule: name,
  workflow, cron expression, time zone, catch-up policy, declared or not, active or paused,
  the next and the last tick (UTC) and the last tick's run (``json``: also the input).
* ``workflow_schedules pause NAME`` stops schedule NAME from starting runs
  (``WorkflowSchedule.objects.set_paused``); ``resume NAME`` lets it start them again, from
  the next tick after now (ticks that passed while it was paused never run).

Each first syncs the schedules this code declares to their rows, as a workflow worker does
when it starts (so a schedule can be listed or paused before any worker ran). Every action
takes ``--database ALIAS``. A change is recorded in the admin's history. Errors go to stderr;
the exit codes are ``EXIT_CODES["workflow_schedules"]`` in
:mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases.clock import to_aware
from django_leases.exceptions import UnknownScheduleError
from django_leases.management import base
from django_leases.models import WorkflowSchedule
from django_leases.models.schedule import WorkflowScheduleQuerySet
from django_leases.workflows.registry import declared_schedules

_COLUMNS = base.columns(
    (
        "name",
        "workflow",
        "cron",
        "timezone",
        "catch_up",
        "declared",
        "paused",
        "next_tick",
        "last_tick",
        "last_run",
    ),
    text={
        "declared": base.either("declared", "undeclared"),
        "paused": base.either("paused", "active"),
    },
)


def describe(row: WorkflowSchedule, alias: str) -> dict[str, Any]:
    """A schedule as operators see it (JSON-ready; ticks as aware UTC datetimes)."""
    return {
        "name": row.name,
        "workflow": row.workflow,
        "cron": row.cron,
        "timezone": row.timezone,
        "catch_up": row.catch_up,
        "declared": row.declared,
        "paused": row.paused,
        "next_tick": None if row.next_tick is None else to_aware(row.next_tick, alias),
        "last_tick": None if row.last_tick is None else to_aware(row.last_tick, alias),
        "last_run": row.last_run_id,
        "input": row.input,
    }


class Command(base.LeasesCommand):
    """``manage.py workflow_schedules``: list the schedules, pause or resume one."""

    help = "List the workflow schedules, or pause or resume one."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{list,pause,resume}", required=True)
        listing = self.add_subcommand(
            actions, "list", help="Show every schedule: its cron, next and last tick, state."
        )
        base.add_format_argument(listing)
        pause = self.add_subcommand(actions, "pause", help="Stop schedule NAME starting runs.")
        resume = self.add_subcommand(
            actions, "resume", help="Let schedule NAME start runs again, from its next tick."
        )
        for sub in (pause, resume):
            sub.add_argument("name", help="The schedule's name.")
        for sub in (listing, pause, resume):
            base.add_database_argument(sub, WorkflowSchedule)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = base.database_alias(options, WorkflowSchedule)
        schedules: WorkflowScheduleQuerySet = WorkflowSchedule.objects.db_manager(alias).all()
        rows = schedules.sync(declared_schedules())
        if options["action"] == "list":
            listed = [describe(row, alias) for row in rows]
            base.write_rows(self.stdout, options["format"], _COLUMNS, listed, empty="No schedules.")
            return
        name, paused = options["name"], options["action"] == "pause"
        try:
            changed = schedules.set_paused(name, paused)
        except UnknownScheduleError as exc:
            raise CommandError(str(exc)) from None
        row = schedules.named(name)
        if not changed:
            self.confirm(f"Schedule {name!r} was already {'paused' if paused else 'active'}.")
            return
        note = "Paused" if paused else "Resumed (from the next tick after now)"
        self.record_in_admin_history(options["action"], row, note)
        shown = describe(row, alias)["next_tick"]
        after = "" if paused or shown is None else f"; next tick {shown.isoformat()}"
        self.confirm(f"Schedule {name!r} {'paused' if paused else 'resumed'}{after}.")
