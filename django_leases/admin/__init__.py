"""Operators' admin: leases, workflow runs and schedules, workers, trigger sources and
deliveries (DESIGN §7)."""

from django_leases.admin import (  # noqa: F401  (registers)
    deliveries,
    leases,
    queues,
    schedules,
    triggers,
    workers,
    workflows,
)
