"""Admin for workflow queues: the queue view (DESIGN §7, §5b).

One read-only page listing every queue with its waiting and running steps, its concurrency
limit and rate, and how long its oldest waiting step has been due, as
``display.queue_overview()`` computes them on the database clock (this page only calls
it). Viewing needs the ``view_workflowqueue`` permission. Nothing can be added, changed or
deleted here: the limits are settings (``DJANGO_LEASES["QUEUES"]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext

from django_leases.admin.base import ModelAdminOf, ReadOnlyModelAdmin
from django_leases.exceptions import QueueConfigError
from django_leases.models import WorkflowQueue
from django_leases.workflows.display import queue_overview

if TYPE_CHECKING:
    from django.http import HttpResponse


@admin.register(WorkflowQueue)
class WorkflowQueueAdmin(ReadOnlyModelAdmin, ModelAdminOf[WorkflowQueue]):
    """The queue view: per queue, waiting, running, limit, rate and oldest waiting age."""

    actions = None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The queue table (a ``TemplateResponse``); ``PermissionDenied`` without the view
        permission. A broken ``QUEUES`` setting is shown as the page's error."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        problem = ""
        try:
            queues = queue_overview()
        except QueueConfigError as exc:
            queues, problem = [], str(exc)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": gettext("Workflow queues"),
            "queues": queues,
            "problem": problem,
            "media": self.media,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_leases/workflowqueue/queues.html", context)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """The model's view permission (Django's rule), on the list only: rows have no page."""
        if obj is not None:
            return False
        return super().has_view_permission(request, obj)
