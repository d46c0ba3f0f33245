"""What several django-leases admin pages share: read-only lists and annotation filters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_leases.admin.display import MEDIA_CSS


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
