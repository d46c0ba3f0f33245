"""``manage.py start_workflow NAME [--input JSON] [--key KEY] [--database ALIAS]``: start one.

Prints the new run's id. With ``--key``, a run of NAME already started with that key is not
started again: its id is printed (idempotent start). A worker (``run_workflow_worker``)
then runs it. Unknown workflow names and input that is not storable JSON (see
``check_json``: no lone surrogates or NUL characters, bounded nesting) are refused with a
clear error and nothing written. Exit codes: ``EXIT_CODES["start_workflow"]`` in
:mod:`django_leases.management.base`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_leases.management.base import (
    LeasesCommand,
    add_database_argument,
    database_alias,
    json_argument,
)
from django_leases.models import WorkflowRun
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.registry import UnknownWorkflowError


class Command(LeasesCommand):
    """``manage.py start_workflow``: start a run of a registered workflow with JSON input."""

    help = "Start a run of a registered workflow and print its id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The workflow name (as given to @workflow).")
        parser.add_argument(
            "--input",
            default="{}",
            metavar="JSON",
            help="The run's input, a JSON document (default {}).",
        )
        parser.add_argument(
            "--key",
            default=None,
            help="Idempotency key: if a run of this workflow has it, print that run's id.",
        )
        add_database_argument(parser, WorkflowRun)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options, WorkflowRun)
        data = json_argument(options["input"], "--input")
        try:
            run_id = start_workflow(options["name"], data, key=options["key"], using=alias)
        except UnknownWorkflowError as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(run_id))
