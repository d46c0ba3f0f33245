"""``manage.py workflow_runs list|resume|cancel|retry``: operators' view of workflow runs.

* ``workflow_runs list [--status S] [--workflow NAME] [--tag NAME=VALUE]... [--key KEY]
  [--limit N] [--format table|json]`` prints one line per run, newest first: id, workflow,
  status, created, and the error code or message if any (``json``: the stored error itself,
  ``null`` when none, and the run's ``key`` and ``tags``). Every ``--tag`` must match
  (``WorkflowRun.objects.tagged``); ``--key`` is the key the run was started with, exactly.
* ``workflow_runs show RUN_ID [--format table|json]`` prints one run: its status, output or
  error, what it waits for now, its steps and its waits (``json``: ``display.run_overview()``).
* ``workflow_runs resume RUN_ID...`` sets suspended or failed runs running again
  (``WorkflowRun.objects.resume``: a step that missed its step function, or that failed on
  its last attempt, runs again as a new attempt).
* ``workflow_runs cancel RUN_ID...`` stops running or suspended runs for good
  (``WorkflowRun.objects.cancel``).
* Instead of ids, ``resume`` and ``cancel`` take ``--tag NAME=VALUE`` (repeatable),
  ``--workflow NAME`` and ``--status S`` filters: every run matching them all. Several runs
  go through ``WorkflowRun.objects...operate_each``, each in its own transaction: each change
  is printed and logged, each refusal is said on stderr and the exit code is then
  ``EXIT_WRONG_STATE`` (the others are done). One id alone fails as it always did.
* ``workflow_runs fork RUN_ID --from-step NAME`` starts a new run that keeps what RUN_ID
  recorded before step NAME and runs NAME and what follows again
  (``django_leases.workflows.fork_run``), and prints its id.
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

import argparse
import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models.fields.json import KeyTextTransform

from django_leases.exceptions import (
    UnknownWorkflowError,
    WorkflowEventRefusedError,
    WorkflowRunStateError,
)
from django_leases.management import base
from django_leases.management.base import EXIT_REPLAY_DIVERGES, EXIT_WRONG_STATE
from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.workflow import WorkflowRunQuerySet
from django_leases.validation import parse_run_id, parse_tag
from django_leases.workflows.display import event_sent, run_overview
from django_leases.workflows.operators import fork_run
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


def _tag(text: str) -> tuple[str, str]:
    try:
        return parse_tag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_tag_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--tag",
        action="append",
        type=_tag,
        default=[],
        metavar="NAME=VALUE",
        help="Only runs with this tag (repeatable: every one must match).",
    )


#: ``--workflow``: a workflow's name, refused before any lookup when no run could bear it.
_WORKFLOW = base.name_type("Workflow name")


def _filtered(runs: WorkflowRunQuerySet, options: dict[str, Any]) -> WorkflowRunQuerySet:
    """``runs`` narrowed by ``--status``, ``--workflow`` and every ``--tag``."""
    if options["status"]:
        runs = runs.filter(status=options["status"])
    if options["workflow"]:
        runs = runs.filter(workflow=options["workflow"])
    if options["tag"]:
        runs = runs.tagged(dict(options["tag"]))
    return runs


class Command(base.LeasesCommand):
    """``manage.py workflow_runs``: list, resume, cancel, retry a step of, or prune
    workflow runs."""

    help = "List workflow runs, resume, cancel or retry a step of one, or prune old ones."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action",
            metavar="{list,show,resume,cancel,retry,fork,send-event,prune,check-replay}",
            required=True,
        )
        listing = self.add_subcommand(actions, "list", help="Show runs, newest first.")
        listing.add_argument(
            "--status", choices=list(RunStatus.values), help="Only runs in this status."
        )
        listing.add_argument("--workflow", type=_WORKFLOW, help="Only runs of this workflow.")
        _add_tag_argument(listing)
        listing.add_argument(
            "--key", type=base.name_type("Run key"), help="Only the run(s) started with this key."
        )
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
            actions, "resume", help="Set suspended or failed runs running again."
        )
        cancel = self.add_subcommand(
            actions, "cancel", help="Stop running or suspended runs for good."
        )
        for sub in (resume, cancel):
            sub.add_argument(
                "run_ids",
                metavar="RUN_ID",
                nargs="*",
                help="The runs' ids (UUIDs); or select them with the filters instead.",
            )
            sub.add_argument(
                "--status", choices=list(RunStatus.values), help="Every run in this status."
            )
            sub.add_argument("--workflow", type=_WORKFLOW, help="Every run of this workflow.")
            _add_tag_argument(sub)
        retry = self.add_subcommand(
            actions, "retry", help="Run a failed step again as a new attempt."
        )
        retry.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        retry.add_argument("step_name", metavar="STEP", help="The step's name in the run.")
        fork = self.add_subcommand(
            actions,
            "fork",
            help="Start a new run that keeps what a run recorded before a step and runs that "
            "step and the rest again.",
        )
        fork.add_argument("run_id", metavar="RUN_ID", help="The run's id (a UUID).")
        fork.add_argument(
            "--from-step",
            required=True,
            metavar="NAME",
            help="The step to run again, with everything after it.",
        )
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
        for sub in (listing, showing, resume, cancel, retry, fork, sending, prune, replay):
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
        if action == "fork":
            self._fork(runs, options)
            return
        if action in ("resume", "cancel"):
            selection = self._selection(runs, options)
            if selection is None:  # one run by its id: as before, its refusal an error
                options["run_id"] = options["run_ids"][0]
            else:
                self._operate_each(runs, selection, action)
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

    def _selection(
        self, runs: WorkflowRunQuerySet, options: dict[str, Any]
    ) -> WorkflowRunQuerySet | None:
        """The runs a ``resume`` / ``cancel`` names: ``None`` for exactly one id and no
        filter (that run alone), else the QuerySet of the ids or of the filters."""
        ids = options["run_ids"]
        filters = options["tag"] or options["workflow"] or options["status"]
        if ids and filters:
            raise CommandError("Give run ids or --tag/--workflow/--status filters, not both.")
        if not ids and not filters:
            raise CommandError("Give one or more run ids, or --tag/--workflow/--status filters.")
        if len(ids) == 1:
            return None
        if ids:
            try:
                wanted = {parse_run_id(run_id) for run_id in ids}
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            found = set(runs.filter(pk__in=wanted).values_list("pk", flat=True))
            if wanted - found:
                missing = ", ".join(sorted(str(pk) for pk in wanted - found))
                raise CommandError(f"No workflow run with id {missing}; nothing changed.")
            return runs.filter(pk__in=wanted)
        return _filtered(runs, options)

    def _operate_each(
        self, runs: WorkflowRunQuerySet, selection: WorkflowRunQuerySet, action: str
    ) -> None:
        """Apply ``action`` to every selected run (``operate_each``): each change printed
        and logged, each refusal on stderr; exit ``EXIT_WRONG_STATE`` when any refused."""
        outcomes = selection.operate_each(action)
        if not outcomes:
            self.confirm("No workflow runs matched; nothing changed.")
            return
        # Every change into the admin's history before a line is printed: a reader that went
        # away (a closed pipe) may cost the lines, never the record of what was changed.
        changed = [o for o in outcomes if not o.refused and o.change is not None]
        found = runs.in_bulk([outcome.run_id for outcome in changed])
        for outcome in changed:
            run = found.get(outcome.run_id)
            if run is not None:
                self.record_in_admin_history(action, run, str(outcome.change))
        refused = 0
        for outcome in outcomes:
            if outcome.refused:
                refused += 1
                self.stderr.write(str(outcome))
            else:  # no change of its own: cancelled with a selected ancestor
                self.confirm(str(outcome if outcome.change is None else outcome.change))
        done = len(outcomes) - refused
        if refused:
            raise CommandError(
                f"{done} of {len(outcomes)} run(s) changed; {refused} refused.",
                returncode=EXIT_WRONG_STATE,
            )
        self.confirm(f"{done} run(s) changed.")

    def _fork(self, runs: WorkflowRunQuerySet, options: dict[str, Any]) -> None:
        try:
            fork_id = fork_run(options["run_id"], from_step=options["from_step"], using=runs.db)
        except (WorkflowRun.DoesNotExist, UnknownWorkflowError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        original = runs.filter(pk=parse_run_id(options["run_id"])).first()
        if original is not None:
            self.record_in_admin_history(
                "fork", original, f"Forked from step {options['from_step']!r} as run {fork_id}"
            )
        self.stdout.write(str(fork_id))

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
        for label in ("key", "parent", "forked_from", "created_at", "finished_at", "pass_due_at"):
            if overview[label] is not None:
                write(f"  {label}: {overview[label]}")
        if overview["tags"]:
            tags = " ".join(f"{name}={value}" for name, value in sorted(overview["tags"].items()))
            write(f"  tags: {tags}")
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
        payload = base.json_argument(options["payload"], "--payload")
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
        rows = _filtered(runs, options).order_by("-created_at")
        if options["key"] is not None:
            rows = rows.filter(key=options["key"])
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
                    "key": run.key,
                    "tags": run.tags or {},
                }
            )
        # JSON: the workflow as stored and the task's path (null but for task runs); the
        # table: the workflow column with the path after a colon.
        base.write_rows(self.stdout, options["format"], _COLUMNS, listed, empty="No workflow runs.")
