"""Finding runs in the admin's run list: by tag (:class:`RunTagFilter`) and by id or key
(:func:`search_runs`), both through ``WorkflowRun.objects`` (``tagged``,
``key_starts_with``) and the indexes behind them."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import ValueFilter
from django_leases.models import WorkflowRun, WorkflowRunTag
from django_leases.validation import parse_tag

#: The newest tag rows the filter's choices are drawn from (reading every tag would grow
#: with the table); any other ``?tag=name=value`` still filters.
TAG_ROWS_READ = 1000
#: At most this many choices are listed.
TAG_CHOICES = 50


class RunTagFilter(ValueFilter):
    """Runs carrying a tag: ``?tag=NAME=VALUE`` (``WorkflowRun.objects.tagged``)."""

    title = _("tag")
    parameter_name = "tag"

    def values(self) -> list[str]:
        """The tags of the newest tagged runs (at most :data:`TAG_CHOICES`, by text), and
        the one chosen."""
        rows = WorkflowRunTag.objects.order_by("-id").values_list("name", "value")
        found = {f"{name}={value}" for name, value in rows[:TAG_ROWS_READ]}
        chosen = self.value()
        if chosen:
            found.add(chosen)
        return sorted(found)[:TAG_CHOICES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The runs with the chosen tag; none for a value that is not ``NAME=VALUE``."""
        if not self.value():
            return queryset
        try:
            name, value = parse_tag(str(self.value()))
        except ValueError:
            return queryset.none()
        return queryset.tagged({name: value})  # type: ignore[attr-defined,no-any-return]


def search_runs(queryset: QuerySet[WorkflowRun], term: str) -> QuerySet[WorkflowRun]:
    """The runs a search term finds: the run with that id when it is a UUID, else the runs
    whose key is the term or starts with it (``WorkflowRun.objects.key_starts_with``)."""
    term = term.strip()
    if not term:
        return queryset
    try:
        return queryset.filter(pk=uuid.UUID(term))
    except ValueError:
        pass
    try:
        return queryset.key_starts_with(term)  # type: ignore[attr-defined,no-any-return]
    except ValueError:
        return queryset.none()


__all__ = ["RunTagFilter", "search_runs"]
