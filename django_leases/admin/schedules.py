"""Admin for workflow schedules: the list, with pause and resume (DESIGN §5b, §7).

Rows come from the declarations (``@workflow(..., schedule=...)`` and
``DJANGO_LEASES["SCHEDULES"]``), synced by the workflow workers and the
``workflow_schedules`` command; nothing is added or edited here. Each row shows its cron
expression and time zone, whether it is still declared, paused or active, its next and last
tick, the last tick's run (linked), its overlap policy and the last tick it skipped (when and
why). Its page also shows the task a task schedule enqueues, the tick waiting for the previous
run (``buffer_one``), how many ticks were skipped and its latest backfills
(``workflow_schedules backfill``). The actions **pause** and **resume** call
``WorkflowSchedule.objects.set_paused``; they need the ``django_leases.pause_workflowschedule``
permission and write a ``LogEntry`` per schedule changed. Resuming counts from the next tick
after now: ticks that passed while paused never run.

Stable hooks for browser tests: the state badges have ids ``schedule-state-<pk>`` and
``data-state`` (``active``, ``paused`` or ``undeclared``); the backfills table has the id
``schedule-backfills-<pk>``, one row per backfill with ``data-backfill`` (its id).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_leases.admin.base import ModelAdminOf, ReadOnlyModelAdmin
from django_leases.admin.display import badge, local_time, run_id_link, time_column
from django_leases.models import WorkflowSchedule
from django_leases.models.schedule import SKIP_REASON_LABELS

#: Backfills shown on a schedule's page, newest first.
BACKFILLS_SHOWN = 20

#: The permission the pause and resume actions need.
PAUSE_PERMISSION = "django_leases.pause_workflowschedule"

_STATE_COLOURS = {
    "active": ("#d1e7dd", "#0f5132"),
    "paused": ("#fff3cd", "#664d03"),
    "undeclared": ("#e0e0e0", "#333"),
}


#: The states' labels, as the badges say them.
STATE_LABELS = {
    "active": _("active"),
    "paused": _("paused"),
    "undeclared": _("undeclared"),
}


def state_of(schedule: WorkflowSchedule) -> str:
    """``"undeclared"`` (its declaration left the code), ``"paused"`` or ``"active"``."""
    if not schedule.declared:
        return "undeclared"
    return "paused" if schedule.paused else "active"


@admin.register(WorkflowSchedule)
class WorkflowScheduleAdmin(ReadOnlyModelAdmin, ModelAdminOf[WorkflowSchedule]):
    """Read-only list of schedules; pause and resume behind their permission."""

    list_display = (
        "name",
        "workflow",
        "cron_text",
        "state_and_overlap",
        "next",
        "last_and_run",
    )
    list_filter = ("paused", "declared", "overlap", "workflow")
    search_fields = ("name", "workflow")
    ordering = ("name",)
    actions = ("pause", "resume")
    fields = (
        "name",
        "workflow",
        "cron",
        "timezone",
        "task",
        "catch_up",
        "overlap",
        "input",
        "state_badge",
        "next",
        "last",
        "last_run_link",
        "buffered",
        "last_skipped",
        "skipped_ticks",
        "backfill_table",
        "created_at",
        "updated_at",
    )

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """Whether the user may pause and resume schedules (``pause_workflowschedule``)."""
        return request.user.has_perm(PAUSE_PERMISSION)

    @admin.display(description=_("cron"), ordering="cron")
    def cron_text(self, obj: WorkflowSchedule) -> str:
        """The cron expression as code on one line, its time zone under it (safe HTML): one
        column, so the list fits beside its filters at 1280 px with a zone such as
        ``America/Argentina/Buenos_Aires``."""
        return format_html(
            '<code style="white-space:nowrap">{}</code><br><span class="dl-zone">{}</span>',
            obj.cron,
            obj.timezone,
        )

    @admin.display(description=_("state"))
    def state_badge(self, obj: WorkflowSchedule) -> str:
        """The state (active / paused / undeclared) as a coloured badge (safe HTML): its label
        in the active language, the state itself in ``data-state``."""
        state = state_of(obj)
        background, colour = _STATE_COLOURS[state]
        return badge(
            f"schedule-state-{obj.pk}",
            "data-state",
            state,
            background,
            colour,
            label=str(STATE_LABELS[state]),
        )

    #: When the next run is due (``"—"``: the expression never matches again).
    next = time_column("next_tick", _("next tick"), ordering="next_tick")

    #: The last tick that started a run (``"—"``: none yet).
    last = time_column("last_tick", _("last tick"), ordering="last_tick")

    @admin.display(description=_("last tick · run"), ordering="last_tick")
    def last_and_run(self, obj: WorkflowSchedule) -> str:
        """The last tick, its run's short id under it, linked (safe HTML): one column, so the
        list fits beside its filters at 1280 px; the page shows each whole."""
        shown = self.last(obj)
        if obj.last_run_id is not None:
            shown = format_html("{}<br>{}", shown, self.last_run_link(obj))
        if obj.last_skipped_tick is not None:  # the last skipped tick too, under them
            shown = format_html("{}<br>{}: {}", shown, _("skipped"), self.last_skipped(obj))
        return shown

    @admin.display(description=_("state"), ordering="paused")
    def state_and_overlap(self, obj: WorkflowSchedule) -> str:
        """The state's badge (:meth:`state_badge`) with the overlap policy under it (safe
        HTML): one column, so the list fits beside its filters at 1280 px."""
        return format_html("{}<br>{}", self.state_badge(obj), obj.get_overlap_display())

    @admin.display(description=_("last run"))
    def last_run_link(self, obj: WorkflowSchedule) -> str:
        """The last tick's run, linked to its page: its id's first characters, the whole id in
        the tooltip (:func:`run_id_link`); ``"—"`` when none."""
        return run_id_link(obj.last_run_id)

    #: The tick waiting for the previous run to finish (``buffer_one``); ``"—"``: none.
    buffered = time_column("buffered_tick", _("buffered tick"))

    @admin.display(description=_("last skipped tick"), ordering="last_skipped_tick")
    def last_skipped(self, obj: WorkflowSchedule) -> str:
        """The last tick that started no run and why (safe HTML); ``"—"``: none yet."""
        if obj.last_skipped_tick is None:
            return "—"
        reason = SKIP_REASON_LABELS.get(obj.last_skip_reason, obj.last_skip_reason)
        return format_html(
            '<span id="schedule-skipped-{}" data-reason="{}">{} ({})</span>',
            obj.pk,
            obj.last_skip_reason,
            local_time(obj.last_skipped_tick),
            reason,
        )

    @admin.display(description=_("backfills"))
    def backfill_table(self, obj: WorkflowSchedule) -> str:
        """The schedule's latest backfills as a table (safe HTML): window, ticks, runs
        started, ticks that had a run, when, finished or not; ``"—"``: none."""
        backfills = list(obj.backfills.all()[:BACKFILLS_SHOWN])
        if not backfills:
            return "—"
        header = format_html(
            "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
            _("window"),
            _("ticks"),
            _("runs started"),
            _("ticks that had a run"),
            _("requested at"),
            _("finished at"),
        )
        rows = format_html_join(
            "",
            '<tr data-backfill="{}"><td>{} – {}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td></tr>",
            (
                (
                    b.pk,
                    local_time(b.start),
                    local_time(b.end),
                    b.ticks,
                    b.started,
                    b.existing,
                    local_time(b.created_at),
                    local_time(b.finished_at),
                )
                for b in backfills
            ),
        )
        return format_html('<table id="schedule-backfills-{}">{}{}</table>', obj.pk, header, rows)

    def _set_paused(
        self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule], paused: bool
    ) -> None:
        changed: list[str] = []
        unchanged: list[str] = []
        manager = WorkflowSchedule.objects.db_manager(queryset.db)
        for schedule in queryset.order_by("name"):
            if manager.set_paused(schedule.name, paused):
                changed.append(schedule.name)
                self.log_change(
                    request,
                    schedule,
                    "Paused" if paused else "Resumed (from the next tick after now)",
                )
            else:
                unchanged.append(schedule.name)
        if changed:
            if paused:
                done = ngettext(
                    "Paused %(count)d schedule: %(names)s.",
                    "Paused %(count)d schedules: %(names)s.",
                    len(changed),
                )
            else:
                done = ngettext(
                    "Resumed %(count)d schedule: %(names)s.",
                    "Resumed %(count)d schedules: %(names)s.",
                    len(changed),
                )
            self.message_user(
                request,
                done % {"count": len(changed), "names": ", ".join(changed)},
                messages.SUCCESS,
            )
        if unchanged:
            if paused:
                already = ngettext(
                    "%(count)d schedule was already paused, nothing changed: %(names)s.",
                    "%(count)d schedules were already paused, nothing changed: %(names)s.",
                    len(unchanged),
                )
            else:
                already = ngettext(
                    "%(count)d schedule was already active, nothing changed: %(names)s.",
                    "%(count)d schedules were already active, nothing changed: %(names)s.",
                    len(unchanged),
                )
            self.message_user(
                request,
                already % {"count": len(unchanged), "names": ", ".join(unchanged)},
                messages.WARNING,
            )

    @admin.action(description=_("Pause the selected schedules"), permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule]) -> None:
        """Pause each selected schedule (it starts no run); a ``LogEntry`` per change."""
        self._set_paused(request, queryset, True)

    @admin.action(description=_("Resume the selected schedules"), permissions=["pause"])
    def resume(self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule]) -> None:
        """Resume each selected schedule from its next tick after now; a ``LogEntry`` per
        change."""
        self._set_paused(request, queryset, False)
