"""What several django-leases admin pages share: read-only lists, annotation filters, the
names of the pages the admin classes add, and the operations an object's page offers."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, SuspiciousOperation, ValidationError
from django.db import connections, models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.display import MEDIA_CSS


def url_name(model_admin: admin.ModelAdmin[Any], page: str) -> str:
    """The URL name of ``model_admin``'s ``page``, as Django's admin names its own
    (``change``, ``changelist``) and so ours (``operate``, ``secret``): ``<app>_<model>_<page>``,
    e.g. ``django_leases_triggersource_operate``."""
    opts = model_admin.model._meta
    return f"{opts.app_label}_{opts.model_name}_{page}"


def page_url(model_admin: admin.ModelAdmin[Any], page: str, *args: Any) -> str:
    """The URL of ``model_admin``'s ``page`` (:func:`url_name`) for ``args`` (``str``)."""
    return reverse(f"admin:{url_name(model_admin, page)}", args=args)


def object_page(
    model_admin: admin.ModelAdmin[Any],
    route: str,
    view: Callable[..., HttpResponse],
    page: str,
) -> URLPattern:
    """The pattern of one object's extra ``page`` of ``model_admin``:
    ``<path:object_id>/<route>`` served by ``view``, named by :func:`url_name`. ``get_urls``
    puts it before Django's patterns, whose ``<path:object_id>/`` would match it too."""
    return path(f"<path:object_id>/{route}", view, name=url_name(model_admin, page))


_View = TypeVar("_View", bound=Callable[..., Any])


def _outside_request_transactions(view: _View) -> _View:
    """``view`` marked to run outside ``ATOMIC_REQUESTS``'s transaction on every database
    (Django's ``non_atomic_requests``, once per alias): a lifecycle operation holds a lease,
    which cannot be held inside a transaction."""
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


class _Untyped:
    """``name[...]`` at run time: ``base``, whatever the parameters (Django's admin classes
    take no type parameter at run time; django-stubs types them by model)."""

    def __init__(self, base: type) -> None:
        self.base = base

    def __getitem__(self, _parameters: object) -> type:
        return self.base


if TYPE_CHECKING:
    from django.utils.functional import _StrPromise

    ModelAdminOf = admin.ModelAdmin
    TabularInlineOf = admin.TabularInline
    AdminMixinOf = admin.ModelAdmin
else:
    #: ``ModelAdminOf[Model]``: Django's ``ModelAdmin``, typed for ``Model``.
    ModelAdminOf = _Untyped(admin.ModelAdmin)
    #: ``TabularInlineOf[Model, Parent]``: Django's ``TabularInline``, typed.
    TabularInlineOf = _Untyped(admin.TabularInline)
    #: ``AdminMixinOf[Model]``: the base of a mixin of a ``ModelAdmin`` of ``Model``: typed
    #: as one, a plain ``object`` at run time.
    AdminMixinOf = _Untyped(object)


class ObjectOperations(AdminMixinOf[Any]):
    """Mixin for a ``ModelAdmin`` whose objects' pages offer operations, with the rule of who
    may run them in one place:

    * ``<id>/operate/<operation>/`` (a POST; another method is 405) runs one of
      :attr:`operations` through :meth:`run_operation`, whose response it returns;
    * a user needs the list's view permission *and* :meth:`has_operate_permission` (else
      403), checked before the object is looked up, as for Django's own actions, so that an
      id's existence is not revealed either; an unknown operation is 403, an unknown object
      an error message (:attr:`missing_message`) and the list;
    * for such a user, the object's page has :meth:`operator_context` in its template
      context.
    """

    #: The ``<operation>`` segments the operate URL takes.
    operations: ClassVar[Collection[str]] = ()
    #: The error message for an object that is not there (``%(id)r``: the id asked for).
    missing_message: ClassVar[str | _StrPromise] = _("No such object (%(id)r).")
    #: Whether operations run outside the request's transaction (``ATOMIC_REQUESTS``): for
    #: those that take a lease or call a provider, which a transaction would hold open.
    operate_outside_transaction: ClassVar[bool] = False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Whether the user may run this admin's operations (``bool``)."""
        raise NotImplementedError

    def check_operator(self, request: HttpRequest) -> None:
        """Raise ``PermissionDenied`` unless the user may view the list and operate."""
        if not (self.has_view_permission(request) and self.has_operate_permission(request)):
            raise PermissionDenied

    def run_operation(self, request: HttpRequest, obj: Any, operation: str) -> HttpResponse:
        """Run ``operation`` (one of :attr:`operations`) on ``obj`` for a user allowed
        to; say how it went (messages, ``LogEntry``) and return where to go next."""
        raise NotImplementedError

    def operator_context(self, obj: Any) -> dict[str, Any]:
        """What ``obj``'s page adds to its template context for a user allowed to operate
        (``dict``; none here)."""
        return {}

    def operate_url(self, obj: Any, operation: str) -> str:
        """The URL that runs ``operation`` on ``obj`` (``str``; POST only)."""
        return page_url(self, "operate", obj.pk, operation)

    def get_urls(self) -> list[URLPattern]:
        """The operate URL (``<id>/operate/<operation>/``), then the others (``URLPattern``).
        With :attr:`operate_outside_transaction`, the operate URL and the list's (where the
        bulk actions run) are left out of ``ATOMIC_REQUESTS`` on every database."""
        view = self.admin_site.admin_view(self.operate_view)
        urls = super().get_urls()
        if self.operate_outside_transaction:
            view = _outside_request_transactions(view)
            for url in urls:
                if url.name is not None and url.name.endswith("_changelist"):
                    url.callback = _outside_request_transactions(url.callback)
        return [object_page(self, "operate/<str:operation>/", view, "operate"), *urls]

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """POST ``<id>/operate/<operation>/``: :meth:`run_operation` for a user allowed to."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        self.check_operator(request)
        if operation not in self.operations:
            raise PermissionDenied  # no such operation: nothing to offer
        obj = self.get_object(request, object_id)
        if obj is None:
            shown = object_id if len(object_id) <= 100 else object_id[:100] + "…"
            self.message_user(request, self.missing_message % {"id": shown}, messages.ERROR)
            return HttpResponseRedirect(page_url(self, "changelist"))
        return self.run_operation(request, obj, operation)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Django's object page, with :meth:`operator_context` for a user allowed to operate
        (``HttpResponse``)."""
        context = dict(extra_context or {})
        obj = self.get_object(request, object_id)
        if obj is not None and self.has_operate_permission(request):
            context.update(self.operator_context(obj))
        return super().change_view(request, object_id, form_url, context)


