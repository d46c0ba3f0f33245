"""Admin for deliveries: every accepted webhook delivery (``TriggerEvent``), read-only.

The list filters by source, outcome and event and searches by delivery id; the outcome is
``TriggerEvent.objects.with_run_outcome()``'s — the status of the workflow run the delivery
started, or *no run* — followed by what the handler said, when it said something (a
``SendEvent`` handler says which run got the event, or that no run was waiting). A
delivery's page shows its payload (escaped; the first :data:`PAYLOAD_SHOWN` characters).
Refused deliveries are not kept: they are counted per source and reason, on the source's
page.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import AnnotationFilter, ModelAdminOf, ReadOnlyModelAdmin, ValueFilter
from django_leases.admin.display import cut_at_word, run_id_link, time_column
from django_leases.models import RunStatus, TriggerEvent
from django_leases.models.trigger import NO_RUN

#: Characters of what a handler said that the list shows.
HANDLER_SAID_SHOWN = 120

#: Characters of a payload a delivery's page shows.
PAYLOAD_SHOWN = 20_000


def outcomes() -> list[tuple[str, str]]:
    """The outcomes as the filter offers them and the list shows them, ``(value, label)`` in
    the active language: no run, or the run's status."""
    return [
        (NO_RUN, gettext("no run")),
        *(
            (status.value, gettext("run %(status)s") % {"status": str(status.label).lower()})
            for status in RunStatus
        ),
    ]


class _DistinctValueFilter(ValueFilter):
    """Filter on one column's values as the table holds them (sources, events)."""

    field = ""

    def values(self) -> list[str]:
        """The column's values in the table (at most 200, in order)."""
        values = (
            TriggerEvent.objects.order_by(self.field).values_list(self.field, flat=True).distinct()
        )
        return list(values[:200])

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class SourceFilter(_DistinctValueFilter):
    """Filter deliveries on the source they were sent to (``source_name``)."""

    title = _("source")
    parameter_name = "source"
    field = "source_name"


class EventFilter(_DistinctValueFilter):
    """Filter deliveries on their provider event name (``event``)."""

    title = _("event")
    parameter_name = "event"
    field = "event"


class OutcomeFilter(AnnotationFilter):
    """Filter on the ``outcome`` annotation (no run, or the run's status)."""

    title = _("outcome")
    parameter_name = "outcome"
    annotation = "run_outcome"

    def _options(self) -> list[tuple[str, str]]:
        return outcomes()


@admin.register(TriggerEvent)
class DeliveryAdmin(ReadOnlyModelAdmin, ModelAdminOf[TriggerEvent]):
    """Accepted deliveries, newest first; read-only."""

    list_display = ("received", "source_link", "event", "delivery_id", "outcome_shown", "run_link")
    list_display_links = ("received",)
    list_filter = (SourceFilter, OutcomeFilter, EventFilter)
    search_fields = ("=delivery_id",)
    ordering = ("-received_at", "-pk")
    actions = None
    list_select_related = ("run", "source")
    fields = (
        "received",
        "source_link",
        "event",
        "delivery_id",
        "outcome_shown",
        "run_link",
        "payload_json",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[TriggerEvent]:
        return TriggerEvent.objects.with_run_outcome().select_related("run", "source")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"title": gettext("Deliveries"), **(extra_context or {})}
        return super().changelist_view(request, context)

    #: When the delivery arrived (``received_at``), as local time text (``str``).
    received = time_column("received_at", _("received"), ordering="received_at")

    @admin.display(description=_("source"), ordering="source_name")
    def source_link(self, obj: TriggerEvent) -> str:
        """The source's name, linked to its page while it is declared."""
        source = obj.source
        if source is None:
            return obj.source_name
        model = "triggersource" if source.declared else "orphantriggersource"
        return format_html(
            '<a href="{}">{}</a>',
            reverse(f"admin:django_leases_{model}_change", args=[source.pk]),
            obj.source_name,
        )

    @admin.display(description=_("outcome"), ordering="run_outcome")
    def outcome_shown(self, obj: TriggerEvent) -> str:
        """The ``run_outcome`` annotation (no run, or the run's status) as an HTML badge, then
        what the handler said, if anything (``str``, safe HTML)."""
        outcome = str(getattr(obj, "run_outcome", NO_RUN))
        shown = format_html(
            '<span class="dl-outcome" data-outcome="{}">{}</span>',
            outcome,
            dict(outcomes()).get(outcome, outcome),
        )
        if obj.outcome:
            shown = format_html("{}<br>{}", shown, cut_at_word(obj.outcome, HANDLER_SAID_SHOWN))
        return shown

    @admin.display(description=_("workflow run"))
    def run_link(self, obj: TriggerEvent) -> str:
        """The run the delivery started, linked to its page: its id's first characters, the
        whole id in the tooltip (:func:`run_id_link`); ``"—"`` when none."""
        return run_id_link(obj.run_id)

    @admin.display(description=_("payload"))
    def payload_json(self, obj: TriggerEvent) -> str:
        """The stored payload as indented JSON in a ``<pre>``, cut after ``PAYLOAD_SHOWN``
        characters (saying how many more)."""
        text = json.dumps(obj.payload, ensure_ascii=False, indent=2, sort_keys=True)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(text) > PAYLOAD_SHOWN:
            more = len(text) - PAYLOAD_SHOWN
            said = ngettext("(%(count)d more character)", "(%(count)d more characters)", more) % {
                "count": more
            }
            text = f"{text[:PAYLOAD_SHOWN]}\n… {said}"
        return format_html('<pre class="dl-json" id="delivery-payload">{}</pre>', text)
