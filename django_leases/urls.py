"""URLs of django-leases: ``include("django_leases.urls")`` in your project's urls.py."""

app_name = "django_leases"

urlpatterns: list = []
