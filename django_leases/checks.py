from django.core import checks  # noqa: F401
