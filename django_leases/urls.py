"""URLs of django-leases: ``include("django_leases.urls")`` in your project's urls.py.

``hooks/<name>/`` receives webhook deliveries for trigger source ``name`` (POST only).
"""

from django.urls import path

from django_leases.triggers.views import receive_webhook

app_name = "django_leases"

urlpatterns = [
    path("hooks/<str:name>/", receive_webhook, name="receive-webhook"),
]
