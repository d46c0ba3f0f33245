"""Admin for trigger sources: switch declared sources on and off, and the Orphans view.

Rows are written by code only (``reconcile_trigger_sources`` syncs the declarations; the
lifecycle records each provider step), so both lists are read-only. Operators with
``django_leases.toggle_triggersource`` get:

* on **Trigger sources** (declared rows): an on/off switch per row (a POST with the CSRF
  token to ``<id>/operate/enable|disable/``), the bulk actions *Enable* / *Disable*, and
  the same buttons on a source's page;
* on **Orphaned trigger sources**: *Forget* (delete the row, provider untouched) and *Tear
  down at provider* (offered when the provider is installed here and a registration is
  recorded), per row, in bulk and on the page.

Every one of them calls :mod:`django_leases.triggers.lifecycle` (the rules live there), then
writes a ``LogEntry`` and a message with the outcome. Without the permission nothing can be
switched, by button, URL or action (403 / the actions are not offered); as for Django's
own actions, an operate URL also needs the list's view permission (``view_triggersource``,
or ``view_orphantriggersource`` for the Orphans view) — a user missing either gets 403.
No secret is kept in a row, so none can be shown. A ``manual`` source's page also offers, to
the same operators, *Set the signing secret* (``<id>/secret/``): a password field whose value
is stored encrypted (``lifecycle.store_secret``, as ``trigger_sources set-secret`` does) and
never rendered back, with a ``LogEntry`` saying a secret was stored (not which).

Stable hooks for browser tests: the switch buttons have ids ``switch-<name>`` and the
labels *Turn on* / *Turn off*; the orphan buttons ``forget-<name>`` / ``teardown-<name>``;
the badges ``status-<name>`` with ``data-status``; a source page's operations live in
``#trigger-source-operations``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import (
    ModelAdminOf,
    ObjectOperations,
    ReadOnlyModelAdmin,
    object_page,
    page_url,
)
from django_leases.admin.display import cut_at_word, local_time, whole_run_id_link
from django_leases.admin.history import lifecycle_flag, lifecycle_message, log_change
from django_leases.exceptions import LeaseError, TriggerSourceError, UnknownTriggerSourceError
from django_leases.models import (
    OrphanTriggerSource,
    TriggerEvent,
    TriggerRefusal,
    TriggerSecret,
    TriggerSource,
)
from django_leases.triggers.registry import get_provider, may_be_registered, secret_set_by_hand
from django_leases.triggers.values import REFUSAL_REASONS, STATUS_LABELS

TOGGLE_PERMISSION = "django_leases.toggle_triggersource"

if TYPE_CHECKING:
    from django_leases.models.trigger import TriggerSourceQuerySet
    from django_leases.triggers.lifecycle import LifecycleResult


#: How many deliveries a source's page lists.
RECENT_EVENTS = 20
#: Characters of a source's detail its list shows (whole words, then "…"; the page shows all).
DETAIL_SHOWN = 100

_BADGE_COLOURS = {
    "off": ("#e0e0e0", "#333"),
    "pending": ("#fff3cd", "#664d03"),
    "registered": ("#d1e7dd", "#0f5132"),
    "manual": ("#cfe2ff", "#084298"),
    "failed": ("#f8d7da", "#842029"),
}

_FIELDS = (
    "name",
    "kind",
    "provider",
    "config",
    "declared",
    "enabled",
    "status_badge",
    "detail",
    "receive_address",
    "signing_secret",
    "sender_headers",
    "state",
    "base_url",
    "label_prefix",
    "updated_at",
    "recent_events",
    "refusals",
)


def shown_status(source: TriggerSource) -> str:
    """The status an operator sees: the recorded one, or ``off`` for a row never set up."""
    return source.status or "off"


class SourceStatusFilter(admin.SimpleListFilter):
    """Filter sources on their status as an operator sees it (:func:`shown_status`: a row
    never set up is ``off``), the options labelled in the active language."""

    title = _("status")
    parameter_name = "status"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        """Every status (``STATUS_LABELS``), labelled."""
        return [(status, str(label)) for status, label in STATUS_LABELS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Only sources in the chosen status (all for no or an unknown choice)."""
        value = self.value()
        if value == "off":
            return queryset.filter(Q(status="off") | Q(status__isnull=True))
        if value in STATUS_LABELS:
            return queryset.filter(status=value)
        return queryset


