"""Operators' admin: leases, workflow runs, workers and trigger sources (DESIGN §7)."""

from django_leases.admin import leases, triggers, workers, workflows  # noqa: F401  (registers)
