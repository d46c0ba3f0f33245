"""Admin for workflow runs (registered on import): read-only for now.

The run list filters by status and workflow and searches by run id; a run's page shows its
steps inline and the full attempt history (one row per claim, oldest first, superseded
attempts still ``running``). Operator actions (resume, cancel, retry step) come later.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from django_leases.models import WorkflowRun, WorkflowStep


def _json(value: Any) -> str:
    """A short JSON rendering of a stored value that can always be sent as UTF-8.

    Stored data is shown whatever it holds: lone surrogates (which SQLite can hold but
    UTF-8 cannot encode) are shown as ``\\udXXX`` escapes, and anything ``json.dumps``
    refuses falls back to its ``repr``.
    """
    if value is None:
        return "—"
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (Exception, RecursionError):
            text = f"<unprintable {type(value).__name__}>"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 300 else text[:297] + "…"


class _ReadOnly:
    """No adding, changing or deleting through the admin; viewing only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkflowStepInline(_ReadOnly, admin.TabularInline):
    model = WorkflowStep
    extra = 0
    can_delete = False
    show_change_link = False
    ordering = ("created_at", "id")
    fields = (
        "step_name",
        "function_name",
        "status",
        "attempt",
        "retries",
        "lease_expires_at",
        "available_at",
        "result_json",
        "error_json",
    )
    readonly_fields = fields

    @admin.display(description="result")
    def result_json(self, step: WorkflowStep) -> str:
        return _json(step.result)

    @admin.display(description="error")
    def error_json(self, step: WorkflowStep) -> str:
        return _json(step.error)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("id", "workflow", "status", "created_at", "finished_at", "pass_due_at")
    list_filter = ("status", "workflow")
    search_fields = ("=id",)
    ordering = ("-created_at",)
    date_hierarchy = None
    inlines = (WorkflowStepInline,)
    fields = (
        "id",
        "workflow",
        "status",
        "input_json",
        "output_json",
        "error_json",
        "created_at",
        "updated_at",
        "finished_at",
        "pass_due_at",
        "history",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        # The id is a UUID: an exact match, and no database error for anything else.
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False

    @admin.display(description="input")
    def input_json(self, run: WorkflowRun) -> str:
        return _json(run.input)

    @admin.display(description="output")
    def output_json(self, run: WorkflowRun) -> str:
        return _json(run.output)

    @admin.display(description="error")
    def error_json(self, run: WorkflowRun) -> str:
        return _json(run.error)

    @admin.display(description="attempt history")
    def history(self, run: WorkflowRun) -> str:
        entries = WorkflowStep.objects.history(run.pk)
        if not entries:
            return "—"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    entry.step.step_name,
                    entry.attempt,
                    entry.status,
                    entry.started_at,
                    entry.finished_at or "—",
                    _json(entry.result),
                    _json(entry.error),
                )
                for entry in entries
            ),
        )
        return format_html(
            "<table><thead><tr><th>step</th><th>attempt</th><th>status</th><th>started</th>"
            "<th>finished</th><th>result</th><th>error</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )
