"""Admin for leases: a read-only list with each lease's state, and "force release" (DESIGN §7).

State (live / lapsed / released) and time left are computed by the database, on its clock
(``Lease.objects.with_state()``). Nothing can be added, edited or deleted here; the one
write is the "force release" action, offered only to users with the
``django_leases.force_release_lease`` permission.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import formats
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import ModelAdminOf, ReadOnlyModelAdmin, StateFilter
from django_leases.admin.display import choice_label, listed, local_time
from django_leases.models import Lease, LeaseState
from django_leases.models.lease import RETURNED_COLUMNS

FORCE_RELEASE_PERMISSION = "django_leases.force_release_lease"


class LeaseStateFilter(StateFilter):
    """Filter on the ``state`` annotation (live / lapsed / released, on the DB clock)."""

    states = LeaseState


@admin.register(Lease)
class LeaseAdmin(ReadOnlyModelAdmin, ModelAdminOf[Lease]):
    """Read-only list of leases; "force release" behind its own permission."""

    list_display = (
        "key",
        "state_display",
        "holder",
        "token",
        "time_left",
        "expiry",
    )
    list_filter = (LeaseStateFilter,)
    search_fields = ("key",)
    ordering = ("key",)
    actions = ("force_release",)
    readonly_fields = RETURNED_COLUMNS[1:]  # every column but the id

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        return Lease.objects.with_state()

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        """Whether the user may force-release leases (``force_release_lease``)."""
        return request.user.has_perm(FORCE_RELEASE_PERMISSION)

    @admin.display(description=_("state"), ordering="state")
    def state_display(self, obj: Lease) -> str:
        """The ``state`` annotation (live / lapsed / released) as its label in the active
        language (``str``)."""
        return choice_label(LeaseState, str(getattr(obj, "state", "")))

    @admin.display(description=_("expires / released"), ordering="expires_at")
    def expiry(self, obj: Lease) -> str:
        """When a released lease was released, else when it expires (or expired); the page
        shows every time."""
        if obj.released_at is not None:
            return format_html(gettext("released {time}"), time=local_time(obj.released_at))
        if getattr(obj, "state", None) == LeaseState.LAPSED:
            return format_html(gettext("expired {time}"), time=local_time(obj.expires_at))
        return format_html(gettext("expires {time}"), time=local_time(obj.expires_at))

    @admin.display(description=_("time left"))
    def time_left(self, obj: Lease) -> str:
        """Seconds left on the database clock for a live lease (``"12.3 s"``, the number in
        the active language's format); ``"—"`` otherwise."""
        if getattr(obj, "state", None) != LeaseState.LIVE:
            return "—"
        db_now = getattr(obj, "db_now", None)
        if db_now is None:
            return "—"
        seconds = formats.number_format(obj.seconds_left(db_now), 1)
        return gettext("%(seconds)s s") % {"seconds": seconds}

    @admin.action(description=_("Force release the selected leases"), permissions=["force_release"])
    def force_release(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        """Release each selected live lease, whoever holds it; a ``LogEntry`` per lease.

        The token keeps rising for the next holder and the ex-holder's next renewal or
        fenced write fails. Leases that were not live are reported and left alone.
        """
        released: list[str] = []
        not_live: list[str] = []
        for lease in queryset.order_by("key"):
            if Lease.objects.force_release(lease.key):
                released.append(lease.key)
                note = f"Force-released (token {lease.token}, holder {lease.holder})"
            else:
                not_live.append(lease.key)
                note = "Force release asked; the lease was not live, nothing changed"
            self.log_change(request, lease, note)
        if released:
            self.message_user(
                request,
                ngettext(
                    "Force-released %(count)d lease: %(keys)s.",
                    "Force-released %(count)d leases: %(keys)s.",
                    len(released),
                )
                % {"count": len(released), "keys": listed(released)},
                messages.SUCCESS,
            )
        if not_live:
            self.message_user(
                request,
                ngettext(
                    "%(count)d lease was not live, nothing changed: %(keys)s.",
                    "%(count)d leases were not live, nothing changed: %(keys)s.",
                    len(not_live),
                )
                % {"count": len(not_live), "keys": listed(not_live)},
                messages.WARNING,
            )
