"""Operators' admin: leases, workflow runs and trigger sources (DESIGN §7)."""

from django_leases.admin import leases, triggers, workflows  # noqa: F401  (registers)
