from django.apps import AppConfig


class DjangoLeasesConfig(AppConfig):
    """App configuration: pins the primary-key type and registers the system checks."""

    name = "django_leases"
    verbose_name = "Leases, workflows and trigger sources"
    # Pinned so a project's DEFAULT_AUTO_FIELD never asks for a migration of ours.
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_leases import checks  # noqa: F401  (registers the checks)
