"""Admin for workflow runs (registered on import; DESIGN §7).

The run list filters by status, kind (Django task or workflow), queue, task path and
workflow, and searches by run id; a run's page shows its steps inline and the full attempt
history (one row per claim, oldest first, superseded attempts still ``running``). Nothing
can be added, edited or deleted here.

Operators — users with the ``django_leases.operate_workflowrun`` permission — get three
operations, each calling the store's method (``WorkflowRun.objects.resume`` / ``cancel`` /
``retry_step``, one transaction each) and leaving a ``LogEntry`` and a message with the
outcome: **resume** and **cancel** as list actions and as buttons in the run page's
"Operate" section, and **retry step** as one "Retry step <name>" button there per failed step.
Only the operations the run's state allows are offered. The buttons post (with the CSRF
token) to ``<run id>/operate/<operation>/``; as for Django's own actions, that URL needs the
``view_workflowrun`` permission **and** the operate one — a user missing either gets 403
there (before the run is looked up) and never sees the actions or the buttons.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import (
    ModelAdminOf,
    ObjectOperations,
    ReadOnlyAdmin,
    ReadOnlyModelAdmin,
    TabularInlineOf,
    ValueFilter,
)
from django_leases.admin.bulk import RunOperatorActions
from django_leases.admin.display import (
    LINKS_SHOWN,
    and_more,
    choice_label,
    cut_at_word,
    field_column,
    local_time,
    run_url,
    whole_run_id_link,
)
from django_leases.admin.runtags import RunTagFilter, search_runs
from django_leases.admin.tracebacks import error_html
from django_leases.exceptions import WorkflowEventRefusedError, WorkflowRunStateError
from django_leases.models import (
    AttemptStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
    WorkflowWait,
)
from django_leases.workflows.display import describe_wait, event_sent, waiting_on
from django_leases.workflows.values import TASK_WORKFLOW, RunChange, WaitKind, WaitStatus

#: The permission behind resume, cancel and retry step.
OPERATE_PERMISSION = "django_leases.operate_workflowrun"
#: The run-page operations (the last path segment of their URLs).
OPERATIONS = ("resume", "cancel", "retry-step", "send-event", "fork")


def _json_text(value: Any) -> str:
    """A JSON rendering of a stored value that can always be sent as UTF-8.

    Stored data is shown whatever it holds: lone surrogates (which SQLite can hold but
    UTF-8 cannot encode) are shown as ``\\udXXX`` escapes, and anything ``json.dumps``
    refuses falls back to its ``repr``.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (Exception, RecursionError):
            text = f"<unprintable {type(value).__name__}>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json(value: Any) -> str:
    """A stored value as safe HTML: its JSON, cut at a word boundary after
    :data:`JSON_SHOWN` characters, in a ``dl-json`` span that wraps; ``"—"`` for ``None``."""
    if value is None:
        return "—"
    return format_html(
        '<span class="dl-json">{}</span>', cut_at_word(_json_text(value), JSON_SHOWN)
    )


#: Characters of a stored JSON value the run page shows (whole words, then "…").
JSON_SHOWN = 300

#: Rows of one kind a run's page shows — its steps, its attempt history, the fork form's
#: steps, the failed steps to retry: the latest ones, with how many earlier ones are left out
#: (a run of thousands of steps is a page of hundreds of kilobytes, not megabytes).
ROWS_SHOWN = 200


class LatestStepsFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """The run's latest :data:`ROWS_SHOWN` steps, oldest first; ``hidden``: how many earlier
    steps it leaves out (the inline's template says so)."""

    hidden = 0

    def get_queryset(self) -> QuerySet[WorkflowStep]:
        """The latest steps (one more read, and a count when there are more)."""
        if not hasattr(self, "_latest"):
            rows = super().get_queryset()
            newest = list(
                rows.order_by("-created_at", "-id").values_list("pk", flat=True)[:ROWS_SHOWN]
            )
            if len(newest) == ROWS_SHOWN:
                self.hidden = rows.count() - ROWS_SHOWN
            self._latest = rows.filter(pk__in=newest)
        return self._latest


