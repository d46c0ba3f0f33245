"""Rows of the application's own that tests' step functions write: the ledger transactional
steps append to, and accounts written with fenced updates (one with the trigger that refuses
an older fence from raw SQL)."""

from __future__ import annotations

from django.db import models

from django_leases.fencing import FencedModel


class LedgerEntry(models.Model):
    """One row a step wrote: which run, step and attempt wrote it."""

    run_id = models.UUIDField()
    step = models.CharField(max_length=200)
    attempt = models.IntegerField()
    note = models.CharField(max_length=200, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.run_id}:{self.step}#{self.attempt}"


class Account(FencedModel):
    """A row written through ``fenced_update`` (no trigger)."""

    name = models.CharField(max_length=100, unique=True)
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class GuardedAccount(FencedModel):
    """A row written through ``fenced_update``, with the trigger refusing an older fence."""

    name = models.CharField(max_length=100, unique=True)
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class Customer(models.Model):
    """Whom an :class:`Order` belongs to: a fenced update can filter through it."""

    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


class Order(FencedModel):
    """A fenced row reached through a relation (``customer__name``)."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
    status = models.CharField(max_length=50, default="new")

    def __str__(self) -> str:
        return f"{self.customer_id}:{self.status}"


class FencedParent(FencedModel):
    """A fenced model with a multi-table-inheritance child (:class:`FencedChild`)."""

    status = models.CharField(max_length=50, default="new")

    def __str__(self) -> str:
        return self.status


class FencedChild(FencedParent):
    """Its fence columns are its parent's table's: ``fenced_update`` refuses it."""

    note = models.CharField(max_length=50, default="")
