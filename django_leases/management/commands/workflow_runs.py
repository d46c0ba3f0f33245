"""``manage.py workflow_runs list|resume|cancel|retry``: operators' view of workflow runs.

* ``workflow_runs list [--status S] [--workflow NAME] [--limit N]`` prints one line per run,
  newest first: id, workflow, status, created, and the error code or message if any.
* ``workflow_runs resume RUN_ID`` sets a suspended or failed run running again
  (``WorkflowRun.objects.resume``: a step that missed its step function, or that failed on
  its last attempt, runs again as a new attempt).
* ``workflow_runs cancel RUN_ID`` stops a running or suspended run for good
  (``WorkflowRun.objects.cancel``).
* ``workflow_runs retry RUN_ID STEP`` runs a failed step again as a new attempt
  (``WorkflowRun.objects.retry_step``).
* ``workflow_runs prune --older-than DAYS [--batch-size N]`` deletes runs that finished
  (completed, failed or cancelled) more than DAYS days ago, with their steps, attempts and
  run leases (``WorkflowRun.objects.prune``), and prints how many.

Every action takes ``--database ALIAS``. Exit status: 0 done; 1 an unknown or malformed run
id, an unknown step or database alias; 2 bad usage; 3 the run's (or step's) state does not
allow the operation — nothing was changed. Errors go to stderr.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections, router

from django_leases.exceptions import WorkflowRunStateError
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep
from django_leases.models.workflow import WorkflowRunQuerySet

#: Exit status when the run's or step's state does not allow the operation.
EXIT_WRONG_STATE = 3

_COLUMNS = ("RUN ID", "WORKFLOW", "STATUS", "CREATED", "ERROR")


class Command(BaseCommand):
    help = "List workflow runs, resume, cancel or retry a step of one, or prune old ones."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", metavar="{list,resume,cancel,retry,prune}", required=True
        )
        listing = actions.add_parser("list", help="Show runs, newest first.")
        listing.add_argument(
            "--status", choices=list(RunStatus.values), help="Only runs in this status."
        )
        listing.add_argument("--workflow", help="Only runs of this workflow.")
        listing.add_argument(
            "--limit", type=int, default=100, help="Show at most this many runs (default 100)."
        )
        resume = actions.add_parser("resume", help="Set a suspended or failed run running again.")
        cancel = actions.add_parser("cancel", help="Stop a running or suspended run for good.")
        retry = actions.add_parser("retry", help="Run a failed step again as a new attempt.")
        for sub in (resume, cancel, retry):
            sub.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        retry.add_argument("step_name", metavar="STEP", help="The step's name in the run.")
        prune = actions.add_parser(
            "prune", help="Delete runs that finished long ago, with their steps and leases."
        )
        prune.add_argument(
            "--older-than",
            type=float,
            required=True,
            metavar="DAYS",
            help="Delete runs that finished (completed, failed, cancelled) more than DAYS days "
            "ago (a number ≥ 0; 0.5 is 12 hours).",
        )
        prune.add_argument(
            "--batch-size",
            type=int,
            default=500,
            help="Runs deleted per transaction (default 500).",
        )
        for sub in (listing, resume, cancel, retry, prune):
            sub.add_argument(
                "--database",
                default=None,
                help=f"Database alias holding the workflow tables. Default: the router's "
                f"({DEFAULT_DB_ALIAS}).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or router.db_for_write(WorkflowRun)
        if alias not in connections:
            raise CommandError(f"Unknown database alias {alias!r}")
        runs: WorkflowRunQuerySet = WorkflowRun.objects.db_manager(alias).all()
        action = options["action"]
        if action == "list":
            self._list(runs, options["status"], options["workflow"], options["limit"])
            return
        if action == "prune":
            days = options["older_than"]
            try:
                deleted = runs.prune(timedelta(days=days), batch_size=options["batch_size"])
            except (ValueError, OverflowError) as exc:
                raise CommandError(f"--older-than / --batch-size: {exc}") from None
            self.stdout.write(f"Deleted {deleted} run(s) finished more than {days:g} day(s) ago.")
            return
        try:
            if action == "resume":
                change = runs.resume(options["run_id"])
            elif action == "cancel":
                change = runs.cancel(options["run_id"])
            else:
                change = runs.retry_step(options["run_id"], options["step_name"])
        except WorkflowRunStateError as exc:
            raise CommandError(str(exc), returncode=EXIT_WRONG_STATE) from None
        except (WorkflowRun.DoesNotExist, WorkflowStep.DoesNotExist, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(change))

    def _list(
        self, runs: WorkflowRunQuerySet, status: str | None, workflow: str | None, limit: int
    ) -> None:
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        rows = runs.order_by("-created_at")
        if status:
            rows = rows.filter(status=status)
        if workflow:
            rows = rows.filter(workflow=workflow)
        table = [_COLUMNS]
        for run in rows[:limit]:
            table.append(
                (
                    str(run.id),
                    run.workflow,
                    run.status,
                    run.created_at.isoformat(timespec="seconds"),
                    _error_text(run.error),
                )
            )
        if len(table) == 1:
            self.stdout.write("No workflow runs.")
            return
        widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
        for row in table:
            self.stdout.write(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )


def _error_text(error: Any) -> str:
    """An error's code, else its message (one line, at most 60 characters); ``-`` if none."""
    if not error:
        return "-"
    if isinstance(error, dict):
        text = str(error.get("code") or error.get("message") or error)
    else:
        text = str(error)
    text = " ".join(text.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 60 else text[:57] + "..."
