from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_project.shop"
    label = "shop"
    verbose_name = "Demo: shop orders"
    default_auto_field = "django.db.models.BigAutoField"
