"""Trigger sources and the deliveries they received (DESIGN §6).

Domain methods live on the QuerySets in :mod:`django_leases.triggers.store`.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from django_leases.triggers.store import TriggerEventQuerySet, TriggerSourceQuerySet


class TriggerSource(models.Model):
    """A webhook source declared in code. Off until an operator enables it.

    ``declared`` turns ``False`` when the declaration leaves the code (an orphan); the row
    stays until it is torn down or forgotten. ``state`` holds provider identifiers only;
    secrets never live here.
    """

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=32, default="webhook")
    provider = models.CharField(max_length=64)
    config = models.JSONField(default=dict, blank=True, help_text="Non-secret provider config.")
    base_url = models.CharField(max_length=500, null=True, blank=True)
    label_prefix = models.CharField(max_length=200, null=True, blank=True)
    declared = models.BooleanField(default=True)
    enabled = models.BooleanField(default=False)
    status = models.CharField(max_length=32, null=True, blank=True)
    state = models.JSONField(null=True, blank=True)
    detail = models.TextField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[TriggerSourceQuerySet] = TriggerSourceQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)
        permissions = (
            ("toggle_triggersource", "Can enable, disable and tear down trigger sources"),
        )

    def __str__(self) -> str:
        return self.name


class OrphanTriggerSource(TriggerSource):
    """Rows whose declaration left the code: the admin's Orphans view."""

    class Meta:
        proxy = True
        app_label = "django_leases"
        verbose_name = "orphaned trigger source"


class TriggerEvent(models.Model):
    """A delivery accepted from a trigger source (deduplicated by delivery id)."""

    source = models.ForeignKey(
        TriggerSource, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    source_name = models.CharField(max_length=200)
    delivery_id = models.CharField(max_length=200)
    event = models.CharField(max_length=200)
    payload = models.JSONField()
    run = models.ForeignKey(
        "django_leases.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL
    )
    received_at = models.DateTimeField(auto_now_add=True)

    objects: ClassVar[TriggerEventQuerySet] = TriggerEventQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("-received_at",)
        constraints = (
            models.UniqueConstraint(
                fields=["source_name", "delivery_id"], name="dl_event_unique_delivery"
            ),
        )

    def __str__(self) -> str:
        return f"{self.source_name} {self.event} {self.delivery_id}"


class TriggerSecret(models.Model):
    """A secret (a trigger source's webhook signing secret), encrypted with Fernet.

    Only :mod:`django_leases.triggers.credentials` reads and writes it; ``ciphertext`` is a
    Fernet token under one of the keys of ``DJANGO_LEASES["SECRET_KEYS"]`` (or the keys
    derived from ``SECRET_KEY``). The plain secret is never stored, logged or shown.
    """

    name = models.CharField(max_length=200, unique=True)
    ciphertext = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<TriggerSecret {self.name!r}>"
