"""A run's tags, one row per tag (``WorkflowRunTag``): what finds runs by tag.

The tags a run was started with (``start_workflow(..., tags=)``) are kept twice: as
``WorkflowRun.tags`` (JSON, what the pages show) and here, one row per name and value, so
``WorkflowRun.objects.tagged(...)`` is served by one B-tree index on ``(name, value, run)``
on every backend — PostgreSQL, MariaDB (whose JSON columns cannot be indexed by an
arbitrary key) and SQLite alike. Rows are written with the run, in its transaction, and go
with it (``ON DELETE CASCADE`` through Django's collector when a run is pruned).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_leases import db
from django_leases.validation import MAX_TAG_NAME_LENGTH, MAX_TAG_VALUE_LENGTH


class WorkflowRunTagQuerySet(db.RoutedQuerySet["WorkflowRunTag"]):
    """``WorkflowRunTag.objects``: written with the run (:meth:`write`), read by
    ``WorkflowRun.objects.tagged``."""

    def write(self, run_id: uuid.UUID, tags: Mapping[str, str] | None) -> None:
        """Make run ``run_id``'s tag rows exactly ``tags`` (checked by the caller), inside
        the caller's transaction."""
        rows = self.rows()
        rows.filter(run_id=run_id).delete()
        if tags:
            rows.bulk_create(
                [self.model(run_id=run_id, name=name, value=value) for name, value in tags.items()]
            )

    def runs_with(self, name: str, value: str) -> models.QuerySet[WorkflowRunTag, Any]:
        """The ids of the runs tagged ``name=value`` (a subquery for ``pk__in``)."""
        return self.filter(name=name, value=value).values("run_id")


class WorkflowRunTag(models.Model):
    """One tag of a run: ``name`` = ``value`` (see the module's docstring)."""

    # Served by the unique (run, name) index, whose leading column it is.
    run = models.ForeignKey(
        "django_leases.WorkflowRun",
        on_delete=models.CASCADE,
        related_name="tag_rows",
        db_index=False,
    )
    name = models.CharField(_("name"), max_length=MAX_TAG_NAME_LENGTH)
    value = models.CharField(_("value"), max_length=MAX_TAG_VALUE_LENGTH, blank=True)

    objects: ClassVar[WorkflowRunTagQuerySet] = WorkflowRunTagQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        verbose_name = _("run tag")
        verbose_name_plural = _("run tags")
        constraints = (models.UniqueConstraint(fields=["run", "name"], name="dl_run_tag_unique"),)
        indexes = (
            # tagged(name=value): the runs with a tag, read from the index alone.
            models.Index(fields=["name", "value", "run"], name="dl_run_tag_lookup"),
        )

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


__all__ = ["WorkflowRunTag", "WorkflowRunTagQuerySet"]