class ReadOnlyAdmin:
    """Mixin for a ``ModelAdmin`` or inline: no adding, changing or deleting; viewing needs
    the model's view permission, as Django's admin asks. Its pages include the package's
    stylesheet (:data:`~django_leases.admin.display.MEDIA_CSS`)."""

    class Media:
        css = MEDIA_CSS

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: nothing is added through these pages (``bool``)."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: rows change only through the operations, which check their own permission."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never: nothing is deleted through these pages (``bool``)."""
        return False

    def get_readonly_fields(
        self, request: HttpRequest, obj: Any = None
    ) -> list[str] | tuple[str, ...]:
        """The declared ``readonly_fields``, else every name in ``fields``: a page that
        changes nothing shows each field read-only, display methods among them."""
        declared: list[str] | tuple[str, ...] = getattr(self, "readonly_fields", ())
        return declared or tuple(getattr(self, "fields", None) or ())


class AnnotationFilter(admin.SimpleListFilter):
    """A list filter on an annotation the list's queryset carries, named ``parameter_name``.

    Subclasses set ``title``, ``parameter_name`` (also the annotation's name, unless
    ``annotation`` names it) and either ``states`` (a ``TextChoices``: its
    values and labels are the options) or ``options`` (``(value, label)`` pairs). A value that
    is not one of the options filters nothing.
    """

    annotation: ClassVar[str | None] = None
    states: ClassVar[type[models.TextChoices] | None] = None
    options: ClassVar[Sequence[tuple[str, str]]] = ()

    def _options(self) -> list[tuple[str, str]]:
        if self.states is not None:
            return [(state.value, str(state.label)) for state in self.states]
        return list(self.options)

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return self._options()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value in dict(self._options()):
            return queryset.filter(**{str(self.annotation or self.parameter_name): value})
        return queryset


class StateFilter(AnnotationFilter):
    """Filter on the ``state`` annotation a list's queryset carries (``with_state()``, on
    the database clock); subclasses set ``states``."""

    title = _("state")
    parameter_name = "state"


class ValueFilter(admin.SimpleListFilter):
    """A list filter whose options are values, each its own label: subclasses set ``title``
    and ``parameter_name`` and give :meth:`values`; those that keep :meth:`queryset` give
    :meth:`chosen` (no choice keeps every row)."""

    def values(self) -> list[str]:
        """The values offered, in order (``list[str]``)."""
        raise NotImplementedError

    def chosen(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        """The rows of ``queryset`` for the chosen ``value``."""
        raise NotImplementedError

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        """Each of :meth:`values` as ``(value, label)``, labelled by itself."""
        return [(value, value) for value in self.values()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        """The rows :meth:`chosen` keeps for the chosen value; all for no choice."""
        value = self.value()
        return queryset if value is None else self.chosen(queryset, str(value))


class ReadOnlyModelAdmin(ReadOnlyAdmin, AdminMixinOf[Any]):
    """:class:`ReadOnlyAdmin` for a registered ``ModelAdmin``: its list also refuses a query
    string that holds a NUL character (400 Bad Request), which no database stores and
    PostgreSQL refuses in a query — a crafted ``?workflow=%00`` is never a 500 — and an
    action posted for a selected id the model's key cannot hold (a stale or crafted form:
    Django would raise while selecting the rows)."""

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Django's action, unless a selected id is not one of this model's keys: then a
        message, nothing done, and back to the list."""
        key = self.model._meta.pk
        assert key is not None  # every model has a primary key
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                key.to_python(value)
            except ValidationError:
                self.message_user(
                    request,
                    gettext("%(value)r is not the id of a %(model)s: nothing was done.")
                    % {"value": value[:64], "model": self.model._meta.verbose_name},
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's list, unless a parameter's name or value holds a NUL character."""
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                raise SuspiciousOperation("A NUL character in an admin list's query string")
        return super().changelist_view(request, extra_context)
