from django.apps import AppConfig


class PreviewsConfig(AppConfig):
    name = "demo_project.previews"
    label = "previews"
    verbose_name = "Demo: preview builds"
    default_auto_field = "django.db.models.BigAutoField"