class _TriggerSourceAdminBase(ReadOnlyModelAdmin, ObjectOperations, ModelAdminOf[TriggerSource]):
    """Read-only lists and pages; the operations are POST views and actions over the lifecycle."""

    readonly_fields = _FIELDS
    fields = _FIELDS
    search_fields = ("name",)
    change_form_template = "admin/django_leases/triggersource/change_form.html"

    #: Operations this admin offers: URL segment → (the name of the function of
    #: :mod:`django_leases.triggers.lifecycle` that runs it, past tense for logs). Names, not
    #: the functions: the admin registers as Django starts, the lifecycle loads when an
    #: operation runs or a list first shows a receive address.
    operations: ClassVar[dict[str, tuple[str, str]]] = {}
    missing_message = _("No such trigger source (%(id)r).")
    #: A lifecycle operation holds the source's lease and calls its provider: no request
    #: transaction around it.
    operate_outside_transaction = True
    #: The rows it lists: declared sources, or orphans.
    declared: bool = True
    list_display: tuple[str, ...] = ("__str__",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TriggerSource]:
        rows = super().get_queryset(request).filter(declared=self.declared)
        return cast("TriggerSourceQuerySet", rows).with_refused()

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if self.has_operate_permission(request):
            return self.list_display
        return self.read_only_columns()

    def read_only_columns(self) -> tuple[str, ...]:
        """The list's columns for a user without ``toggle_triggersource``: no buttons."""
        return self.list_display

    # -- permissions ----------------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Whether the user may switch, tear down and forget sources (``toggle_triggersource``)."""
        return bool(request.user.has_perm(TOGGLE_PERMISSION))

    def get_fields(self, request: HttpRequest, obj: TriggerSource | None = None) -> Sequence[str]:  # type: ignore[override]  # Django's stubs: a wider union
        """The page's fields; *sender headers* only for a source registered by hand (the
        ``manual`` provider): GitHub and Stripe send theirs themselves."""
        fields = list(_FIELDS)
        if obj is None or obj.provider != "manual":
            fields.remove("sender_headers")
        return fields

    # -- columns and fields ---------------------------------------------------------------

    @admin.display(description=_("signing secret"))
    def signing_secret(self, obj: TriggerSource) -> str:
        """Whether deliveries can be checked: where the secret comes from, never the secret."""
        origin = TriggerSecret.objects.secret_origin(obj.name)
        if origin == "settings":
            return gettext("set in DJANGO_LEASES['WEBHOOK_SECRETS'] (it wins over a stored one)")
        if origin == "stored":
            return gettext("stored (encrypted, in the credential store)")
        remedy: str
        if secret_set_by_hand(obj.provider):
            remedy = format_html("<code>manage.py trigger_sources set-secret {}</code>", obj.name)
        else:
            remedy = gettext("turn the source on: its setup stores the secret the provider chooses")
        return format_html(
            gettext(
                '<strong id="no-secret-{name}">none stored</strong>: deliveries are refused '
                "(401) until one is: {command}"
            ),
            name=obj.name,
            command=remedy,
        )

    @admin.display(description=_("the sender must send"))
    def sender_headers(self, obj: TriggerSource) -> str:
        """The headers a sender registered by hand must send (the provider's list)."""
        provider = get_provider(obj.provider)
        if provider is None:
            return gettext("— (the provider is not installed here)")
        headers = provider.for_config(obj.config or {}).sender_headers
        if not headers:
            return "—"
        rows = format_html_join(
            "", '<tr><td class="dl-name"><code>{}</code></td><td>{}</td></tr>', headers
        )
        return format_html(
            '<table class="dl-table" id="sender-headers"><thead><tr><th>{}</th>'
            "<th>{}</th></tr></thead><tbody>{}</tbody></table><p>{}</p>",
            gettext("header"),
            gettext("holds"),
            rows,
            gettext("POST to the address above; the body is what is signed, byte for byte."),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: TriggerSource) -> str:
        """The status (:func:`shown_status`) as a coloured badge (safe HTML): its label in the
        active language, the status itself in ``data-status``."""
        status = shown_status(obj)
        background, colour = _BADGE_COLOURS.get(status, ("#eee", "#333"))
        return format_html(
            '<span class="dl-status" id="status-{}" data-status="{}" style="background:{};'
            'color:{};padding:1px 8px;border-radius:8px;font-weight:600">{}</span>',
            obj.name,
            status,
            background,
            colour,
            STATUS_LABELS.get(status, status),
        )

    @admin.display(description=_("detail"))
    def short_detail(self, obj: TriggerSource) -> str:
        return cut_at_word(obj.detail or "", DETAIL_SHOWN)

    @admin.display(description=_("receives at"))
    def receive_address(self, obj: TriggerSource) -> str:
        # deferred: start-up cost. The admin registers as Django starts; the lifecycle
        # (leases, the providers' set-up) loads when a list first shows an address.
        from django_leases.triggers import lifecycle

        missing = lifecycle.missing_url(obj)
        if missing == "no_route":
            return gettext(
                "— (django_leases.urls is not in the URLconf: add "
                "path('', include('django_leases.urls')))"
            )
        if missing:
            return gettext("— (no address yet: run reconcile_trigger_sources --base-url)")
        return lifecycle.receive_url(obj)

    @admin.display(description=_("refused"), ordering="refused")
    def refused_count(self, obj: TriggerSource) -> str:
        """Deliveries refused so far, all reasons (the page has them by reason)."""
        count = int(getattr(obj, "refused", 0) or 0)
        if not count:
            return "0"
        return format_html('<span class="dl-refused" data-refused="{}">{}</span>', count, count)

    @admin.display(description=_("refused deliveries"))
    def refusals(self, obj: TriggerSource) -> str:
        """The source's refused-delivery tallies by reason (``TriggerRefusal.objects``):
        counts only — nothing of a refused request is kept."""
        tallies = TriggerRefusal.objects.by_source([obj.name]).get(obj.name, {})
        if not tallies:
            return gettext("None.")
        rows = format_html_join(
            "",
            '<tr id="refused-{}"><td class="dl-name"><code>{}</code></td><td>{}</td>'
            '<td class="dl-count">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reason,
                    reason,
                    REFUSAL_REASONS.get(reason, (0, ""))[1],
                    tally.count,
                    tally.last_status,
                    local_time(tally.first_refused_at),
                    local_time(tally.last_refused_at),
                )
                for reason, tally in sorted(tallies.items())
            ),
        )
        return format_html(
            '<table class="dl-table" id="refusals"><thead><tr><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            gettext("reason"),
            gettext("meaning"),
            gettext("count"),
            gettext("last answer"),
            gettext("first"),
            gettext("last"),
            rows,
        )

    @admin.display(description=_("recent deliveries"))
    def recent_events(self, obj: TriggerSource) -> str:
        events = list(
            TriggerEvent.objects.filter(source_name=obj.name).order_by("-received_at", "-pk")[
                :RECENT_EVENTS
            ]
        )
        every = format_html(
            '<p><a href="{}?{}" id="all-deliveries">{}</a></p>',
            reverse("admin:django_leases_triggerevent_changelist"),
            urlencode({"source": obj.name}),
            gettext("All deliveries to %(name)s") % {"name": obj.name},
        )
        if not events:
            return format_html("{}{}", gettext("None yet."), every)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    local_time(event.received_at),
                    event.event,
                    event.delivery_id,
                    whole_run_id_link(event.run_id),
                    event.outcome or "—",
                )
                for event in events
            ),
        )
        return format_html(
            '<table class="dl-recent-events dl-table" id="recent-events"><thead><tr>'
            "<th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            gettext("received"),
            gettext("event"),
            gettext("delivery"),
            gettext("workflow run"),
            gettext("outcome"),
            rows,
            every,
        )

    # -- operations -----------------------------------------------------------------------

    def run_operation(
        self, request: HttpRequest, obj: TriggerSource, operation: str
    ) -> HttpResponse:
        """Run one lifecycle operation on one source (:meth:`_operate`), then go back to the
        list, or to ``next`` (one of ours) while the source is still listed."""
        self._operate(request, [obj], operation)
        back = request.POST.get("next", "")
        still_there = self.get_queryset(request).filter(pk=obj.pk).exists()
        if still_there and back.startswith(reverse("admin:index")) and "//" not in back:
            return HttpResponseRedirect(back)
        return HttpResponseRedirect(page_url(self, "changelist"))

    def _operate(
        self, request: HttpRequest, sources: Iterable[TriggerSource], operation: str
    ) -> None:
        """Run ``operation`` on each source through the lifecycle; log and report each."""
        # deferred: start-up cost, as in receive_address: loaded by the first operation
        from django_leases.triggers import lifecycle

        run: Callable[[str], LifecycleResult] = getattr(lifecycle, self.operations[operation][0])
        for source in sources:
            try:
                result = run(source.name)
            except (TriggerSourceError, UnknownTriggerSourceError, LeaseError, RuntimeError) as exc:
                # RuntimeError: inside a transaction (ATOMIC_REQUESTS), so no lease.
                said = gettext("%(name)s: nothing changed: %(error)s")
                self.message_user(
                    request, said % {"name": source.name, "error": exc}, messages.ERROR
                )
                continue
            self._log(request, source, operation, result)
            level = messages.SUCCESS if result.ok else messages.ERROR
            # The detail is the provider's or the lifecycle's record, kept as it was written.
            said = gettext("%(operation)s %(name)s: %(detail)s")
            self.message_user(
                request,
                said
                % {"operation": _VERBS[operation], "name": result.name, "detail": result.detail},
                level,
            )

    def _log(
        self,
        request: HttpRequest,
        source: TriggerSource,
        operation: str,
        result: LifecycleResult,
    ) -> None:
        log_change(
            source,
            lifecycle_message(operation, result),
            flag=lifecycle_flag(result),
            user_id=request.user.pk,
        )

    def operator_context(self, source: TriggerSource) -> dict[str, Any]:
        """What ``source``'s page adds to its template context for a user with
        ``toggle_triggersource``: the buttons of :meth:`page_operations`
        (``trigger_operations``)."""
        return {
            "trigger_operations": [
                {
                    "name": name,
                    "label": label,
                    "url": self.operate_url(source, name),
                    "id": f"{name}-{source.name}",
                }
                for name, label in self.page_operations(source)
            ]
        }

    def page_operations(self, source: TriggerSource) -> list[tuple[str, str]]:
        """(operation, button label) offered on ``source``'s page."""
        return []


