from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "demo_project.reviews"
    label = "reviews"
    verbose_name = "Demo: pull-request reviews"
    default_auto_field = "django.db.models.BigAutoField"
