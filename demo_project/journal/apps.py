from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "demo_project.journal"
    label = "journal"
    verbose_name = "Demo: step executions"
    default_auto_field = "django.db.models.BigAutoField"
