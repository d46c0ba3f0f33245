"""What several django-leases admin pages share: read-only lists, annotation filters and the
names of the pages the admin classes add."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
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
