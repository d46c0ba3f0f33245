"""Operators' admin: leases, workflow runs, workers, trigger sources and deliveries (DESIGN §7)."""

from django_leases.admin import (  # noqa: F401  (registers)
    deliveries,
    leases,
    queues,
    triggers,
    workers,
    workflows,
)
