"""The metrics view, to include under a prefix only Prometheus reaches::

path("internal/", include("django_leases.metrics_urls"))  # internal/metrics/
"""

from django.urls import path

from django_leases.metrics import metrics_view

app_name = "django_leases_metrics"

urlpatterns = [path("metrics/", metrics_view, name="metrics")]
