"""Admin for trigger sources: enable / disable declared sources, and the Orphans view.

Rows are written by code only (``reconcile_trigger_sources`` syncs the declarations), so
both lists are read-only. Operators with ``django_leases.toggle_triggersource`` get the
enable / disable actions, which call ``TriggerSource.objects.set_enabled`` and write a
``LogEntry`` per change. No secret is stored in a row, so none can be shown.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from django_leases.models import OrphanTriggerSource, TriggerSource

TOGGLE_PERMISSION = "django_leases.toggle_triggersource"

_FIELDS = (
    "name",
    "kind",
    "provider",
    "config",
    "declared",
    "enabled",
    "status",
    "detail",
    "state",
    "base_url",
    "label_prefix",
    "updated_at",
)


class _ReadOnlyAdmin(admin.ModelAdmin):
    readonly_fields = _FIELDS
    fields = _FIELDS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TriggerSource | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TriggerSource | None = None) -> bool:
        return False


@admin.register(TriggerSource)
class TriggerSourceAdmin(_ReadOnlyAdmin):
    """Declared trigger sources, with enable / disable actions behind a permission."""

    list_display = ("name", "enabled", "status", "provider", "short_detail", "updated_at")
    list_filter = ("enabled", "provider", "status")
    search_fields = ("name",)
    actions = ("enable_sources", "disable_sources")

    def get_queryset(self, request: HttpRequest) -> QuerySet[TriggerSource]:
        return TriggerSource.objects.declared()

    def has_toggle_permission(self, request: HttpRequest) -> bool:
        """Whether the user may enable and disable sources (``toggle_triggersource``)."""
        return request.user.has_perm(TOGGLE_PERMISSION)

    @admin.display(description="detail")
    def short_detail(self, obj: TriggerSource) -> str:
        detail = obj.detail or ""
        return detail if len(detail) <= 80 else detail[:79] + "…"

    def _toggle(
        self, request: HttpRequest, queryset: QuerySet[TriggerSource], enabled: bool
    ) -> None:
        word = "Enabled" if enabled else "Disabled"
        changed: list[str] = []
        unchanged: list[str] = []
        for source in queryset.order_by("name"):
            if TriggerSource.objects.set_enabled(source.name, enabled):
                changed.append(source.name)
                self.log_change(request, source, f"{word} the trigger source")
            else:
                unchanged.append(source.name)
        if changed:
            self.message_user(
                request,
                f"{word} {len(changed)} trigger source(s): {', '.join(changed)}.",
                messages.SUCCESS,
            )
        if unchanged:
            self.message_user(
                request,
                f"Already {word.lower()}, nothing changed: {', '.join(unchanged)}.",
                messages.INFO,
            )

    @admin.action(description="Enable the selected trigger sources", permissions=["toggle"])
    def enable_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Turn the selected sources on: they receive deliveries from the next request."""
        self._toggle(request, queryset, True)

    @admin.action(description="Disable the selected trigger sources", permissions=["toggle"])
    def disable_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Turn the selected sources off: their deliveries get 404 from the next request."""
        self._toggle(request, queryset, False)


@admin.register(OrphanTriggerSource)
class OrphanTriggerSourceAdmin(_ReadOnlyAdmin):
    """Rows whose declaration left the code. A list only, for now."""

    list_display = ("name", "enabled", "status", "provider", "detail", "updated_at")
    list_filter = ("provider",)
    search_fields = ("name",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[OrphanTriggerSource]:
        return OrphanTriggerSource.objects.filter(declared=False)