_VERBS = {
    "enable": _("Enable:"),
    "disable": _("Disable:"),
    "teardown": _("Tear down:"),
    "forget": _("Forget:"),
}


class SigningSecretForm(forms.Form):
    """A source's signing secret, typed by an operator: a password field that is never filled
    in when the form is shown again."""

    secret = forms.CharField(
        label=_("signing secret"),
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        max_length=4096,
        strip=False,  # as typed, spaces too: as trigger_sources set-secret stores it
        help_text=_(
            "The secret you chose at the sender (or it showed you). It is stored encrypted and "
            "never shown again; storing one replaces the stored one."
        ),
    )


@admin.register(TriggerSource)
class TriggerSourceAdmin(_TriggerSourceAdminBase):
    """Declared trigger sources: a switch per row and bulk enable / disable."""

    list_display: tuple[str, ...] = (
        "name",
        "switch",
        "provider",
        "receive_address",
        "short_detail",
        "refused_count",
    )
    list_filter = ("enabled", "provider", SourceStatusFilter)
    actions = ("enable_sources", "disable_sources")
    operations = {
        "enable": ("enable", "Enabled"),
        "disable": ("disable", "Disabled"),
    }

    def read_only_columns(self) -> tuple[str, ...]:
        """The list's columns without the switch: the ``enabled`` flag and the status badge
        in its place."""
        shown: list[str] = []
        for column in self.list_display:
            shown.extend(("enabled", "status_badge") if column == "switch" else (column,))
        return tuple(shown)

    @admin.display(description=_("status · on / off"), ordering="enabled")
    def switch(self, obj: TriggerSource) -> str:
        """The row's status badge over its switch: a submit button posting the changelist
        form (with its CSRF token) to this source's enable / disable view (``formaction``),
        so no nested form."""
        operation = "disable" if obj.enabled else "enable"
        label = gettext("Turn off") if obj.enabled else gettext("Turn on")
        return format_html(
            '<span class="dl-onoff" data-enabled="{}">{}</span>'
            '<button type="submit" class="button dl-switch" id="switch-{}" name="switch" '
            'value="{}" formaction="{}" formmethod="post" title="{} {}">{}</button>',
            "true" if obj.enabled else "false",
            self.status_badge(obj),
            obj.name,
            operation,
            self.operate_url(obj, operation),
            label,
            obj.name,
            label,
        )

    def get_urls(self) -> list[URLPattern]:
        """The secret form's URL (``<id>/secret/``), then the operations' and Django's."""
        view = self.admin_site.admin_view(self.secret_view)
        return [object_page(self, "secret/", view, "secret"), *super().get_urls()]

    def secret_url(self, obj: TriggerSource) -> str:
        """The URL of ``obj``'s *Set the signing secret* form."""
        return page_url(self, "secret", obj.pk)

    def secret_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """``<id>/secret/``: a source's signing secret, set by an operator (view and toggle
        permissions), where :func:`~django_leases.triggers.registry.secret_set_by_hand` allows
        it (``manual`` and GitHub sources, not Stripe's). GET shows an empty password field —
        a stored secret is never rendered — and POST stores the one typed, encrypted, with a
        ``LogEntry``."""
        self.check_operator(request)
        source = self.get_object(request, object_id)
        if source is None or not secret_set_by_hand(source.provider):
            raise PermissionDenied
        page = page_url(self, "change", source.pk)
        form = SigningSecretForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            # deferred: start-up cost (the lifecycle loads at the first operation).
            from django_leases.triggers import lifecycle

            try:
                lifecycle.store_secret(
                    source.name, form.cleaned_data["secret"], using=source._state.db
                )
            except ValueError as exc:  # its message never quotes the secret
                form.add_error("secret", str(exc))
            else:
                log_change(source, "Stored a new signing secret", user_id=request.user.pk)
                self.message_user(
                    request,
                    gettext("Stored the signing secret of %(name)s (encrypted).")
                    % {"name": source.name},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(page)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Set the signing secret of %(name)s") % {"name": source.name},
            "opts": self.model._meta,
            "source": source,
            "form": form,
            "origin": TriggerSecret.objects.secret_origin(source.name),
            "source_url": page,
        }
        return TemplateResponse(
            request, "admin/django_leases/triggersource/secret_form.html", context
        )

    def operator_context(self, source: TriggerSource) -> dict[str, Any]:
        """The operations' buttons; the page of a source whose secret an operator may set
        (:func:`~django_leases.triggers.registry.secret_set_by_hand`) also offers its secret
        form (``secret_form_url``)."""
        context = super().operator_context(source)
        if secret_set_by_hand(source.provider):
            context["secret_form_url"] = self.secret_url(source)
        return context

    def page_operations(self, source: TriggerSource) -> list[tuple[str, str]]:
        """``(operation, button label)`` offered on a declared source's page: turn off when it is
        on, else turn on."""
        if source.enabled:
            return [("disable", gettext("Turn off"))]
        return [("enable", gettext("Turn on"))]

    @admin.action(description=_("Enable the selected trigger sources"), permissions=["operate"])
    def enable_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Turn each selected source on and set it up at its provider (``lifecycle.enable``)."""
        self._operate(request, queryset.order_by("name"), "enable")

    @admin.action(description=_("Disable the selected trigger sources"), permissions=["operate"])
    def disable_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Turn each selected source off, then tear it down (``lifecycle.disable``)."""
        self._operate(request, queryset.order_by("name"), "disable")


