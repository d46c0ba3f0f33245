"""``manage.py workflow_runs list|resume|cancel|retry``: operators' view of workflow runs.

* ``workflow_runs list [--status S] [--workflow NAME] [--limit N] [--format table|json]``
  prints one line per run, newest first: id, workflow, status, created, and the error code or
  message if any (``json``: the stored error itself, ``null`` when none).
* ``workflow_runs show RUN_ID [--format table|json]`` prints one run: its status, output or
  error, what it waits for now, its steps and its waits (``json``: ``display.run_overview()``).
* ``workflow_runs resume RUN_ID`` sets a suspended or failed run running again
  (``WorkflowRun.objects.resume``: a step that missed its step function, or that failed on
  its last attempt, runs again as a new attempt).
* ``workflow_runs cancel RUN_ID`` stops a running or suspended run for good
  (``WorkflowRun.objects.cancel``).
* ``workflow_runs retry RUN_ID STEP`` runs a failed step again as a new attempt
  (``WorkflowRun.objects.retry_step``).
* ``workflow_runs send-event RUN_ID NAME [--payload JSON]`` sends event NAME (payload: JSON
  text, default ``null``) to a running or suspended run, for its ``run.wait_for_event(NAME)``
  (``WorkflowWait.objects.send_event``: delivered once; a second one is refused).
* ``workflow_runs check-replay [--format table|json]`` replays every live run in memory
  against the code now deployed, writing nothing
  (:func:`~django_leases.workflows.replay_check.check_replay`): exit 0 when every one
  replays, 3 when any would meet an action other than the one it recorded (each named).
* ``workflow_runs prune --older-than DAYS [--batch-size N]`` deletes runs that finished
  (completed, failed or cancelled) more than DAYS days ago, with their steps, attempts and
  run leases (``WorkflowRun.objects.prune``), and prints how many.

Every action takes ``--database ALIAS``. Errors go to stderr; the exit codes are
``EXIT_CODES["workflow_runs"]`` in :mod:`django_leases.management.base`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models.fields.json import KeyTextTransform

from django_leases.exceptions import WorkflowEventRefusedError, WorkflowRunStateError
from django_leases.management import base
from django_leases.management.base import EXIT_REPLAY_DIVERGES, EXIT_WRONG_STATE
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.workflow import WorkflowRunQuerySet
from django_leases.validation import parse_run_id
from django_leases.workflows.display import event_sent, run_overview
from django_leases.workflows.replay_check import check_replay
from django_leases.workflows.values import TASK_WORKFLOW


def task_path(workflow: str, path: object) -> str | None:
    """The Django task a run runs (``myapp.tasks.send_mail``): ``path`` (its input's
    ``"task"``) for a run of the Tasks backend's workflow, else ``None``."""
    return path if workflow == TASK_WORKFLOW and isinstance(path, str) and path else None


def _workflow_text(workflow: str, path: str | None) -> str:
    """How the listings show a run's workflow: a task run's with the task's path after a
    colon (``django_leases.task:myapp.tasks.send_mail``), as every task run shares one."""
    return f"{workflow}:{path}" if path else workflow


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


_COLUMNS = base.columns(
    ("id", "workflow", "status", "created_at", "error"),
    headers={"id": "RUN ID", "created_at": "CREATED"},
    text={"error": _error_text},
)


_STEP_COLUMNS = base.columns(
    ("name", "function", "status", "attempt", "max_attempts", "error"),
    headers={"name": "STEP", "max_attempts": "OF"},
    text={"error": _error_text},
)
_WAIT_COLUMNS = base.columns(("name", "kind", "status", "what"), headers={"name": "WAIT"})