class WorkflowStepInline(ReadOnlyAdmin, TabularInlineOf[WorkflowStep, WorkflowRun]):
    """A run's steps on its page, read-only, oldest first."""

    model = WorkflowStep
    formset = LatestStepsFormSet
    template = "admin/django_leases/workflowrun/steps_inline.html"
    extra = 0
    can_delete = False
    show_change_link = False
    ordering = ("created_at", "id")
    fields = (
        "step_name",
        "function_name",
        "status",
        "attempts",
        "timing",
        "progress_json",
        "result_json",
        "error_json",
    )

    #: What the step's attempt last said of its progress (``ctx.set_progress``).
    progress_json = field_column("progress", _("progress"), _json)

    @admin.display(description=_("attempt"))
    def attempts(self, step: WorkflowStep) -> str:
        """The current attempt and the most there can be (``retries`` + 1)."""
        return gettext("%(attempt)d of %(most)d") % {
            "attempt": step.attempt,
            "most": step.max_attempts,
        }

    @admin.display(description=_("lease / due"))
    def timing(self, step: WorkflowStep) -> str:
        """A running step's lease expiry, or when a waiting step (or a failed step's next
        attempt) is due."""
        if step.status == StepStatus.RUNNING and step.lease_expires_at is not None:
            return format_html(
                gettext("lease until {time}"), time=local_time(step.lease_expires_at)
            )
        if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED) and step.available_at:
            return format_html(gettext("due {time}"), time=local_time(step.available_at))
        retry_left = step.attempt <= step.retries
        if step.status == StepStatus.FAILED and retry_left and step.available_at:
            return format_html(gettext("retry due {time}"), time=local_time(step.available_at))
        return "—"

    def has_view_permission(self, request: HttpRequest, obj: WorkflowRun | None = None) -> bool:
        """Steps are part of their run: whoever may view the run sees its steps (Django would
        otherwise also ask for ``view_workflowstep``)."""
        return request.user.has_perm(f"{WorkflowRun._meta.app_label}.view_workflowrun")

    #: The step's recorded result as indented JSON (HTML ``str``).
    result_json = field_column("result", _("result"), _json)

    @admin.display(description=_("error"))
    def error_json(self, step: WorkflowStep) -> str:
        """The step's recorded error as JSON, its traceback (if any) below it, readable
        (HTML ``str``; :func:`~django_leases.admin.tracebacks.error_html`)."""
        return error_html(step.error, _json, element_id=f"traceback-{step.step_name}")


