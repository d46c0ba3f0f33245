"""A URLconf without ``django_leases.urls``: what a project that forgot it has."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