class Command(base.LeasesCommand):
    """``manage.py workflow_runs``: list, resume, cancel, retry a step of, or prune
    workflow runs."""

    help = "List workflow runs, resume, cancel or retry a step of one, or prune old ones."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action",
            metavar="{list,show,resume,cancel,retry,send-event,prune,check-replay}",
            required=True,
        )
        listing = self.add_subcommand(actions, "list", help="Show runs, newest first.")
        listing.add_argument(
            "--status", choices=list(RunStatus.values), help="Only runs in this status."
        )
        listing.add_argument("--workflow", help="Only runs of this workflow.")
        listing.add_argument(
            "--limit",
            type=base.integer_type(1, base.MAX_ROWS),
            default=100,
            help=f"Show at most this many runs, 1 to {base.MAX_ROWS} (default 100).",
        )
        base.add_format_argument(listing)
        showing = self.add_subcommand(
            actions, "show", help="Show one run: status, output, steps and waits."
        )
        showing.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        base.add_format_argument(showing)
        resume = self.add_subcommand(
            actions, "resume", help="Set a suspended or failed run running again."
        )
        cancel = self.add_subcommand(
            actions, "cancel", help="Stop a running or suspended run for good."
        )
        retry = self.add_subcommand(
            actions, "retry", help="Run a failed step again as a new attempt."
        )
        for sub in (resume, cancel, retry):
            sub.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        retry.add_argument("step_name", metavar="STEP", help="The step's name in the run.")
        sending = self.add_subcommand(
            actions, "send-event", help="Send an event to a run waiting for it (once)."
        )
        sending.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        sending.add_argument("name", metavar="NAME", help="The event's name.")
        sending.add_argument(
            "--payload", default="null", metavar="JSON", help="The event's payload (JSON text)."
        )
        prune = self.add_subcommand(
            actions,
            "prune",
            help="Delete runs that finished long ago, with their steps and leases.",
        )
        prune.add_argument(
            "--older-than",
            type=base.seconds_type(maximum=base.MAX_AGE_DAYS, unit="days", unit_seconds=86_400.0),
            required=True,
            metavar="DAYS",
            help="Delete runs that finished (completed, failed, cancelled) more than DAYS days "
            f"ago (0 to {base.MAX_AGE_DAYS:g}; 0.5 is 12 hours).",
        )
        prune.add_argument(
            "--batch-size",
            type=base.integer_type(1, base.MAX_ROWS),
            default=500,
            help=f"Runs deleted per transaction, 1 to {base.MAX_ROWS} (default 500).",
        )
        replay = self.add_subcommand(
            actions,
            "check-replay",
            help="Replay every live run in memory on the code now deployed (writes nothing).",
        )
        base.add_format_argument(replay)
        for sub in (listing, showing, resume, cancel, retry, sending, prune, replay):
            base.add_database_argument(sub, WorkflowRun)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = base.database_alias(options, WorkflowRun)
        runs: WorkflowRunQuerySet = WorkflowRun.objects.db_manager(alias).all()
        action = options["action"]
        if action == "list":
            self._list(runs, options)
            return
        if action == "prune":
            days = options["older_than"]
            try:
                deleted = runs.prune(timedelta(days=days), batch_size=options["batch_size"])
            except (ValueError, OverflowError) as exc:
                raise CommandError(f"--older-than / --batch-size: {exc}") from None
            self.confirm(f"Deleted {deleted} run(s) finished more than {days:g} day(s) ago.")
            return
        if action == "check-replay":
            self._check_replay(alias, options["format"])
            return
        if action == "send-event":
            self._send_event(alias, options)
            return
        if action == "show":
            self._show(runs, options)
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
        run = runs.filter(pk=change.run_id).first()
        if run is not None:
            subcommand = "retry" if action not in ("resume", "cancel") else action
            self.record_in_admin_history(subcommand, run, str(change))
        self.confirm(str(change))

    def _show(self, runs: WorkflowRunQuerySet, options: dict[str, Any]) -> None:
        try:
            run = runs.get(pk=parse_run_id(options["run_id"]))
        except (WorkflowRun.DoesNotExist, ValueError) as exc:
            message = str(exc) if isinstance(exc, ValueError) else "No workflow run with that id"
            raise CommandError(f"{message}: {options['run_id']}") from None
        overview = run_overview(run)
        if options["format"] == "json":
            self.stdout.write(json.dumps(overview, indent=2, default=base.json_value))
            return
        write = self.stdout.write
        given = run.input.get("task") if isinstance(run.input, dict) else None
        path = task_path(run.workflow, given)
        write(f"Run {run.pk}  {_workflow_text(run.workflow, path)}  {run.status}")
        for label in ("key", "parent", "created_at", "finished_at", "pass_due_at"):
            if overview[label] is not None:
                write(f"  {label}: {overview[label]}")
        for label in ("output", "error"):
            if overview[label] is not None:
                write(f"  {label}: {json.dumps(overview[label], default=base.json_value)}")
        for line in overview["waiting_on"]:
            write(f"  now {line}")
        base.write_rows(self.stdout, "table", _STEP_COLUMNS, overview["steps"], empty="No steps.")
        base.write_rows(self.stdout, "table", _WAIT_COLUMNS, overview["waits"], empty="No waits.")

    def _check_replay(self, alias: str, output_format: str) -> None:
        report = check_replay(using=alias)
        if output_format == "json":
            self.stdout.write(json.dumps(report.as_json(), indent=2))
        else:
            for line in report.lines():
                self.stdout.write(line)
        if not report.ok:
            raise CommandError(report.summary(), returncode=EXIT_REPLAY_DIVERGES)

    def _send_event(self, alias: str, options: dict[str, Any]) -> None:
        try:
            payload = json.loads(options["payload"])
        except ValueError as exc:
            raise CommandError(f"--payload is not JSON: {exc}") from None
        name = options["name"]
        try:
            wait = WorkflowWait.objects.db_manager(alias).send_event(
                options["run_id"], name, payload
            )
        except (WorkflowRunStateError, WorkflowEventRefusedError) as exc:
            raise CommandError(str(exc), returncode=EXIT_WRONG_STATE) from None
        except (WorkflowRun.DoesNotExist, ValueError) as exc:
            raise CommandError(str(exc)) from None
        run = WorkflowRun.objects.db_manager(alias).filter(pk=wait.run_id).first()
        if run is not None:  # as the admin's "Send event" form logs it
            self.record_in_admin_history("send-event", run, f"Sent event {name!r}")
        self.confirm(event_sent(wait))

    def _list(self, runs: WorkflowRunQuerySet, options: dict[str, Any]) -> None:
        rows = runs.order_by("-created_at")
        if options["status"]:
            rows = rows.filter(status=options["status"])
        if options["workflow"]:
            rows = rows.filter(workflow=options["workflow"])
        rows = rows.annotate(task_path=KeyTextTransform("task", "input"))
        listed = []
        for run in rows[: options["limit"]]:
            path = task_path(run.workflow, run.task_path)
            listed.append(
                {
                    "id": str(run.id),
                    "workflow": run.workflow
                    if options["format"] == "json"
                    else _workflow_text(run.workflow, path),
                    "task": path,
                    "status": run.status,
                    "created_at": run.created_at,
                    "error": run.error,
                }
            )
        # JSON: the workflow as stored and the task's path (null but for task runs); the
        # table: the workflow column with the path after a colon.
        base.write_rows(self.stdout, options["format"], _COLUMNS, listed, empty="No workflow runs.")
