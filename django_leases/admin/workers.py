"""Admin for workflow workers: a read-only list of the worker processes (DESIGN §7, §5).

Each ``run_workflow_worker`` process holds a heartbeat lease
(``workflow-worker:<host>:<pid>:<id>``, the id its own: two containers may share a hostname and
a pid) and keeps a ``WorkflowWorker`` row; this page lists them with what
``WorkflowWorker.objects.with_state()`` says, on the database clock: **live** (the heartbeat
lease is live), **stopped** (the worker said so at its exit) or **lapsed** (its lease expired
without a word: killed, frozen or cut off). Nothing can be added, changed or deleted here;
rows of workers long gone are deleted with ``WorkflowWorker.objects.forget_gone(seconds)``.

Stable hooks for browser tests: the state badges have ids ``worker-state-<pk>`` and
``data-state``.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import formats
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import ModelAdminOf, ReadOnlyModelAdmin, StateFilter
from django_leases.admin.display import badge, choice_label, local_time, time_column
from django_leases.models import WorkerState, WorkflowWorker

_STATE_COLOURS = {
    WorkerState.LIVE.value: ("#d1e7dd", "#0f5132"),
    WorkerState.STOPPED.value: ("#e0e0e0", "#333"),
    WorkerState.LAPSED.value: ("#f8d7da", "#842029"),
}


class WorkerStateFilter(StateFilter):
    """Filter on the ``state`` annotation (live / stopped / lapsed, on the DB clock)."""

    states = WorkerState


@admin.register(WorkflowWorker)
class WorkflowWorkerAdmin(ReadOnlyModelAdmin, ModelAdminOf[WorkflowWorker]):
    """Read-only list of worker processes and their heartbeat."""

    list_display = (
        "host",
        "pid",
        "state_badge",
        "queue_names",
        "work",
        "since",
        "last_heartbeat",
    )
    list_display_links = ("host",)
    list_filter = (WorkerStateFilter,)
    search_fields = ("host", "=pid")
    actions = None
    fields = (
        "lease_key",
        "host",
        "pid",
        "state_badge",
        "queue_names",
        "concurrency",
        "in_flight",
        "wakeup",
        "since",
        "last_heartbeat",
        "heartbeat_expires",
        "stopped",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowWorker]:
        return WorkflowWorker.objects.with_state()

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowWorker], search_term: str
    ) -> tuple[QuerySet[WorkflowWorker], bool]:
        # ``=pid`` on a non-number would be a database error on PostgreSQL: host only then.
        term = search_term.strip()
        if term and not term.isdigit():
            return queryset.filter(host__icontains=term), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, obj: WorkflowWorker) -> str:
        """The ``state`` annotation (live / lapsed / stopped) as a coloured badge (HTML ``str``):
        its label (``WorkerState``) shown, the state itself in ``data-state``."""
        state = str(getattr(obj, "state", ""))
        background, colour = _STATE_COLOURS.get(state, ("#eee", "#333"))
        label = choice_label(WorkerState, state)
        return badge(f"worker-state-{obj.pk}", "data-state", state, background, colour, label)

    @admin.display(description=_("queues"))
    def queue_names(self, obj: WorkflowWorker) -> str:
        """The queues the worker takes work from, comma-separated; ``"every queue"`` when
        unrestricted."""
        queues = [str(queue) for queue in (obj.queues or [])]
        return ", ".join(queues) if queues else gettext("every queue")

    @admin.display(description=_("in flight"), ordering="in_flight")
    def work(self, obj: WorkflowWorker) -> str:
        """Units of work in flight at the last heartbeat, of the worker's threads."""
        return gettext("%(in_flight)d of %(concurrency)d") % {
            "in_flight": obj.in_flight,
            "concurrency": obj.concurrency,
        }

    #: When the worker started (``started_at``), as local time text.
    since = time_column("started_at", _("since"), ordering="started_at")

    #: When the worker last beat (``beat_at``), as local time text.
    last_heartbeat = time_column("beat_at", _("last heartbeat"), ordering="beat_at")

    @admin.display(description=_("heartbeat lease"))
    def heartbeat_expires(self, obj: WorkflowWorker) -> str:
        """The heartbeat lease on the database clock: ``expires in N s`` (live), ``released``
        (stopped), ``lapsed <time>``; ``"—"`` without one."""
        expires = getattr(obj, "heartbeat_expires_at", None)
        db_now = getattr(obj, "db_now", None)
        if expires is None or db_now is None:
            return "—"
        state = getattr(obj, "state", None)
        if state == WorkerState.LIVE.value:
            seconds = formats.number_format((expires - db_now).total_seconds(), 0)
            return format_html(gettext("expires in {seconds} s"), seconds=seconds)
        if state == WorkerState.STOPPED.value:
            return gettext("released")
        return format_html(gettext("lapsed {time}"), time=local_time(expires))

    #: When the worker stopped (``stopped_at``), as local time text; empty while it runs.
    stopped = time_column("stopped_at", _("stopped at"))
