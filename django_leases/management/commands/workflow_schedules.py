"""``manage.py workflow_schedules list|pause|resume|backfill``: operators' view of workflow
schedules.

* ``workflow_schedules list [--format table|json]`` prints one line per schedule: name,
  workflow, cron expression, time zone, catch-up and overlap policies, declared or not, active
  or paused, the next and the last tick (UTC), the last tick's run and the last skipped tick
  (``json``: also the task, the input, the skip reason and count and the buffered tick).
* ``workflow_schedules backfill NAME --start ISO --end ISO [--format table|json]`` starts
  the run of every tick of NAME from ``--start`` (included) to ``--end`` (excluded), each
  by its tick key: a tick that already has a run gets none, so running it twice, or twice
  at once, starts each tick once (``WorkflowSchedule.objects.backfill``). An ISO date
  without an offset is read in the schedule's time zone. Prints the ticks started and the
  ticks that had a run.
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

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import CommandError, CommandParser

from django_leases.clock import to_aware
from django_leases.exceptions import UnknownScheduleError
from django_leases.management import base
from django_leases.models import WorkflowSchedule
from django_leases.models.schedule import WorkflowScheduleQuerySet
from django_leases.workflows.registry import declared_schedules
from django_leases.workflows.worker import task_starter

_COLUMNS = base.columns(
    (
        "name",
        "workflow",
        "cron",
        "timezone",
        "catch_up",
        "overlap",
        "declared",
        "paused",
        "next_tick",
        "last_tick",
        "last_run",
        "last_skipped_tick",
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
        "overlap": row.overlap,
        "task": row.task or None,
        "declared": row.declared,
        "paused": row.paused,
        "next_tick": None if row.next_tick is None else to_aware(row.next_tick, alias),
        "last_tick": None if row.last_tick is None else to_aware(row.last_tick, alias),
        "last_run": row.last_run_id,
        "last_skipped_tick": _when(row.last_skipped_tick, alias),
        "last_skip_reason": row.last_skip_reason or None,
        "skipped_ticks": row.skipped_ticks,
        "buffered_tick": _when(row.buffered_tick, alias),
        "input": row.input,
    }


def _when(value: datetime | None, alias: str) -> datetime | None:
    return None if value is None else to_aware(value, alias)


def _instant(text: str, zone: str, what: str) -> datetime:
    """``text`` (ISO 8601) as an aware datetime; without an offset, in time zone ``zone``."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{what} {text!r} is not an ISO 8601 date or time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=ZoneInfo(zone))


class Command(base.LeasesCommand):
    """``manage.py workflow_schedules``: list the schedules, pause or resume one."""

    help = "List the workflow schedules, or pause or resume one."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", metavar="{list,pause,resume,backfill}", required=True
        )
        listing = self.add_subcommand(
            actions, "list", help="Show every schedule: its cron, next and last tick, state."
        )
        base.add_format_argument(listing)
        pause = self.add_subcommand(actions, "pause", help="Stop schedule NAME starting runs.")
        resume = self.add_subcommand(
            actions, "resume", help="Let schedule NAME start runs again, from its next tick."
        )
        backfill = self.add_subcommand(
            actions,
            "backfill",
            help="Start the runs of schedule NAME's ticks in a past window, each once.",
        )
        backfill.add_argument(
            "--start", required=True, help="The window's start (ISO 8601, included)."
        )
        backfill.add_argument("--end", required=True, help="The window's end (ISO 8601, excluded).")
        base.add_format_argument(backfill)
        for sub in (pause, resume, backfill):
            sub.add_argument(
                "name", type=base.name_type("Schedule name"), help="The schedule's name."
            )
        for sub in (listing, pause, resume, backfill):
            base.add_database_argument(sub, WorkflowSchedule)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = base.database_alias(options, WorkflowSchedule)
        schedules: WorkflowScheduleQuerySet = WorkflowSchedule.objects.db_manager(alias).all()
        rows = schedules.sync(declared_schedules())
        if options["action"] == "list":
            listed = [describe(row, alias) for row in rows]
            base.write_rows(self.stdout, options["format"], _COLUMNS, listed, empty="No schedules.")
            return
        if options["action"] == "backfill":
            self._backfill(schedules, alias, options)
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

    def _backfill(
        self, schedules: WorkflowScheduleQuerySet, alias: str, options: dict[str, Any]
    ) -> None:
        name = options["name"]
        try:
            row = schedules.named(name)
        except UnknownScheduleError as exc:
            raise CommandError(str(exc)) from None
        start = _instant(options["start"], row.timezone, "--start")
        end = _instant(options["end"], row.timezone, "--end")
        try:
            done = schedules.backfill(
                name, start, end, start_task=task_starter() if row.task else None
            )
        except ValueError as exc:
            raise CommandError(f"Schedule {name!r}: {exc}") from None
        self.record_in_admin_history(
            "backfill",
            row,
            f"Backfilled {start.isoformat()} to {end.isoformat()}: "
            f"{len(done.started)} run(s) started, {len(done.existing)} tick(s) had one",
        )
        if options["format"] == "json":
            self.stdout.write(
                json.dumps(
                    {
                        "name": name,
                        "ticks": [tick.isoformat() for tick in done.ticks],
                        "started": [str(run) for run in done.started],
                        "existing": [str(run) for run in done.existing],
                    }
                )
            )
            return
        self.confirm(
            f"Schedule {name!r}: {len(done.ticks)} tick(s) from {start.isoformat()} to "
            f"{end.isoformat()}; {len(done.started)} run(s) started, {len(done.existing)} "
            "tick(s) already had a run."
        )
