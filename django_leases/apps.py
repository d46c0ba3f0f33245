from collections.abc import Callable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import connections
from django.db.models.signals import post_migrate
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _

#: The system checks: each entry point of :mod:`django_leases.checks` by name, with its tags
#: and whether only ``check --deploy`` runs it. They are registered as Django starts; the
#: module loads when checks first run (``check``, ``migrate``, ``runserver``, every
#: command), so a web process never loads it.
SYSTEM_CHECKS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("django_leases_checks", ("django_leases",), False),
    ("stored_secrets_check", (checks.Tags.database,), False),
    ("workflow_functions_check", (checks.Tags.database,), False),
    ("replication_checks", (checks.Tags.database,), False),
    ("deploy_checks", (checks.Tags.security, "django_leases"), True),
)


def _registered_check(name: str) -> Callable[..., list[checks.CheckMessage]]:
    """The function Django runs for check ``name``: it calls ``django_leases.checks.<name>``
    with what Django passes (``app_configs``, ``databases``)."""

    def check(
        app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
    ) -> list[checks.CheckMessage]:
        # deferred: start-up cost (see SYSTEM_CHECKS)
        from django_leases import checks as ours

        found: list[checks.CheckMessage] = getattr(ours, name)(app_configs=app_configs, **kwargs)
        return found

    check.__name__ = check.__qualname__ = name
    return check


#: The functions registered, made once: registering them again (each ``ready()``, also when a
#: test populates the app registry anew) adds nothing to Django's set of checks.
_REGISTERED_CHECKS = tuple(
    (_registered_check(name), tags, deploy) for name, tags, deploy in SYSTEM_CHECKS
)


class DjangoLeasesConfig(AppConfig):
    """App configuration: pins the primary-key type and registers the system checks."""

    name = "django_leases"
    verbose_name = _("Leases, workflows and trigger sources")
    # Pinned so a project's DEFAULT_AUTO_FIELD never asks for a migration of ours.
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        for check, tags, deploy in _REGISTERED_CHECKS:
            checks.register(check, *tags, deploy=deploy)
        # deferred: these import the models, which needs the app registry ready
        from django_leases import metrics
        from django_leases.triggers import providers  # noqa: F401  (installs the providers)

        metrics.connect()  # counts from now on; a no-op without prometheus-client
        post_migrate.connect(_after_migrate, sender=self, dispatch_uid="django_leases.fencing")
        # The built-in prune workflow and step function (DJANGO_LEASES["PRUNE"] schedules
        # them), registered whatever the settings say, so a run already started finishes.
        # deferred: as above, it imports the models
        from django_leases.workflows import retention  # noqa: F401

        if _uses_task_backend():
            # The built-in task workflow and step function, for the workers to run.
            # deferred: the models (app registry), and only when TASKS names the backend
            from django_leases import tasks  # noqa: F401
        # Declarations in code: each installed app's workflows.py and triggers.py.
        autodiscover_modules("workflows", "triggers")


def _after_migrate(sender: AppConfig, using: str, plan: Any = None, **kwargs: Any) -> None:
    """After a ``migrate`` that applied something on SQLite: the fence triggers a rebuilt
    table lost are created again (:func:`~django_leases.fencing.restore_fence_triggers`).
    Not after a ``flush`` (no plan), which rebuilds nothing."""
    if plan and connections[using].vendor == "sqlite":
        # deferred: fencing imports the models; needed only after a migrate on SQLite
        from django_leases.fencing import restore_fence_triggers

        restore_fence_triggers(using)


def _uses_task_backend() -> bool:
    """Whether ``settings.TASKS`` names ``django_leases.tasks.TaskBackend``."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    return any(
        isinstance(entry, dict) and entry.get("BACKEND") == "django_leases.tasks.TaskBackend"
        for entry in configured.values()
    )
