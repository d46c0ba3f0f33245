"""Settings of django-leases, read lazily from ``settings.DJANGO_LEASES``.

``DJANGO_LEASES`` is an optional dict; every key has a default. Values are read on each
access, so ``override_settings`` works in tests.

=============================  =========  =====================================================
key                            default    meaning
=============================  =========  =====================================================
``DEFAULT_TTL``                ``30``     seconds a ``hold_lease`` lease lives between renewals
``RENEWAL_FLOOR``              ``0.05``   shortest renewal interval, seconds (interval = TTL/3)
``MAX_TTL``                    ``31622400`` longest TTL accepted, seconds (366 days)
``STEP_LEASE_TTL``             ``30``     seconds a claimed workflow step's lease lives
``WORKER_POLL_INTERVAL``       ``1.0``    seconds an idle workflow worker waits between polls
``WORKER_SHUTDOWN_GRACE``      ``30``     seconds a worker lets in-flight steps finish on SIGTERM
``HOLD_LEASE_KILL_GRACE``      ``10``     seconds ``manage.py hold_lease`` waits after SIGTERM
                                          before it SIGKILLs a child whose lease was lost
``WEBHOOK_MAX_BODY``           ``1048576`` largest webhook body accepted, bytes (else 413)
``WEBHOOK_SECRETS``            ``{}``     source name -> signing secret (walking skeleton; the
                                          encrypted credential store replaces it)
=============================  =========  =====================================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    "DEFAULT_TTL": 30.0,
    "RENEWAL_FLOOR": 0.05,
    "MAX_TTL": 366 * 24 * 3600.0,
    "STEP_LEASE_TTL": 30.0,
    "WORKER_POLL_INTERVAL": 1.0,
    "WORKER_SHUTDOWN_GRACE": 30.0,
    "HOLD_LEASE_KILL_GRACE": 10.0,
    "WEBHOOK_MAX_BODY": 1024 * 1024,
    "WEBHOOK_SECRETS": {},
}


class _Settings:
    """Attribute access to the ``DJANGO_LEASES`` dict, falling back to :data:`DEFAULTS`."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown django-leases setting {name!r}")
        overrides = getattr(django_settings, "DJANGO_LEASES", None) or {}
        return overrides.get(name, DEFAULTS[name])


leases_settings = _Settings()