@admin.register(OrphanTriggerSource)
class OrphanTriggerSourceAdmin(_TriggerSourceAdminBase):
    """Rows whose declaration left the code: forget them, or tear them down at the provider."""

    list_display: tuple[str, ...] = (
        "name",
        "orphan_operations",
        "status_badge",
        "provider",
        "state",
        "short_detail",
    )
    list_filter = ("enabled", "provider")
    actions = ("forget_sources", "teardown_sources")
    operations = {
        "forget": ("forget", "Forgot"),
        "teardown": ("teardown", "Tore down"),
    }

    declared = False

    def read_only_columns(self) -> tuple[str, ...]:
        """The list's columns without the forget / tear-down buttons."""
        return tuple(column for column in self.list_display if column != "orphan_operations")

    @staticmethod
    def can_tear_down(source: TriggerSource) -> bool:
        """Whether a teardown at the provider may find something to drop
        (:func:`~django_leases.triggers.registry.may_be_registered`)."""
        return may_be_registered(source)

    @admin.display(description=_("operations"))
    def orphan_operations(self, obj: TriggerSource) -> str:
        """The list column's buttons for an orphan (HTML ``str``): forget, and tear down at the
        provider when a teardown may find something there (:meth:`can_tear_down`)."""
        buttons = [
            format_html(
                '<button type="submit" class="button dl-forget" id="forget-{}" '
                'name="operation" value="forget" formaction="{}" formmethod="post" '
                'title="{}">{}</button>',
                obj.name,
                self.operate_url(obj, "forget"),
                gettext("Forget %(name)s") % {"name": obj.name},
                gettext("Forget"),
            )
        ]
        if self.can_tear_down(obj):
            buttons.append(
                format_html(
                    '<button type="submit" class="button dl-teardown" id="teardown-{}" '
                    'name="operation" value="teardown" formaction="{}" formmethod="post" '
                    'title="{}">{}</button>',
                    obj.name,
                    self.operate_url(obj, "teardown"),
                    gettext("Tear down %(name)s at %(provider)s")
                    % {"name": obj.name, "provider": obj.provider},
                    gettext("Tear down at provider"),
                )
            )
        return format_html_join(" ", "{}", ((button,) for button in buttons))

    def page_operations(self, source: TriggerSource) -> list[tuple[str, str]]:
        """``(operation, button label)`` offered on an orphan's page: forget, and tear down when
        :meth:`can_tear_down`."""
        offered = [("forget", gettext("Forget"))]
        if self.can_tear_down(source):
            offered.append(("teardown", gettext("Tear down at provider")))
        return offered

    def _operate(
        self, request: HttpRequest, sources: Iterable[TriggerSource], operation: str
    ) -> None:
        if operation == "teardown":
            able = []
            for source in sources:
                if self.can_tear_down(source):
                    able.append(source)
                else:
                    said = gettext(
                        "%(name)s: not torn down: its provider %(provider)r is not installed "
                        "here or nothing is registered; forget it instead."
                    )
                    self.message_user(
                        request,
                        said % {"name": source.name, "provider": source.provider},
                        messages.WARNING,
                    )
            sources = able
        super()._operate(request, sources, operation)

    @admin.action(description=_("Forget the selected orphans"), permissions=["operate"])
    def forget_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Delete each selected orphan's row, provider untouched (``lifecycle.forget``)."""
        self._operate(request, queryset.order_by("name"), "forget")

    @admin.action(
        description=_("Tear down the selected orphans at their provider"),
        permissions=["operate"],
    )
    def teardown_sources(self, request: HttpRequest, queryset: QuerySet[TriggerSource]) -> None:
        """Tear each selected orphan down at its provider and delete it (``lifecycle.teardown``)."""
        self._operate(request, queryset.order_by("name"), "teardown")
