"""URLs of django-leases: ``include("django_leases.urls")`` in your project's urls.py.

``hooks/<name>/`` receives webhook deliveries for trigger source ``name`` (POST only), and so
does ``hooks/<name>`` without the slash, as a route of its own: with ``APPEND_SLASH`` on,
Django's ``CommonMiddleware`` would answer it with a redirect, which webhook senders do not
follow (and under ``DEBUG`` a POST there is a ``RuntimeError``). ``reverse()`` of
``django_leases:receive-webhook`` gives the address with the slash, the one registered.

``health/`` answers anyone with liveness (each database django-leases writes to answers), and
staff users with what ``manage.py leases_check`` answers (GET; 200 healthy, 503 not; see
:func:`django_leases.health.health_view`).
"""

from django.urls import path

from django_leases.health import health_view
from django_leases.triggers.views import receive_webhook

app_name = "django_leases"

urlpatterns = [
    path("hooks/<str:name>/", receive_webhook, name="receive-webhook"),
    path("hooks/<str:name>", receive_webhook, name="receive-webhook-without-slash"),
    path("health/", health_view, name="health"),
]