class RunKindFilter(admin.SimpleListFilter):
    """Runs of Django tasks (``django_leases.tasks``) or of ``@workflow`` functions."""

    title = _("kind")
    parameter_name = "kind"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        """The two kinds: ``task`` and ``workflow``."""
        return [("task", gettext("Task")), ("workflow", gettext("Workflow"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Only runs of the chosen kind (all for no or an unknown choice)."""
        if self.value() == "task":
            return queryset.filter(workflow=TASK_WORKFLOW)
        if self.value() == "workflow":
            return queryset.exclude(workflow=TASK_WORKFLOW)
        return queryset


class RunQueueFilter(ValueFilter):
    """Runs with a step on the chosen queue (a task's queue is its one step's)."""

    title = _("queue")
    parameter_name = "queue"

    def values(self) -> list[str]:
        """The queues steps were put on (at most 100, by name)."""
        queues = WorkflowStep.objects.order_by("queue").values_list("queue", flat=True)
        return list(queues.distinct()[:100])

    def chosen(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        """Only runs with a step on the chosen queue."""
        return queryset.filter(Exists(WorkflowStep.objects.filter(run=OuterRef("pk"), queue=value)))


class TaskPathFilter(ValueFilter):
    """Task runs of the chosen ``@task`` (its module path)."""

    title = _("task")
    parameter_name = "task"

    def values(self) -> list[str]:
        """The task paths enqueued (at most 100, by path)."""
        paths = (
            WorkflowRun.objects.filter(workflow=TASK_WORKFLOW)
            .values_list("input__task", flat=True)
            .distinct()
        )
        return sorted({path for path in paths[:1000] if isinstance(path, str)})[:100]

    def chosen(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        """Only task runs of the chosen path."""
        return queryset.filter(workflow=TASK_WORKFLOW, input__task=value)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(
    ReadOnlyModelAdmin, RunOperatorActions, ObjectOperations, ModelAdminOf[WorkflowRun]
):
    """Workflow runs: read-only pages, with resume, cancel and retry-step operations for users
    with ``operate_workflowrun`` (and the view permission)."""

    list_display = ("id", "workflow", "status", "created_at", "finished_at", "pass_due_at")
    list_filter = (
        "status",
        RunKindFilter,
        RunQueueFilter,
        TaskPathFilter,
        "workflow",
        RunTagFilter,
    )
    search_fields = ("=id", "key")
    search_help_text = _("A run's id, or its key or the start of it.")
    ordering = ("-created_at",)
    date_hierarchy = None
    inlines = (WorkflowStepInline,)
    actions = ("resume_runs", "cancel_runs", "retry_runs", "fork_runs")
    change_form_template = "admin/django_leases/workflowrun/change_form.html"
    operations = OPERATIONS
    missing_message = _("No workflow run with id %(id)r.")

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
        "key",
        "deadline_at",
        "debounce_key",
        "tags_text",
        "forked_from_link",
        "parent_link",
        "children_links",
        "waiting_on",
        "waits",
        "timeline",
        "history",
    )

    # -- operators ------------------------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Whether the user may resume, cancel and retry (``operate_workflowrun``)."""
        return bool(request.user.has_perm(OPERATE_PERMISSION))

    def operator_context(self, run: WorkflowRun) -> dict[str, Any]:
        """The operations this user may start on ``run``'s page (``operations``: which are
        offered, the failed steps to retry, the fork form's steps, their URLs)."""
        allowed = run.allowed_operations()
        failed_steps = list(
            WorkflowStep.objects.filter(run=run, status=StepStatus.FAILED)
            .order_by("-created_at", "-id")
            .values_list("step_name", flat=True)[:ROWS_SHOWN]
        )[::-1]
        return {
            "operations": {
                "resume": "resume" in allowed,
                "cancel": "cancel" in allowed,
                "retry_steps": failed_steps if "retry" in allowed else [],
                "send_event": run.status in (RunStatus.RUNNING, RunStatus.SUSPENDED),
                **super().operator_context(run),
                "urls": {op.replace("-", "_"): self.operate_url(run, op) for op in self.operations},
            }
        }

    def run_operation(self, request: HttpRequest, obj: WorkflowRun, operation: str) -> HttpResponse:
        """Resume, cancel, retry the step named in the form (``step``), send an event or fork;
        back to the run's page (the fork's, for a fork)."""
        run = obj
        if operation == "resume":
            self._operate(request, run, lambda: WorkflowRun.objects.resume(run.pk))
        elif operation == "cancel":
            self._operate(request, run, lambda: WorkflowRun.objects.cancel(run.pk))
        elif operation == "send-event":
            self._send_event(request, run)
        elif operation == "fork":
            fork = self.fork_from_form(request, run)
            if fork is not None:
                return HttpResponseRedirect(run_url(fork.pk))
        else:
            step_name = request.POST.get("step", "")
            self._operate(request, run, lambda: WorkflowRun.objects.retry_step(run.pk, step_name))
        return HttpResponseRedirect(run_url(run.pk))

    def _send_event(self, request: HttpRequest, run: WorkflowRun) -> None:
        """Send the event named in the form (``name``, ``payload`` as JSON text, empty for
        ``null``) to the run (``WorkflowWait.objects.send_event``); log it, say how it went."""
        name = request.POST.get("name", "").strip()
        text = request.POST.get("payload", "").strip()
        try:
            payload = json.loads(text) if text else None
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            self.message_user(
                request,
                gettext("Nothing sent: the payload is not JSON (%(error)s).") % {"error": exc},
                messages.ERROR,
            )
            return
        try:
            wait = WorkflowWait.objects.send_event(run.pk, name, payload)
        except (WorkflowEventRefusedError, WorkflowRunStateError, ValueError) as exc:
            self.message_user(
                request, gettext("Nothing sent: %(error)s.") % {"error": exc}, messages.ERROR
            )
            return
        self.log_change(request, run, f"Sent event {name!r}")
        level = messages.SUCCESS if wait.reached_at is not None else messages.WARNING
        self.message_user(request, event_sent(wait), level)

    @admin.display(description=_("parent run"))
    def parent_link(self, run: WorkflowRun) -> str:
        """The run that started this one with ``run.child``, linked."""
        if run.parent_id is None:
            return "—"
        return whole_run_id_link(run.parent_id)

    @admin.display(description=_("child runs"))
    def children_links(self, run: WorkflowRun) -> str:
        """The runs this one started with ``run.child``, linked, with their status (its
        label in the active language): the first :data:`LINKS_SHOWN`, then how many more."""
        children = WorkflowRun.objects.filter(parent_id=run.pk).order_by("created_at", "id")
        shown = list(children.values_list("pk", "workflow", "status")[:LINKS_SHOWN])
        if not shown:
            return "—"
        lines: list[str] = [
            format_html(
                "{} {} ({})", whole_run_id_link(pk), workflow, choice_label(RunStatus, status)
            )
            for pk, workflow, status in shown
        ]
        if len(shown) == LINKS_SHOWN and (more := children.count() - LINKS_SHOWN) > 0:
            lines.append(and_more(more))
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

    @admin.display(description=_("waiting on"))
    def waiting_on(self, run: WorkflowRun) -> str:
        """What a running run waits for now (``WorkflowRun.waiting_on``)."""
        return (
            format_html_join(mark_safe("<br>"), "{}", ((line,) for line in waiting_on(run))) or "—"
        )

    @admin.display(description=_("waits"))
    def waits(self, run: WorkflowRun) -> str:
        """Each wait of the run: what it waits for, and its timestamps."""
        rows = WorkflowWait.objects.filter(run=run).order_by("id")
        if not rows:
            return "—"
        return format_html(
            "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>"
            "<th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            gettext("name"),
            gettext("kind"),
            gettext("status"),
            gettext("what"),
            gettext("reached"),
            gettext("due"),
            gettext("done"),
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td></tr>",
                (
                    (
                        wait.name,
                        choice_label(WaitKind, wait.kind),
                        choice_label(WaitStatus, wait.status),
                        describe_wait(wait),
                        local_time(wait.reached_at),
                        local_time(wait.due_at),
                        local_time(wait.done_at),
                    )
                    for wait in rows
                ),
            ),
        )

    def said(self, change: RunChange) -> str:
        """A change as the run list's actions say it (:func:`change_text`)."""
        return change_text(change)

    def _operate(
        self, request: HttpRequest, run: WorkflowRun, operation: Callable[..., RunChange]
    ) -> RunChange | None:
        """Run ``operation`` (a store call returning a ``RunChange``); on success write a
        ``LogEntry`` (``str(change)``: the history keeps the code's words, whoever reads it)
        and a success message in the active language, on a refusal an error message (nothing
        changed)."""
        try:
            change: RunChange = operation()
        except WorkflowRun.DoesNotExist:  # deleted meanwhile (a prune): as an unknown id
            self.message_user(request, self.missing_message % {"id": run.pk}, messages.ERROR)
            return None
        except (WorkflowRunStateError, WorkflowStep.DoesNotExist, ValueError) as exc:
            self.message_user(
                request, gettext("Nothing changed: %(error)s.") % {"error": exc}, messages.ERROR
            )
            return None
        self.log_change(request, run, str(change))
        self.message_user(request, change_text(change), messages.SUCCESS)
        return change

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        # An id (a UUID): that run; anything else: a key, or the start of one.
        return search_runs(queryset, search_term), False

    @admin.display(description=_("tags"))
    def tags_text(self, run: WorkflowRun) -> str:
        """The run's tags, ``name=value``, one a line, each a link to the list filtered by it."""
        if not run.tags:
            return "—"
        changelist = reverse("admin:django_leases_workflowrun_changelist")
        return format_html_join(
            mark_safe("<br>"),
            '<a href="{}?{}">{}={}</a>',
            (
                (changelist, urlencode({"tag": f"{name}={value}"}), name, value)
                for name, value in sorted(run.tags.items())
            ),
        )

    @admin.display(description=_("forked from"))
    def forked_from_link(self, run: WorkflowRun) -> str:
        """The run this one was forked from, linked, and the runs forked from this one."""
        links = []
        if run.forked_from_id is not None:
            links.append(whole_run_id_link(run.forked_from_id))
        forks = WorkflowRun.objects.filter(forked_from_id=run.pk).order_by("created_at", "id")
        fork_ids = list(forks.values_list("pk", flat=True)[:LINKS_SHOWN])
        for fork_id in fork_ids:
            links.append(format_html("{} {}", gettext("forked as"), whole_run_id_link(fork_id)))
        if len(fork_ids) == LINKS_SHOWN and (more := forks.count() - LINKS_SHOWN) > 0:
            links.append(and_more(more))
        return format_html_join(mark_safe("<br>"), "{}", ((link,) for link in links)) or "—"

    #: The run's input as indented JSON (HTML ``str``).
    input_json = field_column("input", _("input"), _json)

    #: The run's output as indented JSON (HTML ``str``).
    output_json = field_column("output", _("output"), _json)

    @admin.display(description=_("error"))
    def error_json(self, run: WorkflowRun) -> str:
        """The run's error as JSON, its traceback (and a failed step's) below it, readable
        (HTML ``str``; :func:`~django_leases.admin.tracebacks.error_html`)."""
        return error_html(run.error, _json, element_id="run-traceback")

    @admin.display(description=_("timeline"))
    def timeline(self, run: WorkflowRun) -> str:
        """The run's steps, attempts and waits on one time axis: SVG drawn on the server
        (:func:`django_leases.workflows.timeline.timeline_for`, template
        ``admin/django_leases/workflowrun/timeline.html``); ``"—"`` before its first step."""
        # deferred: start-up cost. The admin registers as Django starts; the renderer (its
        # layout dataclasses) is needed only on a run's page.
        from django_leases.workflows.timeline import timeline_for

        drawn = timeline_for(run)
        if not drawn.lanes:
            return "—"
        return render_to_string(
            "admin/django_leases/workflowrun/timeline.html", {"timeline": drawn}
        )

    @admin.display(description=_("attempt history"))
    def history(self, run: WorkflowRun) -> str:
        """The run's latest :data:`ROWS_SHOWN` attempts of its steps, oldest first
        (``WorkflowStepAttempt.objects``), after how many earlier ones are left out; an
        attempt a later one replaced says *superseded* (its row still says ``running``)."""
        attempts = WorkflowStepAttempt.objects.for_run(run.pk).with_superseded()
        entries = list(attempts.reverse()[:ROWS_SHOWN])[::-1]
        if not entries:
            return "—"
        hidden = attempts.count() - ROWS_SHOWN if len(entries) == ROWS_SHOWN else 0
        rows = format_html_join(
            "",
            '<tr class="dl-attempt dl-attempt-{}"><td class="dl-name">{}</td>'
            '<td class="dl-name">{}</td><td class="dl-name">{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td></tr>",
            (
                (
                    shown,
                    entry.step.step_name,
                    entry.attempt,
                    gettext("Superseded")
                    if shown == "superseded"
                    else choice_label(AttemptStatus, shown),
                    local_time(entry.started_at),
                    local_time(entry.finished_at),
                    _json(entry.result),
                    _json(entry.error),
                )
                for entry in entries
                for shown in ["superseded" if getattr(entry, "superseded", False) else entry.status]
            ),
        )
        return format_html(
            '{}<table class="dl-table" id="attempt-history"><thead><tr><th>{}</th>'
            "<th>{}</th><th>{}</th><th>{}</th><th>{}</th>"
            '<th class="dl-json-column">{}</th><th class="dl-json-column">{}</th></tr>'
            "</thead><tbody>{}</tbody></table>",
            format_html(
                '<p class="help">{}</p>',
                ngettext(
                    "The %(count)d earlier attempt is not shown.",
                    "The %(count)d earlier attempts are not shown.",
                    hidden,
                )
                % {"count": hidden},
            )
            if hidden > 0
            else "",
            gettext("step"),
            gettext("attempt"),
            gettext("status"),
            gettext("started"),
            gettext("finished"),
            gettext("result"),
            gettext("error"),
            rows,
        )


def change_text(change: RunChange) -> str:
    """What an operator operation did (``RunChange``), as the admin says it, in the active
    language: the run, its status before and after (their labels), and the steps it made due
    again or stopped."""
    text = gettext("Run %(run)s: %(before)s → %(after)s") % {
        "run": change.run_id,
        "before": choice_label(RunStatus, change.before),
        "after": choice_label(RunStatus, change.after),
    }
    if change.steps:
        names = ", ".join(repr(step) for step in change.steps)
        count = len(change.steps)
        if change.after == RunStatus.CANCELLED:
            said = ngettext("; step %(steps)s stopped", "; steps %(steps)s stopped", count)
        else:
            said = ngettext(
                "; step %(steps)s due again as a new attempt",
                "; steps %(steps)s due again as new attempts",
                count,
            )
        text += said % {"steps": names}
    return text + "."
